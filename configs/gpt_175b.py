# gigaGPT's 175b configuration (gigaGPT: hyper-parameters "mostly just a guess").
# Exact parameter count: 174,604,836,864 (GPT-2 shape, tied embeddings, vocab padded to 50304).
# 1472 × 2048 = 3,014,656 tokens per step; 663,425 steps = 2000.0B tokens.
# python plan.py configs/gpt_175b.py --gpus 8xA100-80GB   # does it fit, and how?
out_dir = 'out/gpt_175b'
dataset = 'openwebtext'
n_layer = 96
n_embd = 12288
n_head = 96
block_size = 2048
dropout = 0.0
bias = True
init_std = 0.005
batch_size = 1472
learning_rate = 5e-6
min_lr = 5e-6 * 0.1      # cosine decay to 0.1 × lr, as gigaGPT
warmup_iters = 3317
max_iters = 663425
lr_decay_iters = 663425
weight_decay = 0.1
beta1, beta2 = 0.9, 0.95
adam_eps = 1e-10
grad_clip = 1.0
checkpoint_interval = 1000
