# gigaGPT's 1p3b configuration (roughly Cerebras-GPT 1.3B).
# Exact parameter count: 1,315,819,520 (GPT-2 shape, tied embeddings, vocab padded to 50304).
# 528 × 2048 = 1,081,344 tokens per step; 24,334 steps = 26.3B tokens.
# python plan.py configs/gpt_1p3b.py --gpus 8xA100-80GB   # does it fit, and how?
out_dir = 'out/gpt_1p3b'
dataset = 'openwebtext'
n_layer = 24
n_embd = 2048
n_head = 16
block_size = 2048
dropout = 0.0
bias = True
init_std = 0.01
batch_size = 528
learning_rate = 2e-4
min_lr = 2e-4 * 0.1      # cosine decay to 0.1 × lr, as gigaGPT
warmup_iters = 346
max_iters = 24334
lr_decay_iters = 24334
weight_decay = 0.1
beta1, beta2 = 0.9, 0.95
adam_eps = 1e-8
grad_clip = 1.0
checkpoint_interval = 1000
