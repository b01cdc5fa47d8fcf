"""
Trains a GPT on one process, one GPU, or many (DDP or FSDP2, as the planner decides).

$ python train.py configs/gpt_tiny.py --device=cpu
$ torchrun --standalone --nproc_per_node=8 train.py configs/gpt_13b.py
$ torchrun --nnodes=2 --node_rank=0 --nproc_per_node=8 --master_addr=10.0.0.1 --master_port=29500 \
      train.py configs/gpt_70b.py            # and --node_rank=1 on the second node

batch_size is the GLOBAL number of sequences per optimizer step (as gigaGPT, unlike nanoGPT's
per-GPU batch_size × gradient_accumulation_steps × world size). How those sequences are spread over
ranks and micro-batches is the planner's business (plan.py); the gradient is always the gradient
of the whole batch, as if one device had computed it.
"""
import functools
import math
import os
import re
import shutil
import signal
import time
from contextlib import nullcontext
from datetime import timedelta

from configurator import configure, die, is_knob
# Ctrl-C, preemption (SIGTERM) or Slurm's warning (SIGUSR1) before training starts (imports
# included): one line, nothing to save. The training loop below takes these signals over.
for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
    signal.signal(sig, lambda signum, frame: die(
        f"stopped by {signal.Signals(signum).name} while starting; nothing was written"))

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint

import plan as planner
import ckpt
import guard
import hf
from ckpt import checkpoints
from model import GPT, LMHeadLoss, chunk_loss, config_from, make_optimizer

# -----------------------------------------------------------------------------
# I/O
out_dir = 'out'
init_from = 'scratch'      # 'scratch', 'resume' (latest checkpoint in out_dir), 'auto' (resume if there is one), 'gpt2*'
dataset = 'pydocs'         # data/<dataset>/{train,val}.bin from data/prepare.py
eval_interval = 500        # evaluate every this many steps (and at the end)
eval_iters = 20            # the validation loss is over eval_iters × 8 fixed sequences
log_interval = 10
checkpoint_interval = 1000  # and at the end; 0: none (benchmarks), but on SIGTERM/SIGUSR1
keep_last = 2              # complete checkpoints kept in out_dir
wandb_log = False          # offline unless WANDB_API_KEY is set; never blocks training
wandb_project = 'hetgpt'
wandb_run_name = 'run'
# model
n_layer = 12
n_head = 12
n_embd = 768
block_size = 1024
vocab_size = 50304         # GPT-2's 50257 tokens padded to a multiple of 64
dropout = 0.0
bias = True
init_std = 0.02
# optimizer: AdamW, linear warmup then cosine decay to min_lr
batch_size = 32            # sequences per optimizer step, all ranks together
learning_rate = 6e-4
max_iters = 5000
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.95
adam_eps = 1e-8
grad_clip = 1.0            # 0 disables clipping
max_bad_steps = 5          # stop (at the next log line) after this many steps in a row with non-finite loss or gradients
warmup_iters = 100
lr_decay_iters = 5000
min_lr = 6e-5
# system
seed = 1337
device = 'auto'            # 'auto' (cuda if available), 'cpu', 'cuda'
dtype = 'auto'             # 'auto' (bfloat16 where the device has it natively, else float32), 'float32', 'bfloat16', 'float16'
compile = True             # torch.compile each block and the loss (on CPU: needs a C++ compiler)
plan = 'auto'              # auto|ddp|ddp+ac|fsdp|fsdp+ac|fsdp+offload|fsdp+ac+offload
micro_batch_size = 0       # sequences per forward on each rank; 0 = the planner's choice
memory_fraction = 0.9      # of each device's memory the planner may use
init_device = 'auto'       # 'cpu': whole model on the host first; 'meta': each rank makes its shard; 'auto'
balance = 'auto'           # split of the batch over ranks: 'auto' (measured speed), 'even', or weights '3,1,1'
rebalance_interval = 50    # steps between re-measuring the ranks' speed (balance=auto)
stall_timeout = 300        # seconds with no progress before ranks give up on a silent one; 0: never
# -----------------------------------------------------------------------------
# What each knob may be (configurator.check_rule): a bound, an interval, or a pattern to match.
RULES = {
    'out_dir': '.+', 'init_from': 'scratch|resume|auto|gpt2(-medium|-large|-xl)?', 'dataset': '.+',
    'eval_interval': '> 0', 'eval_iters': '> 0', 'log_interval': '> 0',
    'checkpoint_interval': '>= 0', 'keep_last': '>= 1',
    'wandb_log': '', 'wandb_project': '', 'wandb_run_name': '',
    'n_layer': '> 0', 'n_head': '> 0', 'n_embd': '> 0', 'block_size': '> 0', 'vocab_size': '> 0',
    'dropout': '[0, 1)', 'bias': '', 'init_std': '> 0',
    'batch_size': '> 0', 'learning_rate': '> 0', 'max_iters': '> 0', 'weight_decay': '>= 0',
    'beta1': '[0, 1)', 'beta2': '[0, 1)', 'adam_eps': '>= 0', 'grad_clip': '>= 0',
    'max_bad_steps': '>= 1', 'warmup_iters': '>= 0', 'lr_decay_iters': '>= 0', 'min_lr': '>= 0',
    'seed': '>= 0', 'device': 'auto|cpu|cuda(:[0-9]+)?', 'dtype': 'auto|float32|bfloat16|float16',
    'compile': '', 'plan': r'auto|ddp|ddp\+ac|fsdp|fsdp\+ac|fsdp\+offload|fsdp\+ac\+offload',
    'micro_batch_size': '>= 0', 'memory_fraction': '(0, 1]', 'init_device': 'auto|cpu|meta',
    'balance': r'auto|even|[0-9.,]+', 'rebalance_interval': '> 0', 'stall_timeout': '>= 0'}
