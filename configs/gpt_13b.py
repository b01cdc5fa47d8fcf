# gigaGPT's 13b configuration (roughly Cerebras-GPT 13B).
# Exact parameter count: 12,853,626,880 (GPT-2 shape, tied embeddings, vocab padded to 50304).
# 1080 × 2048 = 2,211,840 tokens per step; 116,223 steps = 257.1B tokens.
# python plan.py configs/gpt_13b.py --gpus 8xA100-80GB   # does it fit, and how?
out_dir = 'out/gpt_13b'
dataset = 'openwebtext'
n_layer = 40
n_embd = 5120
n_head = 40
block_size = 2048
dropout = 0.0
bias = True
init_std = 0.014
batch_size = 1080
learning_rate = 1.2e-4
min_lr = 1.2e-4 * 0.1      # cosine decay to 0.1 × lr, as gigaGPT
warmup_iters = 581
max_iters = 116223
lr_decay_iters = 116223
weight_decay = 0.1
beta1, beta2 = 0.9, 0.95
adam_eps = 1e-9
grad_clip = 1.0
checkpoint_interval = 1000
