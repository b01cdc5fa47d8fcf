"""
Trains a GPT on one process or many (DDP or FSDP2, as plan.py decides).
$ python train.py configs/gpt_tiny.py --device=cpu
$ torchrun --standalone --nproc_per_node=8 train.py configs/gpt_13b.py
batch_size is the GLOBAL number of sequences per step (as gigaGPT), however the
plan spreads them over ranks: the gradient is always that of the whole batch.
nanoGPT's config files run unchanged, its knobs meaning what they mean there.
"""
import functools
import math
import os
import time
from dataclasses import replace

from hetgpt import knobs
from hetgpt.errors import die, end
from hetgpt.knobs import answer_help, configure, is_knob, model_defaults
from hetgpt.run import signals
answer_help(__file__, model=True)  # --help: the knobs below and GPTConfig's
signals.starting()  # a stop before training (imports included): one line

# -----------------------------------------------------------------------------
# I/O
out_dir = 'out'
init_from = 'scratch'  # 'scratch', 'resume' (the latest checkpoint),
                       # 'auto' (resume if any), 'gpt2*' (HF weights)
dataset = 'openwebtext'  # data/<dataset>/{train,val}.bin (data/prepare.py)
eval_interval = 500    # evaluate every this many steps (and at the end)
eval_iters = 20        # the val loss is over eval_iters × 8 fixed sequences
eval_only = False      # evaluate the model as loaded once, and exit
log_interval = 10
checkpoint_interval = 1000  # and at the end; 0: none, but on SIGTERM/SIGUSR1
always_save_checkpoint = True  # False: only on a new best val loss (nanoGPT)
new_dataset = False    # True: resume on other data than the checkpoint's
keep_last = 2          # complete checkpoints kept in out_dir
wandb_log = False      # online if logged in, else offline; never blocks
wandb_project = 'hetgpt'
wandb_run_name = 'run'
# model: GPTConfig's fields at model.py's defaults (--help lists them), but
bias = False           # no biases in Linears and LayerNorms, as nanoGPT's
# optimizer: AdamW (or Muon), linear warmup, cosine decay to min_lr
batch_size = 32        # sequences per step, all ranks together
gradient_accumulation_steps = 0  # nanoGPT's: > 0 makes batch_size the
                       # micro-batch, the global batch batch_size × this
learning_rate = 6e-4
max_iters = 5000
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.95
adam_eps = 1e-8
optimizer = 'adamw'    # or 'muon' for the blocks' matrices
muon_lr = 0.02         # Muon's (Keller Jordan's defaults)
muon_momentum = 0.95   # (the schedule scales muon_lr)
muon_weight_decay = 0.0
grad_clip = 1.0        # 0 disables clipping
max_bad_steps = 5      # stop after this many non-finite steps in a row
decay_lr = True        # False: a constant learning_rate, no warmup (nanoGPT)
warmup_iters = 2000
lr_decay_iters = 5000
min_lr = 6e-5
# system
seed = 1337
device = 'auto'        # 'auto' (cuda if available), 'cpu', 'cuda'
dtype = 'auto'         # 'auto' (each rank's fastest), 'bfloat16', ... or per rank
compile = True         # torch.compile each block and the loss
plan = 'auto'          # 'auto' or a strategy: ddp, ddp+ac, fsdp, ... (plan.py)
micro_batch_size = 0   # sequences per forward on each rank; 0: the plan's
memory_fraction = 1.0  # of each device's memory to plan with
init_device = 'auto'   # 'cpu': the model on the host first; 'meta': by shard
balance = 'auto'       # the batch over ranks: 'auto' (by speed), 'even', '3,1'
rebalance_interval = 50  # steps between re-splits by speed (balance=auto)
stall_timeout = 300    # seconds without progress before ranks give up; 0: never
outer_interval = 0     # > 0: local steps, this many per node between syncs
outer_lr = 0.7         # local steps' outer Nesterov lr (DiLoCo's)
outer_momentum = 0.9   # and its momentum (docs/two_machines.md)
# -----------------------------------------------------------------------------
defaults = {**model_defaults(),  # (a field not set above: model.py's default)
            **{k: v for k, v in globals().items() if is_knob(k, v)}}
config = configure(defaults, rules=knobs.TRAIN)  # (hetgpt/knobs.py)
knobs.check_train(config)
globals().update(config)
batch_size, micro_batch_size = knobs.batch_of(  # (nanoGPT's configs)
    batch_size, gradient_accumulation_steps, micro_batch_size)
