"""
The planner's memory prediction (memory.estimate) against PyTorch's own memory trackers, on fake
tensors (FakeTensorMode: shapes only, nothing allocated, no GPU needed). For each config, strategy
and micro-batch, one rank of 8 runs a training step as train.py does: two micro-batches (forward
with model(x, y, reduction='sum'), backward), clip_grad_norm_, make_optimizer's AdamW step,
zero_grad(set_to_none=True). An untracked step on zero gradients before it makes AdamW's state, so
that the step tracked holds it, as every step but the first does; from the second micro-batch on
the gradients of the first are held, as in every plan that accumulates (--accum=1: without).
The peak of the live tensor bytes is compared with the prediction:

  OMP_NUM_THREADS=2 .venv/bin/python bench/memtracker.py
  OMP_NUM_THREADS=2 .venv/bin/python bench/memtracker.py configs/gpt_1p3b.py --strategies fsdp \
      --micro_batches plan,1,2

FSDP: FSDPMemTracker, FSDP2 fully_shard per block then the root (bf16 params, fp32 reduce), on a
fake process group of 8 ranks. DDP: MemTracker on the bare model under bf16 autocast with fp32
weights (DDP's C++ reducer cannot run on fake tensors); DDP's gradient buckets
(gradient_as_bucket_view=True: the buckets are the gradients, and stay allocated when zero_grad
drops the views) are stood in for by one flat fp32 buffer that the gradients are views of.
Predicted: memory.estimate(..., overhead=0): without the CUDA context, cuBLAS workspace and NCCL
buffers, which no tensor tracker sees; it does include the planner's 5% allocator slack
(ALLOC_SLACK), which a tracker of live tensors has no counterpart for either ('-slack' column).
Micro-batch 'plan': search.make_plan's largest micro-batch for that strategy on 8×A100-80GB.
Not part of `make test`.

What fake tensors on a CPU-only torch cannot show (printed under the table as well): the fake
tensors are CPU tensors (fake CUDA ones cannot run backward without a GPU), so the ops are CPU
autocast's and CPU SDPA's (the planner measures its activations the same way); kernels' internal
workspaces (cuBLAS, flash attention's backward) are not tensors the trackers see; the blocks run
eager, while train.py compiles them by default.
"""
import argparse
import functools
import hashlib
import os
import sys
import time
from contextlib import nullcontext

import torch
import torch.distributed as dist

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import model as network  # noqa: E402
from hetgpt import hardware, knobs  # noqa: E402
from hetgpt.planner import costs, memory, search  # noqa: E402
import plan  # noqa: E402
from hetgpt.knobs import configure, defaults_of  # noqa: E402
from model import GPT, config_from  # noqa: E402

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker  # noqa: E402
from torch.distributed._tools.mem_tracker import MemTracker  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # noqa: E402
from torch.distributed.tensor._sharding_prop import ShardingPropagator  # noqa: E402
from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402
from torch.utils._python_dispatch import _disable_current_modes  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

GiB = 2**30
WORLD = 8
GPUS = f'{WORLD}xA100-80GB'
# Fake CUDA tensors cannot run backward without a GPU (the autograd engine asks the driver for a
# device), so the fake tensors live on the CPU. The loss then chunks its logits as on a GPU
# (fake_model: the model's loss_chunks).
DEVICE = 'cpu'
# DTensor works out an op's output shape by running it on global-shape tensors in the active fake
# mode (else in a new one). A tracker entered in our fake mode counts them (torch 2.11's counts
# those of any mode): the optimizer step on DTensor shards would seem to hold a full unsharded copy
# of every parameter, gradient and state. So that work runs with every mode set aside (tracker and
# fake mode), in a fake mode of its own, as it does outside FakeTensorMode.
_propagate = ShardingPropagator._propagate_tensor_meta_non_cached


def _propagate_untracked(self, op_schema):
    with _disable_current_modes():
        return _propagate(self, op_schema)


ShardingPropagator._propagate_tensor_meta_non_cached = _propagate_untracked
# The trackers' reference types -> the columns printed (FSDPMemTracker's names, MemTracker's)
COLUMNS = dict(params=('Sharded Param', 'Parameter'), grads=('Sharded Grad', 'Gradient'),
               optim=('OptState', 'Optstate'), act=('Activation',), temp=('Temp',),
               buffers=('Unsharded Param', 'Unsharded Grad', 'All Gather', 'Reduce Scatter'),
               other=('Buffer', 'Other', 'Inputs'))


def load(path):
    # as plan.py's main: the config file over train.py's defaults
    defaults = {k: v for k, v in defaults_of(knobs.TRAIN_PY).items() if k in plan.KNOBS}
    config = configure(defaults, [path], strict_files=False)
    return config_from(config), config['batch_size']


