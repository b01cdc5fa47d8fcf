# A ~7M-parameter GPT (5M of them in the tied 50304×128 embedding) that trains in a few
# minutes on 2 CPU cores: the demo. Exact parameter count: 7,248,640.
# python data/prepare.py --dataset pydocs && python train.py configs/gpt_tiny.py
# Its shape, rate and steps are make demo's, picked by measurement (bench/RESULTS.md, "make
# demo and what it learned"): 500 steps put phrases of the corpus in its samples.
out_dir = 'out/tiny'
dataset = 'pydocs'
n_layer = 4
n_head = 4
n_embd = 128
block_size = 128
dropout = 0.0
bias = True
batch_size = 16          # sequences per optimizer step, all ranks together: 16 × 128 = 2,048 tokens
learning_rate = 3e-3
min_lr = 3e-4
warmup_iters = 20
max_iters = 500
lr_decay_iters = 500
eval_interval = 100
eval_iters = 4
log_interval = 10
checkpoint_interval = 500
