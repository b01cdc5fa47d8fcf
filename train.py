"""
Trains a GPT on one process, one GPU, or many (DDP or FSDP2, as plan.py decides).
$ python train.py configs/gpt_tiny.py --device=cpu
$ torchrun --standalone --nproc_per_node=8 train.py configs/gpt_13b.py
batch_size is the GLOBAL number of sequences per optimizer step (as gigaGPT), however the plan
spreads them over ranks and micro-batches: the gradient is always that of the whole batch.
nanoGPT's config files run unchanged: gradient_accumulation_steps, always_save_checkpoint,
eval_only and decay_lr mean what they mean there, and the defaults its configs rely on are its own.
"""
import functools
import math
import os
import re
import signal
import sys
import time
from contextlib import nullcontext

from configurator import answer_help, configure, is_knob

from hetgpt.errors import die
answer_help(__file__)  # --help: the knobs below, read from this file (before torch is imported)
# Ctrl-C, preemption (SIGTERM) or Slurm's warning (SIGUSR1) before training starts (imports
# included): one line, nothing to save. signals.Signals takes these over for the training loop.
for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
    signal.signal(sig, lambda signum, frame: die(
        f"stopped by {signal.Signals(signum).name} while starting; nothing was written"))

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint

from hetgpt import ckpt
from hetgpt import costs
from hetgpt import corpus, group, membership, metrics, optim, rundir, signals
from hetgpt import hardware
from hetgpt import hf
from hetgpt import planner
from hetgpt.balance import balance_weights, fit, rebalance
from model import GPT, LMHeadLoss, chunk_loss, config_from, make_optimizer
hardware.return_freed_host_memory()  # host RSS follows live tensors, as planned and probed

# -----------------------------------------------------------------------------
# I/O
out_dir = 'out'
init_from = 'scratch'  # 'scratch', 'resume' (latest checkpoint), 'auto' (resume if any), 'gpt2*'
dataset = 'openwebtext'  # data/<dataset>/{train,val}.bin from data/prepare.py
eval_interval = 500    # evaluate every this many steps (and at the end)
eval_iters = 20        # the validation loss is over eval_iters × 8 fixed sequences
eval_only = False      # evaluate the model as loaded (init_from) once and exit
log_interval = 10
checkpoint_interval = 1000  # and at the end; 0: none (benchmarks), but on SIGTERM/SIGUSR1
always_save_checkpoint = True  # False: save only at evaluations that lower the val loss (nanoGPT)
new_dataset = False    # True: resume a checkpoint on another dataset than the one it was trained on
keep_last = 2          # complete checkpoints kept in out_dir
wandb_log = False      # offline unless WANDB_API_KEY is set; never blocks training
wandb_project = 'hetgpt'
wandb_run_name = 'run'
# model
n_layer = 12
n_head = 12
n_embd = 768
block_size = 1024
vocab_size = 50304     # GPT-2's 50257 tokens padded to a multiple of 64
dropout = 0.0
bias = False           # biases in Linear and LayerNorm layers
init_std = 0.02
# optimizer: AdamW, linear warmup then cosine decay to min_lr
batch_size = 32        # sequences per optimizer step, all ranks together
gradient_accumulation_steps = 0  # nanoGPT's: > 0 makes batch_size the micro-batch, the global
                       # batch batch_size × gradient_accumulation_steps (whatever the world size)
