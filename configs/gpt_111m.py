# gigaGPT's 111m configuration (roughly Cerebras-GPT 111M).
# Exact parameter count: 111,086,592 (GPT-2 shape, tied embeddings, vocab padded to 50304).
# 120 × 2048 = 245,760 tokens per step; 9,037 steps = 2.2B tokens.
# python plan.py configs/gpt_111m.py --gpus 8xA100-80GB   # does it fit, and how?
out_dir = 'out/gpt_111m'
dataset = 'openwebtext'
n_layer = 10
n_embd = 768
n_head = 12
block_size = 2048
dropout = 0.0
bias = True
init_std = 0.02
batch_size = 120
learning_rate = 6e-4
min_lr = 6e-4 * 0.1      # cosine decay to 0.1 × lr, as gigaGPT
warmup_iters = 1525
max_iters = 9037
lr_decay_iters = 9037
weight_decay = 0.1
beta1, beta2 = 0.9, 0.95
adam_eps = 1e-8
grad_clip = 1.0
checkpoint_interval = 1000
