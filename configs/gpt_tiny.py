# A ~7M-parameter GPT (5M of them in the tied 50304×128 embedding) that trains in a few
# minutes on 2 CPU cores: the demo and the tests' model. Exact parameter count: 7,265,024.
# python data/prepare.py --dataset pydocs && python train.py configs/gpt_tiny.py
out_dir = 'out/tiny'
dataset = 'pydocs'
n_layer = 4
n_head = 4
n_embd = 128
block_size = 256
dropout = 0.0
batch_size = 16          # sequences per optimizer step, all ranks together: 16 × 256 = 4,096 tokens
learning_rate = 2e-3
min_lr = 2e-4
warmup_iters = 20
max_iters = 300
lr_decay_iters = 300
eval_interval = 100
eval_iters = 8
log_interval = 10
checkpoint_interval = 100