learning_rate = 6e-4
max_iters = 5000
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.95
adam_eps = 1e-8
grad_clip = 1.0        # 0 disables clipping
max_bad_steps = 5      # stop after this many steps in a row with non-finite loss or gradients
decay_lr = True        # False: a constant learning_rate (no warmup either, as nanoGPT)
warmup_iters = 2000
lr_decay_iters = 5000
min_lr = 6e-5
# system
seed = 1337
device = 'auto'        # 'auto' (cuda if available), 'cpu', 'cuda'
dtype = 'auto'         # 'auto' (bfloat16 where native, else float32), 'float32', 'bfloat16', ...
compile = True         # torch.compile each block and the loss (on CPU: needs a C++ compiler)
plan = 'auto'          # 'auto' or one of plan.STRATEGIES: ddp, ddp+ac, fsdp-noreshard, fsdp, ...
micro_batch_size = 0   # sequences per forward on each rank; 0 = the planner's choice
memory_fraction = 0.9  # of each device's memory the planner may use
init_device = 'auto'   # 'cpu': whole model on the host first; 'meta': each rank makes its shard
balance = 'auto'       # split of the batch over ranks: 'auto' (measured speed), 'even', or '3,1,1'
rebalance_interval = 50  # steps between re-measuring the ranks' speed (balance=auto)
stall_timeout = 300    # seconds with no progress before ranks give up on a silent one; 0: never
# -----------------------------------------------------------------------------
# What each knob may be (configurator.check_rule): a bound, an interval, or a pattern to match.
RULES = {
    # the model's shape and the batch (gradient_accumulation_steps, micro_batch_size): plan.py's
    # table, which plan.py checks configs with too; their product is bounded by planner.batch_of
    **planner.SHAPE_RULES,
    'out_dir': '.+', 'init_from': 'scratch|resume|auto|gpt2(-medium|-large|-xl)?', 'dataset': '.+',
    # Upper bounds catch slips only (an extra zero, 10**9 for 10**3): counts of steps up to 1e9,
    # 100 times a 10M-step run; eval_iters × 8 validation sequences (nanoGPT evaluates 200).
    'eval_interval': '[1, 1e9]', 'eval_iters': '[1, 1e6]', 'log_interval': '[1, 1e9]',
    'keep_last': '[1, 1e6]', 'checkpoint_interval': '[0, 1e9]', 'eval_only': '',
    'always_save_checkpoint': '', 'new_dataset': '', 'decay_lr': '', 'wandb_log': '',
    'wandb_project': '', 'wandb_run_name': '', 'max_iters': '[1, 1e9]',
    'learning_rate': '> 0', 'weight_decay': '>= 0', 'beta1': '[0, 1)', 'beta2': '[0, 1)',
    'adam_eps': '>= 0', 'grad_clip': '>= 0', 'max_bad_steps': '[1, 1e9]',
    'warmup_iters': '[0, 1e9]', 'lr_decay_iters': '[0, 1e9]', 'min_lr': '>= 0',
    'seed': '[0, 1e18]',  # (+ 1,000,003 × iter_num stays within torch.manual_seed's 64 bits)
    'compile': '', 'device': 'auto|cpu|cuda(:[0-9]+)?', 'dtype': 'auto|float32|bfloat16|float16',
    'plan': '|'.join(map(re.escape, ('auto',) + planner.STRATEGIES)),
    'memory_fraction': '(0, 1]', 'init_device': 'auto|cpu|meta', 'balance': r'auto|even|[0-9.,]+',
    'rebalance_interval': '[1, 1e9]', 'stall_timeout': '[0, 1e7]'}  # (seconds: 1e7 is 16 weeks)
defaults = {k: v for k, v in globals().items() if is_knob(k, v)}
config = configure(defaults, rules=RULES)
globals().update(config)
batch_size, micro_batch_size = planner.batch_of(batch_size, gradient_accumulation_steps,
                                                micro_batch_size)  # (nanoGPT's configs)
if n_embd % n_head:
    die(f"n_embd={n_embd} is not divisible by n_head={n_head}; pick n_head among "
        f"{[h for h in range(1, 129) if n_embd % h == 0][-6:]}")
if decay_lr and min_lr > learning_rate:
    die(f"min_lr={min_lr} is above learning_rate={learning_rate}: lower min_lr")
# nanoGPT's character-level data (meta.pkl) sets the vocabulary, unless the config does
dataset_meta = corpus.dataset_vocab(os.path.join('data', dataset))
if dataset_meta and vocab_size == defaults['vocab_size'] and not init_from.startswith('gpt2'):
    vocab_size = config['vocab_size'] = dataset_meta['vocab_size']
world_size = int(os.environ.get('WORLD_SIZE', 1))  # set by torchrun, as the three below
rank, local_rank = int(os.environ.get('RANK', 0)), int(os.environ.get('LOCAL_RANK', 0))
local_world = int(os.environ.get('LOCAL_WORLD_SIZE', 1))
weights = balance_weights(balance, world_size)  # None: by measured speed
if batch_size < world_size:
    die(f"batch_size={batch_size} cannot feed {world_size} ranks: raise it or use fewer ranks")