config = configure({k: v for k, v in globals().items() if is_knob(k, v)}, rules=RULES)
globals().update(config)
if n_embd % n_head:
    die(f"n_embd={n_embd} is not divisible by n_head={n_head}; pick n_head among "
        f"{[h for h in range(1, 129) if n_embd % h == 0][-6:]}")
if min_lr > learning_rate:
    die(f"min_lr={min_lr} is above learning_rate={learning_rate}: lower min_lr")

world_size = int(os.environ.get('WORLD_SIZE', 1))  # set by torchrun, as the three below
rank, local_rank = int(os.environ.get('RANK', 0)), int(os.environ.get('LOCAL_RANK', 0))
local_world = int(os.environ.get('LOCAL_WORLD_SIZE', 1))
if balance not in ('auto', 'even'):  # checked now, not after the model is built
    weights = [float(w) for w in balance.split(',') if re.fullmatch(r'\d+(\.\d*)?', w) and float(w) > 0]
    if len(weights) != world_size or len(balance.split(',')) != world_size:
        die(f"balance={balance!r}: give auto, even, or {world_size} positive weights like " + ','.join(['1'] * world_size))
if batch_size < world_size:
    die(f"batch_size={batch_size} cannot feed {world_size} ranks: raise batch_size or use fewer ranks")
try:  # fail now, not at the first checkpoint an hour from here
    os.makedirs(out_dir, exist_ok=True)
    probe_file = os.path.join(out_dir, f'.write_test_{rank}')
    open(probe_file, 'w').close()
    os.remove(probe_file)
except OSError as e:
    die(f"out_dir={out_dir!r} is not writable ({e.strerror}); choose another out_dir")
if rank == 0:
    guard.lock(out_dir)
found = checkpoints(out_dir)
if init_from not in ('resume', 'auto') and found:  # else its metrics are lost, its checkpoints pruned
    die(f"{out_dir} holds another run's checkpoints (latest {os.path.basename(found[-1])}): "
        f"init_from=auto to go on from it, or another out_dir")

# distributed set-up: every run has a process group, one rank or many, so the code has one path
if device == 'auto':
    device = 'cuda' if torch.cuda.is_available() else 'cpu'
if device.startswith('cuda'):
    if not torch.cuda.is_available():
        die(f"device={device} but this torch sees no CUDA device; use --device=cpu")
    device = f'cuda:{local_rank}' if device == 'cuda' else device  # one GPU per local rank
    torch.cuda.set_device(device)  # before the process group: NCCL binds to the current device