world_size = int(os.environ.get('WORLD_SIZE', 1))  # set by torchrun
rank = int(os.environ.get('RANK', 0))
local_rank = int(os.environ.get('LOCAL_RANK', 0))
local_world = int(os.environ.get('LOCAL_WORLD_SIZE', 1))
weights = knobs.split_weights(balance, batch_size, world_size)  # None: by speed

# The knobs hold: now torch (a mistake above took a tenth of a second).
# GPU memory in pages any tensor can reuse, as the planner budgets it:
os.environ.setdefault('PYTORCH_CUDA_ALLOC_CONF', 'expandable_segments:True')
import numpy as np
import torch
import torch.distributed as dist

from hetgpt import hardware
from hetgpt.data import corpus
from hetgpt.planner import search
from hetgpt.planner.plan import duration
from hetgpt.run import (checkpoint, hf, local_steps, membership, metrics,
                        optim, parallel, probe, process_group, rundir)
from hetgpt.run.process_group import gather
from hetgpt.run.speed import MFU, Speed
from model import GPT, config_from, make_optimizer
# nanoGPT's character-level data (meta.pkl) sets vocab_size, if not given
chars = corpus.dataset_vocab(os.path.join('data', dataset))
if chars and vocab_size == defaults['vocab_size'] and init_from[:4] != 'gpt2':
    vocab_size = config['vocab_size'] = chars['vocab_size']
# out_dir writable, locked, not another run's; the checkpoint to resume
resume_from, saved = rundir.claim(config, rank)

# -----------------------------------------------------------------------------
# Devices and processes: every run has a process group, one rank or many.
device, compile, how = hardware.resolve(device, compile, local_rank)
device_type = device.split(':')[0]
# The watchdog ends this rank, naming the silent one, when no step
# completes for stall_timeout seconds (4× that at start-up and checkpoints).
watchdog = process_group.start(hardware.BACKENDS[device_type], device,
                               rank, world_size, stall_timeout)
master = rank == 0
log = functools.partial(print, flush=True) if master else lambda *a: None
log(f"{world_size} rank(s) on {device_type}, {how}; planning")
data = corpus.Batches(dataset, block_size, vocab_size, seed, device)
# Every rank runs the same run: a machine that joined with another config,
# code, torch or data leaves; the others go on without it.
fingerprint = membership.fingerprint(config, data.paths.values())
machines = gather(membership.machine())  # (elastic agents come and go)
prints = gather(fingerprint)
membership.same_run(prints, machines, rank, saved.get('fingerprint'))
rundir.same_data(resume_from, saved, fingerprint, log)  # its content

# -----------------------------------------------------------------------------
# The plan, for the ranks as they are, then the model built as it says
pretrained = init_from.startswith('gpt2')
if pretrained:
    raw_model = hf.from_pretrained(init_from, dropout=dropout)
    model_args = raw_model.config
else:
    model_args = config_from(config)
if model_args.block_size < block_size:
    die(f"block_size={block_size} exceeds the model's {model_args.block_size}")
stated = hardware.stated_memory(local_rank, device_type)  # HETGPT_MEM_GIB
host_bw = probe.host_step_rate(device_type)  # (before this_rank measures)
ranks = gather(hardware.this_rank(device_type, rank, local_world, stated,
                                  host_bw))
run_plan = search.make_plan(
    model_args, batch_size, ranks, plan=plan, micro_batch_size=micro_batch_size,
    memory_fraction=memory_fraction, dtype=dtype, weights=weights,
    init_device='cpu' if pretrained else init_device,
    outer_interval=outer_interval, knobs=config)
if not run_plan.fits:
    die(f"plan={plan} does not fit: {run_plan.advice}")
local = local_steps.LocalSteps(config, run_plan, rank, world_size, local_world)
# stall_timeout: above the plan's step
knobs.check_run(config, run_plan.step_time, local.exchange_seconds)
# The initial weights: a function of (seed, name) under every placement.
# 'cpu': the whole model on the host first; 'meta': each rank makes its shard.
torch.manual_seed(seed)
if not pretrained:
    with torch.device('meta'):
        raw_model = GPT(model_args)
    if run_plan.init_device == 'cpu':
        raw_model.materialise('cpu', seed, draw_on=device)
# each rank's compute dtype: its own under DDP (dtype=auto), one under FSDP
model, autocast = parallel.wrap(raw_model, run_plan, rank, world_size, device,
                                run_plan.dtypes[rank], compile, seed, local.group)
optimizers = optim.whole(make_optimizer(model, config))
base_lrs = [g['lr'] for g in optim.param_groups(optimizers)]
scaler = optim.scaler(device_type, run_plan.dtypes)
# each rank's measured speed, and the split of the batch it calls for
speed = Speed(device_type, rank, world_size, run_plan, out_dir,
              rebalance_interval, model, log, config)