found = rundir.claim(out_dir, rank, init_from)  # writable, locked, not another run's checkpoints
resume_from = found[-1] if found and init_from in ('resume', 'auto') else None
try:  # (checked; ckpt.load reads it again)
    saved = ckpt.read_meta(resume_from) if resume_from else {}
except (OSError, ValueError) as e:
    ckpt.damaged(resume_from, e)
trained_on = saved.get('config', {}).get('dataset', dataset)
if trained_on != dataset and not new_dataset:
    die(f"{resume_from} was trained on dataset={trained_on!r}, not {dataset!r}: "
        f"new_dataset=True to go on with {dataset!r}, or dataset={trained_on!r}")
if saved.get('iter', 0) >= max_iters and not eval_only:
    if rank == 0:
        print(f"{resume_from} is at iter {saved['iter']}, max_iters={max_iters}: nothing to "
              f"train; raise max_iters to go on", flush=True)
    sys.exit(0)

# -----------------------------------------------------------------------------
# Devices and processes. Every run has a process group, one rank or many: the code has one path.
device, dtype, compile, how = hardware.resolve(device, dtype, compile, local_rank)
device_type, ptdtype = device.split(':')[0], getattr(torch, dtype)
# The process group, and a watchdog that ends this rank, naming the silent one, when no step
# completes for stall_timeout seconds (four times that during start-up and checkpoint writes).
watchdog = group.start_group(hardware.BACKENDS[device_type], rank, world_size, stall_timeout)
master = rank == 0
log = functools.partial(print, flush=True) if master else lambda *args: None
log(f"{world_size} rank(s) on {device_type}, {how}; planning")


def gather(obj):  # every rank's obj, in rank order
    out = [None] * world_size
    dist.all_gather_object(out, obj)
    return out


# -----------------------------------------------------------------------------
# Data: a flat uint16 token file per split. The sequences of the global batch at step k are a fixed
# function of (seed, k), whatever the world size, split or micro-batching: resume and uneven splits
# are exact because every rank agrees on the batch and takes its own slice.
data = {split: corpus.open_tokens(os.path.join('data', dataset, f'{split}.bin'), block_size,
                                 vocab_size, dataset) for split in ('train', 'val')}


def batch_offsets(split, step, n):
    rng = np.random.default_rng([seed, step + 1, 0 if split == "train" else 1])  # -1: fixed sets
    return rng.integers(0, len(data[split]) - block_size, size=n)


def get_batch(split, offsets):
    # The windows of block_size+1 tokens at offsets, each id checked below vocab_size (a change to
    # the file that the start-up check's sampled cache missed: one line, before a step uses it)
    windows = np.stack([data[split][i:i + block_size + 1] for i in offsets])
    corpus.check_batch(os.path.join('data', dataset, f'{split}.bin'), windows, offsets, vocab_size)
    x, y = windows[:, :-1].astype(np.int64), windows[:, 1:].astype(np.int64)
    # CUDA: from pinned memory the copy is asynchronous: the host does not wait for the device
    pinned = lambda t: t.pin_memory().to(device, non_blocking=True) if device_type == 'cuda' else t
    return pinned(torch.from_numpy(x)), pinned(torch.from_numpy(y))


# Every rank runs the same run: one that does not (another config, code, torch or data: a
# machine that joined with its own) leaves, the others go on without it.
fingerprint = membership.fingerprint(config, [os.path.join('data', dataset, f'{split}.bin')
                                         for split in data])
machines = gather(membership.machine())  # who is in the run: torchrun's elastic agents come and go
membership.same_run(gather(fingerprint), machines, rank, saved.get('fingerprint'))

# -----------------------------------------------------------------------------
# The plan, for the ranks as they are, then the model built as it says
if init_from.startswith('gpt2'):
    raw_model = hf.from_pretrained(init_from, dropout=dropout)
    model_args = raw_model.config
else:
    model_args = config_from(config)