device_type = 'cuda' if device.startswith('cuda') else 'cpu'
# One default group with a backend per device type: NCCL serves only CUDA tensors, and the host-side
# flags, counts and (under offload) gradients go through gloo on the same group.
backend = planner.BACKENDS[device_type]
if world_size > 1:
    # torchrun's store outlives a restart of the group: without a prefix per attempt the new ranks
    # can read the dead ones' addresses and fail to connect.
    store, _, _ = next(dist.rendezvous('env://'))
    store = dist.PrefixStore(f"attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', 0)}", store)
    # A silent rank is found by the watchdog below; the groups' own timeout only backs it up.
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=5 * stall_timeout or 1800))
else:
    store = None
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
# Ends this rank, naming the silent one, when no step completes for stall_timeout seconds (four
# times that during start-up and checkpoint writes).
watchdog = guard.Watchdog(store, rank, world_size, stall_timeout, limit_factor=4)
master = rank == 0
dtype_why = 'set'
if dtype == 'auto':  # bfloat16 where the hardware computes it (CUDA; a CPU with AVX512-BF16 or AMX), else float32
    native = torch.cuda.is_bf16_supported() if device_type == 'cuda' else any(
        getattr(torch.cpu, f, bool)() for f in ('_is_avx512_bf16_supported', '_is_amx_tile_supported'))
    dtype, dtype_why = ('bfloat16', 'auto: native bfloat16') if native else ('float32', 'auto: no native bfloat16')
if compile and device_type == 'cpu' and not (shutil.which('g++') or shutil.which('c++')):
    compile = False  # inductor writes C++ for the CPU: without a compiler, run eager and say so below
ptdtype = {'float32': torch.float32, 'bfloat16': torch.bfloat16, 'float16': torch.float16}[dtype]
if device_type == 'cuda':  # float32 matmuls on TF32 tensor cores (as the planner's float32 peak)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True


log = functools.partial(print, flush=True) if master else lambda *args: None


# -----------------------------------------------------------------------------
# data: a flat uint16 token file per split. The sequences of the global batch at step k are a fixed
# function of (seed, k), whatever the world size, split or micro-batching: resume and uneven splits
# across ranks are exact because every rank agrees on the batch and takes its own slice.
def load_tokens(split):
    path = os.path.join('data', dataset, f'{split}.bin')
    if not os.path.exists(path):
        die(f"no {path}: run python data/prepare.py --dataset {dataset} (or --input FILES --name {dataset})")
    if os.path.getsize(path) % 2:
        die(f"{path} has an odd number of bytes: it is truncated or not uint16; run data/prepare.py again")
    tokens = np.memmap(path, dtype=np.uint16, mode='r') if os.path.getsize(path) else np.zeros(0, np.uint16)
    if len(tokens) <= block_size + 1:
        die(f"{path} has {len(tokens)} tokens, fewer than block_size+1={block_size + 1}; "
            f"lower block_size or prepare more data")
    top = guard.max_token(path, tokens)  # the whole file, once (cached next to it)
    if top >= vocab_size:
        die(f"{path} holds token id {top}, not below vocab_size={vocab_size}: wrong tokenizer "
            f"or dtype, or raise vocab_size")
    return tokens


data = {split: load_tokens(split) for split in ('train', 'val')}


def batch_offsets(split, step, n):
    rng = np.random.default_rng([seed, step + 1, 0 if split == "train" else 1])  # step -1: fixed sets
    return rng.integers(0, len(data[split]) - block_size, size=n)


def get_batch(split, offsets):
    tokens = data[split]
    x = np.stack([tokens[i:i + block_size] for i in offsets]).astype(np.int64)
    y = np.stack([tokens[i + 1:i + 1 + block_size] for i in offsets]).astype(np.int64)
    # CUDA: from pinned memory the copy is asynchronous: the host does not wait for the device
    pinned = lambda t: t.pin_memory().to(device, non_blocking=True) if device_type == 'cuda' else t
    return pinned(torch.from_numpy(x)), pinned(torch.from_numpy(y))