def fake_model(cfg):
    # The model built on the meta device (no weights), then each parameter made a fake tensor;
    # tied parameters stay tied. (Module.to_empty cannot swap meta parameters for fake ones.)
    with torch.device('meta'):
        model = GPT(cfg)
    model.loss_chunks = network.LOSS_CHUNK['cuda']
    made = {}
    for m in model.modules():
        for name, p in m._parameters.items():
            if p is not None:
                if id(p) not in made:
                    t = torch.empty(p.shape, dtype=p.dtype, device=DEVICE)
                    made[id(p)] = torch.nn.Parameter(t)
                m._parameters[name] = made[id(p)]
    return model


def track(cfg, strategy, micro_batch, accum, mesh):
    # A training step on fake tensors under the tracker: its peak and the breakdown there, and
    # the phase in which the peak was reached.
    f = knobs.flags(strategy)
    with FakeTensorMode():
        model = fake_model(cfg)
        if f['ac']:  # as train.py: non-reentrant checkpointing of each block
            for block in model.transformer.h:
                block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)
        autocast, buckets, where = nullcontext(), None, None
        if f['shard']:
            kw = dict(mesh=mesh, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                                 reduce_dtype=torch.float32))
            for block in model.transformer.h:
                fully_shard(block, reshard_after_forward=f['reshard_after_forward'], **kw)
            fully_shard(model, **kw)
        else:
            # as train.py: no cache of the weights' copies
            autocast = torch.autocast(DEVICE, dtype=torch.bfloat16, cache_enabled=False)
            params = list(model.parameters())
            buckets = torch.zeros(sum(p.numel() for p in params), device=DEVICE)
            views, i = [], 0
            for p in params:
                views.append(buckets[i:i + p.numel()].view(p.shape))
                i += p.numel()
        optimizer, = network.make_optimizer(model, costs.train_knobs())  # (AdamW: one)
        # AdamW's state, as at every step but the first: one step on zero gradients before the
        # tracker starts (it counts the state it finds). DDP's gradients: views of the buckets.
        for i, p in enumerate(model.parameters()):
            p.grad = views[i] if buckets is not None else torch.zeros_like(p)
        optimizer.step()
        optimizer.zero_grad(set_to_none=buckets is None)
        x = torch.zeros(micro_batch, cfg.block_size, dtype=torch.long, device=DEVICE)
        y = torch.zeros_like(x)
        tracker = FSDPMemTracker(model, optimizer) if f['shard'] else MemTracker()
        if f['shard']:
            tracker.track_inputs((x, y))
        else:
            tracker.track_external(model, optimizer, buckets, x, y)
        peak = 0

        def mark(phase):  # the phase in which the peak was reached
            nonlocal peak, where
            now = tracker.get_tracker_snapshot('peak')[torch.device(DEVICE)]['Total']
            if now > peak:
                peak, where = now, phase

        # One step of `accum` micro-batches: from the second on, the gradients of the earlier
        # ones are held (FSDP reduce-scatters after each one, as the plan does by default).
        with tracker:
            for i in range(1, accum + 1):
                with autocast:
                    _, loss = model(x, y, reduction='sum')
                mark(f"forward {i}")
                loss.backward()
                del loss
                mark(f"backward {i}")
                tracker.reset_mod_stats()  # else the tracker refuses a second forward
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            mark("optimizer")
        snap = tracker.get_tracker_snapshot('peak')[torch.device(DEVICE)]
    names = {str(getattr(k, 'value', k)): v for k, v in snap.items()}
    parts = {c: sum(names.get(n, 0) for n in ns) for c, ns in COLUMNS.items()}
    known = {n for ns in COLUMNS.values() for n in ns} | {'Total'}
    assert set(names) <= known, f"tracker types not in COLUMNS: {set(names) - known}"
    assert sum(parts.values()) == snap['Total']
    adamw = 'fused' if optimizer.defaults.get('fused') else 'foreach'
    return dict(parts, total=snap['Total'], where=where, adamw=adamw)


def predict(cfg, strategy, micro_batch):
    # memory.estimate without the per-process overhead; its 'other' split back into the buffers
    # (DDP: autocast's 16-bit weight copies; FSDP: unsharded params/grads) and the slack
    e = memory.estimate(cfg, strategy, micro_batch, WORLD, 'bfloat16', overhead=0, device='cuda')
    s = memory.ALLOC_SLACK
    buffers = (e['other'] - s * e['activations']) / (1 + s)
    return dict(params=e['params'], grads=e['grads'], optim=e['optim'], act=e['activations'],
                temp=None, buffers=buffers, other=e['other'] - buffers, total=e['total'])