if model_args.block_size < block_size:
    die(f"block_size={block_size} exceeds the model's {model_args.block_size}")
if device_type == 'cuda':  # NCCL makes its buffers at its first collective: this_rank measures them
    dist.all_reduce(torch.zeros(1, device=device))
stated = hardware.stated_memory(local_rank, device_type)  # (HETGPT_MEM_GIB; at most the device's)
costs.optimizer_state_bytes()  # (one step of the optimizer loads what steps load: the
# process this_rank measures on a CPU is then the one the model's bytes come on top of)
me = hardware.this_rank(device_type, rank, local_world, stated)
ranks = gather(me)
run_plan = planner.make_plan(
    model_args, batch_size, ranks, plan=plan, micro_batch_size=micro_batch_size,
    memory_fraction=memory_fraction, dtype=dtype, weights=weights,
    init_device='cpu' if init_from.startswith('gpt2') else init_device)  # (pretrained: on the host)
if not run_plan.fits:
    die(f"plan={plan} does not fit: {run_plan.advice}")

# The model's shapes first (meta device), then its weights: 'cpu', the whole model on the host,
# then placed or sharded; 'meta', each rank makes just its own shard after wrapping. The initial
# weights are a function of (seed, name) drawn on this run's kind of device (GPT.init_weights):
# the same under every strategy, init_device and world size.
torch.manual_seed(seed)
if not init_from.startswith('gpt2'):
    with torch.device('meta'):
        raw_model = GPT(model_args)
    if run_plan.init_device == 'cpu':
        raw_model.materialise('cpu', seed, draw_on=device)
# In this order: activation checkpointing, then compile, then FSDP/DDP wrapping (compile sees the
# checkpointed blocks; FSDP wraps the compiled ones; torchtitan's order).
recomputes = run_plan.ac[rank]  # this rank's backward runs its forward again
if recomputes:
    for block in raw_model.transformer.h:
        block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)
if compile:
    for block in raw_model.transformer.h:
        block.compile()
    LMHeadLoss.kernel = torch.compile(chunk_loss)  # the loss's elementwise work, fused per chunk
fsdp_modules = []
if run_plan.shard:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import (CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy,
                                        fully_shard)
    # fully_shard moves each parameter to the device as it shards it: the model never has to fit
    # on one GPU. The mesh uses the default group: offloaded gradients are host tensors, whose norms
    # clip_grad_norm_ reduces through its gloo. Pinned host shards (CUDA only) copy asynchronously.
    offload = CPUOffloadPolicy(pin_memory=device_type == 'cuda') if run_plan.offload else None
    fsdp_kw = dict(mesh=init_device_mesh(device_type, (world_size,)),
                   mp_policy=MixedPrecisionPolicy(param_dtype=ptdtype, reduce_dtype=torch.float32),
                   offload_policy=offload or OffloadPolicy())
    for block in raw_model.transformer.h:
        fully_shard(block, reshard_after_forward=run_plan.reshard_after_forward, **fsdp_kw)
    model = fully_shard(raw_model, **fsdp_kw)
    fsdp_modules = [m for m in model.modules() if hasattr(m, 'set_requires_gradient_sync')]
reduce_every_micro_batch = run_plan.reduce_every_micro_batch
if raw_model.lm_head.weight.is_meta:  # storage now, where this rank keeps its weights or shard
    raw_model.materialise('cpu' if run_plan.offload else device, seed, draw_on=device)
# DDP keeps float32 weights and its matmuls run in ptdtype. No cache of the weights' 16-bit copies:
# under checkpointing it would keep every block's until the forward ends.
autocast = torch.autocast(device_type=device_type, dtype=ptdtype, cache_enabled=False,
                          enabled=not run_plan.shard and ptdtype != torch.float32)
if not run_plan.shard:
    raw_model.to(device)
    model = DDP(raw_model, gradient_as_bucket_view=True) if world_size > 1 else raw_model
optimizer = make_optimizer(model.parameters(), learning_rate, weight_decay, (beta1, beta2),
                           adam_eps)
base_lrs = [group['lr'] for group in optimizer.param_groups]  # each group's own (make_optimizer's)
scaler = torch.amp.GradScaler(device_type, enabled=dtype == 'float16')