def forward(split, offsets, weight):
    # (sum of token losses × weight, the sum). No offsets: one sequence × 0,
    # so that this rank still joins the collectives of a forward and backward.
    watchdog.progress()
    empty = len(offsets) == 0
    x, y = data.get(split, data.offsets(split, -1, 1) if empty else offsets)
    with autocast:
        _, loss = model(x, y, reduction='sum')
    return loss * (0.0 if empty else weight), loss.detach() * (not empty)


def forward_backward(offsets, sizes, weight, reduce=True):
    # This rank's micro-batches (sizes) of offsets; their loss sum. DDP reduces
    # after the last; FSDP after each if the plan says (unsharded: more memory).
    total, done = torch.zeros((), device=device), 0
    every = run_plan.reduce_every_micro_batch
    for i, size in enumerate(sizes):
        now = reduce and (i == len(sizes) - 1 or every)
        with parallel.sync(model, now):
            with speed.forward():
                loss, loss_sum = forward(
                    'train', offsets[done:done + size], weight)
            scaler.scale(loss).backward()
        total += loss_sum.float()
        done += size
    return total


def probe_step(sizes):  # a step that changes nothing: zero gradients, lr 0
    forward_backward(data.offsets('train', -1, sum(sizes)), sizes, 0.0)
    for opt in optimizers:
        opt.step()
        opt.zero_grad(set_to_none=True)


# The plan checked on the real device (hetgpt/run/probe.py), then the split by
# each rank's measured speed (balance=auto, no local steps)
by_speed = weights is None and world_size > 1 and not outer_interval
with optim.frozen(optimizers):
    caps, measured, probed = probe.fit_caps(
        run_plan, rank, probe_step, device_type, stated, log, compile, by_speed)
    if by_speed:
        offsets = data.offsets('train', -1, caps[rank])
        speed.measure(caps[rank], lambda sizes: forward_backward(
            offsets, sizes, 0.0, reduce=False))
run_plan = search.resplit(run_plan, caps, speed.c0, speed.c1)
log(run_plan.table(measured))
resumed = {}
local.begin(model)  # (local steps: the weights each round starts from)
if resume_from:
    resumed, took = checkpoint.load(resume_from, model, optimizers,
                                    model_args, local)
    joined = membership.membership(resumed.get('machines'), machines)
    log(f"resumed from {resume_from} ({took}) at iter {resumed['iter']}{joined}")
    optim.restore_scale(scaler, resumed.get('loss_scale'))  # (float16's)
iter_num = resumed.get('iter', 0)
best_val = resumed.get('best_val_loss')  # (nanoGPT's saving on a new best)
best_val = best_val if type(best_val) is float else math.inf
for note in knobs.notes(config, batch_size):
    log(note)  # (a schedule max_iters cuts short; nanoGPT's batch)
wandb_init = wandb_log and dict(project=wandb_project, name=wandb_run_name,
                                config=config)
first = {'iter': iter_num, **run_plan.record(probed)}  # the plan, as probed
record = metrics.Metrics(out_dir, iter_num, first, wandb_init, master)
mfu = MFU(replace(model_args, block_size=block_size), ranks, run_plan.dtypes)
tokens_per_step = batch_size * block_size


@torch.no_grad()
def validate(it, step_seconds):
    # The loss on the same validation sequences every time: logged, recorded,
    # returned (None when a signal stopped it: the checkpoint matters more).
    model.eval()
    offsets = data.offsets('val', -1, eval_iters * 8)
    expect = step_seconds * len(offsets) / batch_size / 3  # forward: 1/3
    if expect > 10:
        log(f"iter {it}: evaluating {len(offsets):,} sequences, about {expect:.0f} s")
    mine = np.array_split(offsets, world_size)[rank]
    count = torch.tensor(math.ceil(len(mine) / caps[rank]) or 1)  # (gloo)
    dist.all_reduce(count, op=dist.ReduceOp.MAX)  # as many on every rank
    total = torch.zeros((), device=device)
    for piece in np.array_split(mine, int(count)):
        if stop.agreed():
            model.train()
            return None
        total += forward('val', piece, 1.0)[1].float()
    model.train()
    dist.all_reduce(total)
    val = total.item() / (len(offsets) * block_size)
    log(f"iter {it}: val loss {val:.4f}")
    record({'iter': it, 'tokens': it * tokens_per_step, 'val_loss': val})
    return val


