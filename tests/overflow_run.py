"""Run by torchrun (tests/test_dtypes.py): two ranks, each in the compute dtype argv[2] gives it
(e.g. float16,float32), under the plan argv[1], wrapped and stepped as train.py does (parallel.wrap,
optim.scaler, optim.step). Step 1 overflows on one rank only: rank 1's loss (ddp), or one element of
rank 0's gradient shard (fsdp: each rank checks only its own shard). Prints, per
step, whether it was skipped, the loss scale after it, and a digest of the full weights, to
argv[3]/rank<N> (the ranks' output would interleave on one pipe)."""
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from hetgpt import errors  # noqa: E402
from hetgpt.planner import search  # noqa: E402
from hetgpt.run import optim, parallel  # noqa: E402
from model import GPT, GPTConfig, make_optimizer  # noqa: E402

strategy, dtypes, out = sys.argv[1:4]
errors.last_at_exit()  # ends as train.py does, without the interpreter's teardown (errors.py)
dist.init_process_group('gloo')
errors.skip_teardown()
rank, world = dist.get_rank(), dist.get_world_size()
cfg = GPTConfig(block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=32, dropout=0.0,
                bias=False)
ranks = [dict(device='cpu', mem=2**30, overhead=0)] * world
plan = search.make_plan(cfg, 2 * world, ranks, plan=strategy, dtype=dtypes)
with torch.device('meta'):
    raw = GPT(cfg)
raw.materialise('cpu', 0)
model, autocast = parallel.wrap(raw, plan, rank, world, 'cpu', plan.dtypes[rank], False, 0)
optimizers = make_optimizer(model, dict(weight_decay=0.1, learning_rate=1e-3, beta1=0.9,
                                        beta2=0.95, adam_eps=1e-8))
scaler = optim.scaler('cpu', plan.dtypes)
g = torch.Generator().manual_seed(rank)
full = lambda p: p.full_tensor() if hasattr(p, 'full_tensor') else p
for it in range(3):
    x = torch.randint(0, 64, (2, 16), generator=g)
    with autocast:
        _, loss = model(x, x)
    if it == 1 and rank == 1 and not plan.shard:
        loss = loss * float('inf')  # (DDP sums it into every rank's gradient)
    scaler.scale(loss).backward()
    if it == 1 and rank == 0 and plan.shard:  # one element of this rank's shard only
        p = next(model.parameters())
        p.grad.to_local().view(-1)[0] = float('inf')
    norm, bad = optim.step(model, optimizers, scaler, 1.0)
    digest = sum(full(p.detach()).double().abs().sum().item() for p in model.parameters())
    with open(os.path.join(out, f'rank{rank}'), 'a') as f:
        f.write(f"rank {rank} it {it} dtype {plan.dtypes[rank]} skipped {bool(bad)} "
                f"scale {scaler.get_scale()} weights {digest:.10e}\n")
dist.destroy_process_group()
errors.end(0)