def get_lr(it):
    if not decay_lr:
        return learning_rate
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    ratio = (it - warmup_iters) / max(1, lr_decay_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)


def stamp():  # now, in this rank's work: by the host's clock, or (CUDA) an event on the GPU
    if device_type == 'cpu':
        return time.perf_counter()
    return torch.cuda.current_stream().record_event(torch.cuda.Event(enable_timing=True))


def seconds(a, b):  # from stamp a to stamp b (CUDA: b.synchronize() waits for b, returns None)
    return b - a if device_type == 'cpu' else b.synchronize() or a.elapsed_time(b) / 1000


# FSDP's pre-hook on a module waits for the all-gather of its weights, so for the slowest rank: in
# a timed forward (its start in `stamps`) hooks just before and after it stamp the wait (eagerly).
stamps = []
stamp_wait = torch.compiler.disable(lambda module, args: stamps.append(stamp()) if stamps else None)
for m in fsdp_modules:  # (FSDP's pre-hook was prepended: the one prepended now runs before it)
    m.register_forward_pre_hook(stamp_wait, prepend=True)
    m.register_forward_pre_hook(stamp_wait)


def forward(split, offsets, weight):
    # Sum of token losses, × weight. An empty micro-batch runs one sequence × 0 so that this rank
    # still issues the collectives of a forward and backward.
    watchdog.progress()
    x, y = get_batch(split, offsets if len(offsets) else batch_offsets(split, -1, 1))
    with autocast:
        _, loss = model(x, y, reduction='sum')
    return loss * (weight if len(offsets) else 0.0), loss.detach() * bool(len(offsets))


def forward_backward(offsets, sizes, weight, reduce=True, timed=False):
    # This rank's micro-batches. DDP reduces gradients after the last one; FSDP after each one when
    # the plan says so (sharded gradients; unsharded accumulation costs memory, saves
    # communication). Returns the token-loss sum and, timed, this rank's compute seconds: 3 (4 when
    # it checkpoints) × its forwards' work less FSDP's waits, as a backward may wait for others.
    loss_total, compute, done = torch.zeros((), device=device), 0.0, 0
    for i, size in enumerate(sizes):
        reduce_now = reduce and (reduce_every_micro_batch or i == len(sizes) - 1)
        for m in fsdp_modules:
            m.set_requires_gradient_sync(reduce_now)
        with model.no_sync() if isinstance(model, DDP) and not reduce_now else nullcontext():
            stamps[:] = [stamp()] if timed else []  # (not empty: FSDP's waits are stamped)
            loss, loss_sum = forward('train', offsets[done:done + size], weight)
            marks, stamps[:] = (stamps + [stamp()] if timed else []), []
            scaler.scale(loss).backward()
        compute += (3 + recomputes) * sum(map(seconds, marks[::2], marks[1::2]))
        loss_total += loss_sum.float()
        done += size
    return loss_total, compute