# -----------------------------------------------------------------------------
# model and plan
if init_from == 'resume' and not found:
    die(f"init_from=resume but {out_dir} has no checkpoint; train first or use init_from=auto")
resume_from = found[-1] if found and init_from in ('resume', 'auto') else None
if init_from.startswith('gpt2'):
    raw_model = hf.from_pretrained(init_from, dropout=dropout)
    model_args = raw_model.config
else:
    model_args = config_from(config)
if model_args.block_size < block_size:
    die(f"block_size={block_size} exceeds the model's {model_args.block_size}")

if device_type == 'cuda':  # NCCL makes its buffers at its first collective: this_rank measures them
    dist.all_reduce(torch.zeros(1, device=device))
me = planner.this_rank(device_type, rank, local_world)  # device, memory, overhead, node, host
ranks = [None] * world_size
dist.all_gather_object(ranks, me)
run_plan = planner.make_plan(model_args, batch_size, ranks, plan=plan, micro_batch_size=micro_batch_size,
                             memory_fraction=memory_fraction, dtype=dtype)
if not run_plan.fits:
    die(f"plan={plan} does not fit: {run_plan.advice}")

# Where the weights are first made. 'cpu': the whole model on the host, then placed or sharded: the
# same initial weights under every strategy. 'meta': shapes only; each rank materialises and
# initialises just its own shard after wrapping, for models whose full copy per rank would not fit.
if init_from.startswith('gpt2'):
    init_device = 'cpu'  # the pretrained weights are on the host already
elif init_device == 'auto':
    init_device = 'cpu' if 4 * planner.counts(model_args)['total'] * local_world < me['host_mem'] / 2 else 'meta'
torch.manual_seed(seed)
if not init_from.startswith('gpt2'):
    with torch.device(init_device):
        raw_model = GPT(model_args)

# Apply the plan, in this order: activation checkpointing, then compile, then FSDP/DDP wrapping
# (compile sees the checkpointed blocks; FSDP wraps the compiled ones; torchtitan's order). Under DDP
# and plan=auto each rank chooses: one whose micro-batch fits without checkpointing does not recompute.
ac = run_plan.ac and (plan != 'auto' or run_plan.shard or planner.estimate(
    model_args, 'ddp', run_plan.micro_batch[rank], world_size, dtype, overhead=me['overhead'],
    device=device_type)['total'] > memory_fraction * me['mem'])
if ac:
    for block in raw_model.transformer.h:
        block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)
if compile:
    for block in raw_model.transformer.h:
        block.compile()
    LMHeadLoss.kernel = torch.compile(chunk_loss)  # the loss's elementwise work, fused per chunk
autocast = nullcontext()
if run_plan.shard:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
    # fully_shard moves each parameter to the mesh's device as it shards it: the whole model never
    # has to fit on one GPU. The mesh spans the world, so it uses the default group: under offload
    # the gradients are host tensors and clip_grad_norm_ reduces their norms through its gloo.
    # Pinned host shards (CUDA only: pinning needs a GPU) make the copies to and from it async.
    fsdp_kw = dict(mesh=init_device_mesh(device_type, (world_size,)),
                   mp_policy=MixedPrecisionPolicy(param_dtype=ptdtype, reduce_dtype=torch.float32),
                   offload_policy=CPUOffloadPolicy(pin_memory=device_type == 'cuda') if run_plan.offload else OffloadPolicy())
    for block in raw_model.transformer.h:
        fully_shard(block, reshard_after_forward=run_plan.reshard_after_forward, **fsdp_kw)
    model = fully_shard(raw_model, **fsdp_kw)
    fsdp_modules = [m for m in model.modules() if hasattr(m, 'set_requires_gradient_sync')]
if init_device == 'meta':  # storage now, where this rank keeps its weights (or its shard of them)
    raw_model.to_empty(device='cpu' if run_plan.offload else device)
    raw_model.lm_head.weight = raw_model.transformer.wte.weight  # to_empty unties them
    raw_model.init_weights()