log(f"{raw_model.num_params(False):,} parameters; {world_size} rank(s) on "
    f"{device_type}, {how}; {tokens_per_step:,} tokens per step; "
    f"shares {run_plan.share}")
stop = signals.Signals(out_dir, watchdog)  # checkpoints at the step's end
dt = run_plan.step_time  # seconds per step: predicted, then measured
if iter_num == 0 or eval_only:
    val = validate(iter_num, dt)
    best_val = val if val is not None and iter_num == 0 else best_val

# -----------------------------------------------------------------------------
# The loop
sizes = run_plan.sizes  # every rank's (rebalanced as measured)
bad_steps = optim.BadSteps(device, max_bad_steps, out_dir, scaler,
                           resume_from)  # (and which checkpoints are good)
host_reset = hardware.reset_peaks(device_type)  # the steps' peaks from here
t_log, steps_since = time.perf_counter(), 0
status, pending = 0, False
loss_acc = torch.zeros((), device=device)
while iter_num < max_iters and not eval_only:
    torch.manual_seed(seed + 1_000_003 * iter_num + rank)  # (dropout)
    lr = knobs.lr_at(config, iter_num)
    optim.scale_lr(optimizers, base_lrs, lr / learning_rate)
    ran = sizes[rank]
    start = sum(map(sum, sizes[:rank]))
    offsets = data.offsets('train', iter_num, batch_size)[start:start + sum(ran)]
    speed.start(iter_num)
    # the loss: token losses / the batch's tokens (local steps: the node's), ×
    # the ranks DDP and FSDP average over: the gradient of the whole batch
    weight = local.weight(sizes, tokens_per_step)
    loss_acc += forward_backward(offsets, ran, weight)
    norm, bad = optim.step(model, optimizers, scaler, grad_clip)
    iter_num += 1
    steps_since += 1
    # (local steps, at a round's end: the outer step; whether it failed)
    bad_steps.add(bad, local.step(iter_num, sizes))
    sizes = speed.end(iter_num, sizes, caps)

    if iter_num % log_interval == 0 or iter_num == max_iters:
        bad_steps.report(iter_num, steps_since, log)
        dist.all_reduce(loss_acc)  # the whole batch's, not this rank's
        dt = (time.perf_counter() - t_log) / steps_since
        mem, reserved, host = hardware.peak_memory(device_type, host_reset)
        row = {'iter': iter_num, 'tokens': iter_num * tokens_per_step,
               'loss': loss_acc.item() / (steps_since * tokens_per_step),
               'lr': lr, 'grad_norm': norm.item(),  # (before clipping)
               'tokens_per_sec': tokens_per_step / dt,
               'mfu': mfu(batch_size, dt), 'mem_gib': mem,
               'reserved_gib': reserved, 'host_gib': host}
        log(metrics.line(row, duration(dt * (max_iters - iter_num))))
        record(row)
        speed.report(ran, mfu, row)
        t_log, steps_since = time.perf_counter(), 0
        loss_acc = torch.zeros((), device=device)
    t_pause = time.perf_counter()  # evaluations, checkpoints: not step time
    val = None
    if iter_num % eval_interval == 0 or iter_num == max_iters:
        val = validate(iter_num, dt)
    stopping = stop.agreed()
    last = iter_num == max_iters
    if always_save_checkpoint:
        due = checkpoint_interval and (iter_num % checkpoint_interval == 0
                                       or last)
    else:  # nanoGPT's: when an evaluation lowers the best val loss
        due = val is not None and val < best_val
    best_val = min(best_val, math.inf if val is None else val)
    due = due or stopping
    wanted = due or pending  # (pending: one refused at an earlier step)
    # only weights a completed step left finite; else after the next step
    pending = wanted and not bad_steps.may_save(model, iter_num, due, log)
    if wanted and not pending:
        watchdog.progress(limit_factor=4)
        meta = {'model_args': vars(model_args), 'config': config,
                'machines': machines, 'fingerprint': fingerprint,
                'best_val_loss': None if best_val == math.inf else best_val,
                'loss_scale': scaler.get_scale() if scaler.is_enabled() else None}
        path, took = checkpoint.save(out_dir, iter_num, model, optimizers, meta,
                                     keep_last, local, keep=bad_steps.good)
        bad_steps.saved(path)
        log(f"iter {iter_num}: checkpoint written to {path} ({took})")
    if stopping:  # (a signal, or torchrun's agent gone: an error)
        status = stop.said(iter_num, log, saved=not pending)
        break
    t_log += time.perf_counter() - t_pause
    watchdog.progress(limit_factor=1)

record.finish()
end(status)  # (hetgpt/errors.py: without the interpreter's teardown)