def probe_step(sizes):
    # Training steps as the run makes them, at this rank's cap: its micro-batches (sizes) reduced
    # as the plan says, then an optimizer step. The last is measured: the optimizer's state and
    # compiled kernels are there from the first, DDP's gradient buckets as it rebuilds them in its
    # second iteration, as in every later step. Zero gradients (weight 0) and lr 0 leave the
    # weights as they are; the state is dropped after. Returns this rank's peak bytes and, on
    # CUDA, the bytes outside the allocator once the step's kernels are loaded; None when out of
    # memory or above the plan's room. (A host whose peak RSS cannot be reset is never above.)
    cuda = device_type == 'cuda'
    for group in optimizer.param_groups:
        group['lr'] = 0.0
    try:
        steps = 3 if isinstance(model, DDP) else 2
        for i in range(steps):
            resets = i == steps - 1 and (hardware.reset_peaks(device_type) or cuda)
            forward_backward(batch_offsets('train', -1, sum(sizes)), sizes, 0.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        # (stated, the GPU may be shared: what is outside the allocator is not all this rank's)
        outside = hardware.outside_allocator() if cuda and stated is None else None
        peak = dict(total=torch.cuda.max_memory_reserved() if cuda else hardware.peak_rss(),
                    alloc=torch.cuda.max_memory_allocated() if cuda else None, overhead=outside)
        if resets and peak['total'] > run_plan.room(rank, outside):
            peak = None
    except torch.cuda.OutOfMemoryError:
        peak = None
    optimizer.zero_grad(set_to_none=True)
    optimizer.state.clear()
    return peak


def measure_speed(cap):  # this rank's c0 + c1·n seconds for a micro-batch of n (balance.fit)
    sizes = (max(1, cap // 2), max(1, cap // 2), cap)  # a warm-up, then two sizes
    offsets = batch_offsets('train', -1, cap)
    t = [forward_backward(offsets, [b], 0.0, reduce=False, timed=True)[1] for b in sizes]
    optimizer.zero_grad(set_to_none=True)
    return fit(sizes[1:], t[1:])


# The plan checked on the real device: each rank probes its micro-batch cap; the planner halves
# those that failed, and all probe again. Then, by speed, the split the first step runs.
caps = run_plan.micro_batch
by_speed = weights is None and world_size > 1
log(f"probe step: training steps at micro-batch {caps[0]} (weights unchanged) to check memory"
    + (" (compiling first: slow the first time)" if compile else '')
    + ("; then timed micro-batches on every rank to split the batch" if by_speed else ''))
while True:  # (this rank's micro-batches at its cap: as many as the plan gives it, up to 2)
    count = min(2, len(planner.resplit(run_plan, caps).micro_batches[rank]))
    probed = probe_step([caps[rank]] * count)
    measured = gather(probed)
    if all(measured):
        break
    caps = planner.after_oom(caps, measured, run_plan.strategy)
    log(f"out of memory in the probe step: micro-batches now {caps}")
c0, c1 = zip(*gather(measure_speed(caps[rank]))) if by_speed else (None, None)
run_plan = planner.resplit(run_plan, caps, c0, c1)
log(run_plan.table(measured))
resumed = ckpt.load(resume_from, model, optimizer, model_args) if resume_from else {}
iter_num = resumed.get('iter', 0)
if resume_from:
    was = resumed.get('machines')
    log(f"resumed from {resume_from} at iter {iter_num}{membership.membership(was, machines)}")
best_val = resumed.get('best_val_loss')  # (always_save_checkpoint=False saves when it drops)
best_val = best_val if type(best_val) is float else math.inf
if decay_lr and max_iters < lr_decay_iters and not eval_only:
    log(f"warning: max_iters={max_iters} < lr_decay_iters={lr_decay_iters}: the learning rate "
        f"ends at {get_lr(max_iters):.2e}, not min_lr={min_lr:.2e}; set lr_decay_iters={max_iters}")
if gradient_accumulation_steps:
    log(f"gradient_accumulation_steps={gradient_accumulation_steps} (nanoGPT's meaning): global "
        f"batch {batch_size} = {config['batch_size']} × {gradient_accumulation_steps} sequences")
# rank 0's record: first the plan against the probe step (for bench/ and for the record)
record = metrics.Metrics(out_dir, iter_num, {
    'iter': iter_num, 'plan': run_plan.strategy, 'ac': run_plan.ac[0],
    'micro_batch': caps[0], 'pred_gib': run_plan.predicted[0]['total'] / 2**30,
    'pred_host_gib': run_plan.predicted[0]['host_rank'] / 2**30,
    'pred_tokens_per_sec': run_plan.tokens_per_sec, 'probe_gib': probed['total'] / 2**30,
    'probe_alloc_gib': (probed['alloc'] or probed['total']) / 2**30,
    'overhead_gib': (probed['overhead'] or 0) / 2**30},
    wandb_init=wandb_log and dict(project=wandb_project, name=wandb_run_name, config=config),
) if master else lambda row: None


peak_flops = [hardware.peak_flops(r['gpu'], dtype) for r in ranks]  # None: unknown (CPU)
peak_sum = sum(peak_flops) if all(peak_flops) else None
trained_args = {**vars(model_args), 'block_size': block_size}  # (may be below the model's)
tokens_per_step = batch_size * block_size


@torch.no_grad()
def validate(it, cap, step_seconds):
    # The loss on the same fixed validation sequences every time, logged, recorded and returned
    # (None when a signal dropped it: the checkpoint matters, not this evaluation). step_seconds:
    # of a training step, to say beforehand when this will take a while.
    model.eval()
    offsets = batch_offsets('val', -1, eval_iters * 8)
    expect = step_seconds * len(offsets) / batch_size / 3  # a forward is a third of a step
    if expect > 10:
        log(f"iter {it}: evaluating {len(offsets):,} sequences, about {expect:.0f} s")
    mine = np.array_split(offsets, world_size)[rank]
    count = torch.tensor(math.ceil(len(mine) / cap) or 1)  # host tensor (gloo): read at once
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    total = torch.zeros((), device=device)
    for piece in np.array_split(mine, int(count)):
        stop = torch.tensor(len(stop_signals))
        dist.all_reduce(stop)
        if stop:
            break
        total += forward('val', piece, 1.0)[1].float()
    model.train()
    if not stop:
        dist.all_reduce(total)  # on the device (NCCL under CUDA)
        val = total.item() / (len(offsets) * block_size)
        log(f"iter {it}: val loss {val:.4f}")
        record({'iter': it, 'tokens': it * tokens_per_step, 'val_loss': val})
        return val


def log_ranks(ran, busy):
    # What each rank ran in its last step (sequences, micro-batches), its idle fraction, and its
    # MFU on its own peak
    log('  ' + '; '.join(
        f"rank {r}: {sum(ms)} seq in {'+'.join(map(str, ms))}, idle {max(0, 1 - c / w):.0%}"
        + (f", mfu {costs.mfu(trained_args, sum(ms), w, p):.0%}" if p else '')
        for r, ((ms, c, w), p) in enumerate(zip(gather((ran, *busy.tolist())), peak_flops))))


log(f"{raw_model.num_params(False):,} parameters; {world_size} rank(s) on {device_type}, {how}; "
    f"{tokens_per_step:,} tokens per step; shares {run_plan.share}")
stop_signals = signals.Signals(out_dir)  # from here a signal checkpoints at the end of the step
dt = run_plan.step_time  # seconds per step: predicted, then measured
if iter_num == 0 or eval_only:
    val = validate(iter_num, caps[rank], dt)
    best_val = val if val is not None and iter_num == 0 else best_val

# -----------------------------------------------------------------------------
# The loop
sizes = run_plan.micro_batches  # every rank's micro-batches (rebalanced by measured speed)
bad_steps = optim.BadSteps(device, max_bad_steps, out_dir)
busy = torch.zeros(2, dtype=torch.float64)  # smoothed (compute, whole step) seconds of this rank
host_reset = hardware.reset_peaks(device_type)  # the steps' peaks from here, not the probe's
t_log, steps_since, loss_acc = time.perf_counter(), 0, torch.zeros((), device=device)
while iter_num < max_iters and not eval_only:
    torch.manual_seed(seed + 1_000_003 * iter_num + rank)  # dropout: by (seed, step, rank)
    lr = get_lr(iter_num)
    for g, base in zip(optimizer.param_groups, base_lrs):  # the schedule scales each group
        g['lr'] = base * lr / learning_rate
    start = sum(map(sum, sizes[:rank]))
    offsets = batch_offsets('train', iter_num, batch_size)[start:start + sum(sizes[rank])]
    # Per-rank compute time: on CPU always; on CUDA (it synchronises) just before a rebalance
    timed = world_size > 1 and (device_type == 'cpu'
                                or iter_num % rebalance_interval >= rebalance_interval - 5)
    t_step = stamp() if timed else None
    # loss = sum of token losses / tokens of the whole batch; × world_size undoes DDP's and FSDP's
    # averaging over ranks, so the reduced gradient is that of the whole batch.
    ran = sizes[rank]  # (the sizes may be rebalanced below)
    loss_sum, compute = forward_backward(offsets, ran, world_size / tokens_per_step, timed=timed)
    loss_acc += loss_sum
    scaler.unscale_(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip or float('inf'))
    norm = norm.full_tensor() if hasattr(norm, 'full_tensor') else norm  # FSDP: a DTensor
    bad = ~torch.isfinite(norm)  # a non-finite loss or gradient: skip the update (and the batch)
    if optimizer.defaults.get('fused'):  # the kernel skips it itself: the host does not wait
        optimizer.found_inf = bad.float()
        scaler.step(optimizer)
    elif not bad:  # (the foreach fallback: one scalar to the host per step)
        scaler.step(optimizer)
    bad_steps.add(bad)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    iter_num += 1
    steps_since += 1
    if timed:
        busy = 0.7 * busy + 0.3 * busy.new_tensor([compute, seconds(t_step, stamp())])
    if c0 is not None and iter_num % rebalance_interval == 0:  # refit to recent compute times
        new, c1 = rebalance(sizes, caps, c0, c1, gather(float(busy[0])), run_plan.shard)
        if new != sizes:
            log(f"iter {iter_num}: rebalanced {list(map(sum, sizes))} -> {list(map(sum, new))}")
        sizes = new

    if iter_num % log_interval == 0 or iter_num == max_iters:
        bad_steps.report(iter_num, steps_since, log)  # (the same on every rank)
        dist.all_reduce(loss_acc)  # the whole global batch's loss, not rank 0's share
        loss_val = loss_acc.item() / (steps_since * tokens_per_step)
        dt = (time.perf_counter() - t_log) / steps_since
        tps = tokens_per_step / dt
        mfu = costs.mfu(trained_args, batch_size, dt, peak_sum)
        mem, reserved, host = hardware.peak_memory(device_type, host_reset)  # GiB
        eta = dt * (max_iters - iter_num)
        grad_norm = norm.item()  # the last step's, before clipping
        log(f"iter {iter_num}: loss {loss_val:.4f}, lr {lr:.2e}, grad norm {grad_norm:.3g}, "
            f"{tps:,.0f} tok/s, mfu {'n/a' if mfu is None else f'{100 * mfu:.1f}%'}, "
            f"mem {mem:.2f} GiB, eta {eta / 3600:.0f}h{eta % 3600 / 60:02.0f}m")
        record({'iter': iter_num, 'tokens': iter_num * tokens_per_step, 'loss': loss_val, 'lr': lr,
                'grad_norm': grad_norm, 'tokens_per_sec': tps, 'mfu': mfu, 'mem_gib': mem,
                'reserved_gib': reserved, 'host_gib': host})
        if world_size > 1 and busy[1] > 0:
            log_ranks(ran, busy)
        t_log, steps_since, loss_acc = time.perf_counter(), 0, torch.zeros((), device=device)
    t_pause = time.perf_counter()  # evaluation and checkpoints are not step time
    val = None
    if iter_num % eval_interval == 0 or iter_num == max_iters:
        val = validate(iter_num, caps[rank], dt)
    stop = torch.tensor(len(stop_signals))  # host tensor (gloo): no wait for the GPU
    dist.all_reduce(stop)  # a signal may reach the ranks at different steps
    if always_save_checkpoint:
        due = checkpoint_interval and (iter_num % checkpoint_interval == 0 or iter_num == max_iters)
    else:  # nanoGPT's: at an evaluation that lowers the best val loss (the same on every rank)
        due = val is not None and val < best_val
    best_val = min(best_val, val if val is not None else math.inf)
    if due or stop:
        watchdog.progress(limit_factor=4)
        path = ckpt.save(out_dir, iter_num, model, optimizer,
                         {'model_args': vars(model_args), 'config': config, 'machines': machines,
                          'fingerprint': fingerprint,
                          'best_val_loss': None if best_val == math.inf else best_val}, keep_last)
        log(f"iter {iter_num}: checkpoint written to {path}")
    if stop:
        log(f"iter {iter_num}: stopped by a signal; checkpoint saved, init_from=resume continues")
        break
    t_log += time.perf_counter() - t_pause
    watchdog.progress(limit_factor=1)

if master:
    record.finish()
dist.barrier()  # without it one run in three aborted at exit on gloo
watchdog.stop()
dist.destroy_process_group()