if not run_plan.shard:
    raw_model.to(device)
    if ptdtype != torch.float32:  # DDP keeps float32 weights; matmuls run in ptdtype
        # no cache of the weights' 16-bit copies: under checkpointing it would keep every block's
        # until the forward ends (the copies backward needs are saved anyway)
        autocast = torch.autocast(device_type=device_type, dtype=ptdtype, cache_enabled=False)
    model = DDP(raw_model, gradient_as_bucket_view=True) if world_size > 1 else raw_model

optimizer = make_optimizer(model.parameters(), learning_rate, weight_decay, (beta1, beta2),
                           adam_eps)
scaler = torch.amp.GradScaler(device_type, enabled=dtype == 'float16')


def get_lr(it):
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    ratio = (it - warmup_iters) / max(1, lr_decay_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)


def clock(sync):  # seconds; with sync, after the GPU's queued work has finished
    return (torch.cuda.synchronize() if sync and device_type == 'cuda' else None) or time.perf_counter()


def forward(split, offsets, weight):
    # Sum of token losses, × weight. An empty micro-batch runs one sequence × 0 so that this rank
    # still issues the collectives of a forward and backward.
    watchdog.progress()
    x, y = get_batch(split, offsets if len(offsets) else batch_offsets(split, -1, 1))
    with autocast:
        _, loss = model(x, y, reduction='sum')
    return loss * (weight if len(offsets) else 0.0), loss.detach() * bool(len(offsets))


def forward_backward(offsets, sizes, weight, reduce=True, timed=False):
    # This rank's micro-batches. DDP reduces gradients after the last one; FSDP after each one when the
    # planner says so (sharded gradients; unsharded accumulation costs memory, saves communication).
    # Returns the token-loss sum and this rank's compute time; timed, the last backward, which also
    # waits for the reduction, counts as twice its forward (as backward FLOPs are).
    loss_total, compute, done = torch.zeros((), device=device), 0.0, 0
    for i, size in enumerate(sizes):
        reduce_now = reduce and (run_plan.reduce_every_micro_batch or i == len(sizes) - 1)
        if run_plan.shard:
            for m in fsdp_modules:
                m.set_requires_gradient_sync(reduce_now)
        with model.no_sync() if isinstance(model, DDP) and not reduce_now else nullcontext():
            t0 = clock(timed)
            loss, loss_sum = forward('train', offsets[done:done + size], weight)
            t1 = clock(timed)
            scaler.scale(loss).backward()
            compute += 3 * (t1 - t0) if reduce_now and i == len(sizes) - 1 else clock(timed) - t0
        loss_total += loss_sum.float()
        done += size
    return loss_total, compute