def main():
    t0 = time.time()
    with open(memory.__file__, 'rb') as f:  # memory.py changes: which one made these predictions
        digest = hashlib.sha1(f.read()).hexdigest()[:10]
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument('configs', nargs='*', default=['configs/gpt_1p3b.py', 'configs/gpt_13b.py'])
    ap.add_argument('--strategies', default='ddp,ddp+ac,fsdp,fsdp+ac')
    ap.add_argument('--micro_batches', default='plan,2',
                    help="comma-separated; 'plan': the planner's largest on " + GPUS)
    ap.add_argument('--accum', type=int, default=2, help="micro-batches in the step tracked")
    args = ap.parse_args()
    # one fake process group of WORLD ranks for every FSDP run; the mesh is made outside fake mode
    dist.init_process_group('fake', store=FakeStore(), rank=0, world_size=WORLD)
    mesh = init_device_mesh(DEVICE, (WORLD,))
    ranks = plan._cluster(GPUS, 0, None)
    g = lambda v: '-' if v is None else f"{v / GiB:.2f}"
    rows, detail, adamw = [], [], set()
    for path in args.configs:
        cfg, batch = load(path if os.path.exists(path) else os.path.join(ROOT, path))
        name = os.path.basename(path).removesuffix('.py')
        for strategy in args.strategies.split(','):
            cap = search.make_plan(cfg, batch, ranks, plan=strategy).caps[0]
            sizes = []
            for m in args.micro_batches.split(','):
                b = (cap or None) if m == 'plan' else int(m)
                if b and b not in sizes:
                    sizes.append(b)
            if 'plan' in args.micro_batches and not cap:
                sizes = sizes or [1]
            for b in sizes:
                t = time.time()
                pred, meas = predict(cfg, strategy, b), track(cfg, strategy, b, args.accum, mesh)
                adamw.add(meas['adamw'])
                tag = f"{b}{' (plan)' if b == cap else ''}{' (no fit)' if not cap else ''}"
                rows.append(f"| {name} | {strategy} | {tag} | {g(pred['total'])} | "
                            f"{g(meas['total'])} | {pred['total'] / meas['total']:.3f} | "
                            f"{(pred['total'] - pred['other']) / meas['total']:.3f} | "
                            f"{meas['where']} | {time.time() - t:.0f} |")
                for kind, d in (('pred', pred), ('tracked', meas)):
                    detail.append(f"| {name} | {strategy} | {b} | {kind} | "
                                  + ' | '.join(g(d[c]) for c in COLUMNS) + f" | {g(d['total'])} |")
                print(rows[-1], file=sys.stderr, flush=True)  # progress
    print("\nGiB per rank (of 8); ratio = predicted / tracked; -slack: predicted less the "
          f"planner's {memory.ALLOC_SLACK:.0%} allocator slack\n")
    print("| config | strategy | micro-batch | predicted | tracked | ratio | ratio -slack "
          "| tracked peak in | s |\n|---|---|---|---|---|---|---|---|---|")
    print('\n'.join(rows))
    print("\nBreakdown at the tracked peak, GiB. pred: memory.estimate's terms (act: activations "
          "incl. the loss's logits working set; buffers: DDP's autocast weight copies, FSDP's "
          "unsharded params and grads; other: the slack). tracked: the tracker's types (act: "
          "Activation, which holds DDP's autocast weight copies; buffers: Unsharded Param/Grad, "
          "All Gather, Reduce Scatter; other: Buffer, Other, Inputs)\n")
    print("| config | strategy | mb | | " + ' | '.join(COLUMNS) + " | total |\n|"
          + "---|" * (5 + len(COLUMNS)))
    print('\n'.join(detail))
    print("\nNot seen here: the CUDA context, cuBLAS/NCCL workspaces and allocator fragmentation "
          "(the planner's overhead, left out, and slack); kernels' internal workspaces; "
          "torch.compile (the blocks run eager). Fake tensors on the CPU: CPU autocast and "
          "SDPA's CPU kernel stand in for CUDA's. DDP: the bare model plus a flat fp32 buffer as "
          "its gradient buckets (no DDP reducer on fake tensors).")
    print(f"\ntorch {torch.__version__}, AdamW {'/'.join(sorted(adamw))}, memory.py sha1 {digest}, "
          f"{time.time() - t0:.0f} s wall, peak RSS {hardware.peak_rss() / GiB:.2f} GiB")
    dist.destroy_process_group()


if __name__ == '__main__':
    main()
