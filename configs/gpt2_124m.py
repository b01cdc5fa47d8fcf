# nanoGPT's GPT-2 (124M) recipe on OpenWebText. Exact parameter count: 124,373,760
# (vocab padded to 50304). 480 × 1024 = 491,520 tokens per step, as nanoGPT's 12 × 5 × 8 × 1024.
# python data/prepare.py --dataset openwebtext
# torchrun --standalone --nproc_per_node=8 train.py configs/gpt2_124m.py
out_dir = 'out/gpt2_124m'
dataset = 'openwebtext'
n_layer = 12
n_head = 12
n_embd = 768
block_size = 1024
dropout = 0.0
bias = False
batch_size = 480
learning_rate = 6e-4
min_lr = 6e-5
weight_decay = 0.1
beta1, beta2 = 0.9, 0.95
grad_clip = 1.0
warmup_iters = 2000
max_iters = 600000
lr_decay_iters = 600000
eval_interval = 1000
eval_iters = 200
log_interval = 10
checkpoint_interval = 1000