# -----------------------------------------------------------------------------
# Heterogeneous ranks. Rank r's step time is modelled as t_r(n) = c0_r + c1_r·n for n sequences;
# the split of the global batch minimises the slowest rank's time (planner.better_split).
def measure_speed():
    # Forward+backward without gradient sync at two micro-batch sizes (after a warm-up), fitted.
    b1, b2 = max(1, caps[rank] // 2), caps[rank]
    offsets = batch_offsets('train', -1, b2)
    t = [forward_backward(offsets, [b], 0.0, reduce=False, timed=True)[1] for b in (b1, b1, b2)]
    optimizer.zero_grad(set_to_none=True)
    c1 = (t[2] - t[1]) / (b2 - b1) if b2 > b1 and t[2] > t[1] else t[2] / b2
    c0 = max(0.0, t[2] - c1 * b2)
    fits = [None] * world_size
    dist.all_gather_object(fits, (c0, c1))
    return [f[0] for f in fits], [f[1] for f in fits]


caps = run_plan.micro_batch
# Check the plan on the real device: one forward+backward at each rank's micro-batch cap and one AdamW
# step with lr 0 (it allocates the optimizer state and leaves the weights as they are). A rank that
# runs out of memory, or over its budget, halves its micro-batch and all probe again.
while True:
    if device_type == 'cuda':
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    try:
        forward_backward(batch_offsets('train', -1, caps[rank]), [caps[rank]], 0.0, reduce=False)
        for group in optimizer.param_groups:
            group['lr'] = 0.0
        optimizer.step()
        peak_mem = torch.cuda.max_memory_reserved() if device_type == 'cuda' else planner.peak_rss()
        peak_alloc = torch.cuda.max_memory_allocated() if device_type == 'cuda' else peak_mem
        # over budget counts too, on a GPU (a host's peak RSS is a lifetime mark: halving can't lower it)
        oom = device_type == 'cuda' and peak_mem + me['overhead'] > memory_fraction * me['mem']
    except torch.cuda.OutOfMemoryError:
        oom = True
    optimizer.zero_grad(set_to_none=True)
    optimizer.state.clear()
    failed = [None] * world_size
    dist.all_gather_object(failed, oom)
    if not any(failed):
        break
    if any(f and c == 1 for f, c in zip(failed, caps)):
        rungs = planner.STRATEGIES[planner.STRATEGIES.index(run_plan.strategy) + 1:]
        die(f"out of memory at micro-batch 1 under plan {run_plan.strategy}: try "
            f"{'plan=' + rungs[0] if rungs else 'more GPUs or a shorter block_size'}")
    caps = [max(1, c // 2) if f else c for f, c in zip(failed, caps)]
    log(f"out of memory in the probe step: micro-batches now {caps}")
measured = [None] * world_size
dist.all_gather_object(measured, {'total': peak_mem})
log(run_plan.table(measured))
iter_num = 0
if resume_from:
    iter_num = ckpt.load(resume_from, model, optimizer, model_args)
    log(f"resumed from {resume_from} at iter {iter_num}")
metrics_path = os.path.join(out_dir, 'metrics.jsonl')
if master:  # drop checkpoints a killed run left half-written, and metrics past the one we resume
    for d in os.listdir(out_dir):
        if d.endswith('.tmp'):
            shutil.rmtree(os.path.join(out_dir, d), ignore_errors=True)
    rows = guard.read_rows(metrics_path) if resume_from else []  # (a torn last line is skipped)
    # the plan against the probe step, rank 0's (for bench/ and for the record)
    guard.rewrite_rows(metrics_path, [r for r in rows if r['iter'] <= iter_num] + [{
        'iter': iter_num, 'plan': run_plan.strategy, 'ac': ac, 'micro_batch': caps[0],
        'pred_gib': run_plan.predicted[0]['total'] / 2**30,
        'pred_host_gib': run_plan.predicted[0]['host_rank'] / 2**30,
        'pred_tokens_per_sec': run_plan.tokens_per_sec, 'probe_gib': peak_mem / 2**30,
        'probe_alloc_gib': peak_alloc / 2**30, 'overhead_gib': (me['overhead'] or 0) / 2**30}])
shares = planner.weighted_split(batch_size, [1.0] * world_size)  # even
if balance == 'auto' and world_size > 1:
    speed_c0, speed_c1 = measure_speed()
    shares = planner.better_split(shares, speed_c0, speed_c1)
elif balance not in ('auto', 'even'):
    shares = planner.weighted_split(batch_size, weights)


@torch.no_grad()
def evaluate():
    model.eval()
    offsets = batch_offsets('val', -1, eval_iters * 8)  # the same fixed sequences every time
    mine = np.array_split(offsets, world_size)[rank]
    count = torch.tensor(math.ceil(len(mine) / caps[rank]) or 1)  # host tensor (gloo): read at once
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    total = torch.zeros((), device=device)
    for piece in np.array_split(mine, int(count)):
        stop = torch.tensor(len(stop_signals))  # a signal: the checkpoint matters, not this eval
        dist.all_reduce(stop)
        if stop:
            model.train()
            return None
        total += forward('val', piece, 1.0)[1].float()
    dist.all_reduce(total)  # on the device (NCCL under CUDA)
    model.train()
    return total.item() / (len(offsets) * block_size)


peak = planner.peak_flops(me['gpu'], dtype) if me['gpu'] else None
peak_sum = torch.tensor(peak or float('nan'), dtype=torch.float64)  # nan when any rank's is unknown
dist.all_reduce(peak_sum)  # host tensor (gloo)
# training FLOPs of the sequences trained on (block_size may be below the model's), counted
flops_per_token = planner.flops_per_sequence({**vars(model_args), 'block_size': block_size})
flops_per_token /= block_size
tokens_per_step = batch_size * block_size
wandb_run = None
if wandb_log and master:
    try:
        import wandb
        mode = os.environ.get('WANDB_MODE') or ('online' if os.environ.get('WANDB_API_KEY') else 'offline')
        wandb_run = wandb.init(project=wandb_project, name=wandb_run_name, config=config, mode=mode,
                               dir=out_dir, settings=wandb.Settings(init_timeout=30))
    except Exception as e:  # logging must never stop training
        log(f"wandb disabled: {type(e).__name__}: {e}")


def record(row):
    if master:
        guard.append_row(metrics_path, row)
        if wandb_run:
            wandb_run.log(row, step=row['iter'])


log(f"{raw_model.num_params(False):,} parameters; {world_size} rank(s) on {device_type}, {dtype} ({dtype_why}), "
    f"{'compiled' if compile else 'eager' if config['compile'] is False else 'eager: no C++ compiler for torch.compile'}; "
    f"{tokens_per_step:,} tokens per step; shares {shares}")


def validate():
    val = evaluate()
    if val is None:
        return
    log(f"iter {iter_num}: val loss {val:.4f}")
    record({'iter': iter_num, 'tokens': iter_num * tokens_per_step, 'val_loss': val})


stop_signals = []  # from here a signal checkpoints at the end of the step; a 2nd Ctrl-C stops now


def on_signal(signum, frame):
    stop_signals.append(signum)
    if stop_signals.count(signal.SIGINT) > 1:
        die(f"interrupted twice: stopped without a checkpoint; the last is "
            f"{(checkpoints(out_dir) or ['none'])[-1]}")


for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
    signal.signal(sig, on_signal)
if iter_num == 0:
    validate()
bad_run = worst_run = skipped = torch.zeros((), device=device)
busy = torch.zeros(2, dtype=torch.float64)  # smoothed (compute, whole step) seconds of this rank
t_log, steps_since, loss_acc = time.perf_counter(), 0, torch.zeros((), device=device)
while iter_num < max_iters:
    torch.manual_seed(seed + 1_000_003 * iter_num + rank)  # dropout: a function of (seed, step, rank)
    lr = get_lr(iter_num)
    for group in optimizer.param_groups:
        group['lr'] = lr
    start = sum(shares[:rank])
    offsets = batch_offsets('train', iter_num, batch_size)[start:start + shares[rank]]
    sizes = planner.rank_micro_batches(shares, caps, rank, lockstep=run_plan.shard)
    # Per-rank compute time: always on CPU; on CUDA (it synchronises) in the steps before a rebalance.
    timed = world_size > 1 and (device_type == 'cpu' or iter_num % rebalance_interval >= rebalance_interval - 5)
    t_step = clock(timed)
    # loss = sum of token losses / tokens of the whole batch; × world_size undoes DDP's and FSDP's
    # averaging over ranks, so the reduced gradient is that of the whole batch.
    loss_sum, compute = forward_backward(offsets, sizes, world_size / tokens_per_step, timed=timed)
    loss_acc += loss_sum
    scaler.unscale_(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip if grad_clip > 0 else float('inf'))
    norm = norm.full_tensor() if hasattr(norm, 'full_tensor') else norm  # FSDP: a DTensor
    bad = ~torch.isfinite(norm)  # a non-finite loss or gradient: skip the update (the batch is not seen again)
    if optimizer.defaults.get('fused'):  # the kernel skips it itself: the host does not wait for the device
        optimizer.found_inf = bad.float()
        scaler.step(optimizer)
    elif not bad:  # (the foreach fallback: one scalar to the host per step)
        scaler.step(optimizer)
    bad_run = (bad_run + 1) * bad  # on the device: steps in a row with a skipped update, the most of
    worst_run, skipped = torch.maximum(worst_run, bad_run), skipped + bad  # them and their count since the log
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    iter_num += 1
    steps_since += 1
    if timed:
        busy = 0.7 * busy + 0.3 * torch.tensor([compute, clock(True) - t_step], dtype=torch.float64)
    if balance == 'auto' and world_size > 1 and iter_num % rebalance_interval == 0:
        # Refit c1 from the smoothed compute time of the last steps (not the wait in collectives).
        times = [None] * world_size
        dist.all_gather_object(times, float(busy[0]))
        speed_c1 = [max(t - a, 0.05 * t) / n if n else b for t, a, b, n in zip(times, speed_c0, speed_c1, shares)]
        new = planner.better_split(shares, speed_c0, speed_c1)
        if new != shares:
            before, after = (planner.step_time(s, speed_c0, speed_c1) for s in (shares, new))
            log(f"iter {iter_num}: rebalanced {shares} -> {new} (predicted step {before:.3f}s -> {after:.3f}s)")
            shares = new

    if iter_num % log_interval == 0 or iter_num == max_iters:
        if skipped.item():  # (the same on every rank: the norm is global)
            log(f"iter {iter_num}: {int(skipped)} of the last {steps_since} updates skipped: loss or gradients not finite")
        if worst_run.item() >= max_bad_steps:
            die(f"{int(worst_run)} steps in a row with non-finite loss or gradients, by iter {iter_num - 1}; the last "
                f"good checkpoint is {(checkpoints(out_dir) or ['none yet'])[-1]}: lower learning_rate or check the data, "
                f"then init_from=resume")
        dist.all_reduce(loss_acc)  # the whole global batch's loss, not rank 0's share
        loss_val = loss_acc.item() / (steps_since * tokens_per_step)
        dt = (time.perf_counter() - t_log) / steps_since
        tps = tokens_per_step / dt
        mfu = flops_per_token * tps / peak_sum.item()
        host = planner.peak_rss() / 2**30
        mem = torch.cuda.max_memory_allocated() / 2**30 if device_type == 'cuda' else host
        reserved = torch.cuda.max_memory_reserved() / 2**30 if device_type == 'cuda' else host
        eta = dt * (max_iters - iter_num)
        log(f"iter {iter_num}: loss {loss_val:.4f}, lr {lr:.2e}, {tps:,.0f} tok/s, "
            f"mfu {'n/a' if math.isnan(mfu) else f'{100 * mfu:.1f}%'}, mem {mem:.2f} GiB, "
            f"eta {eta / 3600:.0f}h{eta % 3600 / 60:02.0f}m")
        record({'iter': iter_num, 'tokens': iter_num * tokens_per_step, 'loss': loss_val, 'lr': lr,
                'tokens_per_sec': tps, 'mfu': None if math.isnan(mfu) else mfu, 'mem_gib': mem,
                'reserved_gib': reserved, 'host_gib': host})
        if world_size > 1 and busy[1] > 0:  # each rank's share, idle fraction and MFU on its own peak
            stats = [None] * world_size
            dist.all_gather_object(stats, (float(busy[0]), float(busy[1]), peak))
            log('  ' + '; '.join(f"rank {r}: {n} seq, idle {max(0, 1 - c / w):.0%}" + (
                f", mfu {flops_per_token * n * block_size / w / p:.0%}" if p else '')
                for r, (n, (c, w, p)) in enumerate(zip(shares, stats))))
        t_log, steps_since, loss_acc = time.perf_counter(), 0, torch.zeros((), device=device)
        worst_run, skipped = bad_run.clone(), torch.zeros((), device=device)
    t_pause = time.perf_counter()  # evaluation and checkpoints are not step time
    if iter_num % eval_interval == 0 or iter_num == max_iters:
        validate()
    stop = torch.tensor(len(stop_signals))  # host tensor (gloo): no wait for the GPU
    dist.all_reduce(stop)  # a signal may reach the ranks at different steps
    due = checkpoint_interval and (iter_num % checkpoint_interval == 0 or iter_num == max_iters)
    if due or stop:
        watchdog.progress(limit_factor=4)
        ckpt.save(out_dir, iter_num, model, optimizer, {'model_args': vars(model_args), 'config': config}, keep_last)
    if stop:
        log(f"iter {iter_num}: stopped by a signal; checkpoint saved, init_from=resume continues")
        break
    t_log += time.perf_counter() - t_pause
    watchdog.progress(limit_factor=1)

if wandb_run:
    wandb_run.finish()
dist.barrier()  # without it one run in three aborted at exit on gloo
dist.destroy_process_group()
