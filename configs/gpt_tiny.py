# A ~7M-parameter GPT (5M of them in the tied 50304×128 embedding) that trains in a few
# minutes on 2 CPU cores: the demo. Exact parameter count: 7,265,024.
# python data/prepare.py --dataset pydocs && python train.py configs/gpt_tiny.py
out_dir = 'out/tiny'
dataset = 'pydocs'
n_layer = 4
n_head = 4
n_embd = 128
block_size = 256
dropout = 0.0
bias = True
batch_size = 8           # sequences per optimizer step, all ranks together: 8 × 256 = 2,048 tokens
learning_rate = 2e-3
min_lr = 2e-4
warmup_iters = 20
max_iters = 200
lr_decay_iters = 200
eval_interval = 50
eval_iters = 4
log_interval = 10
checkpoint_interval = 200
