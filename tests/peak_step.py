"""
Peak memory of one real training step on the CPU against the planner's prediction, for
tests/test_plan_measured.py. Run in a fresh process, which sets glibc's allocator as train.py does
on a rank near its memory (planner.plan.Plan.frees_host_memory; hardware.return_freed_host_memory:
freed tensors go back to the OS, so that the resident set follows the live tensors).
usage: python tests/peak_step.py STRATEGY MICRO_BATCH VARIANT [KEY=VALUE ...]  (prints predicted,
measured bytes). VARIANT: one of test_plan_measured's, or as-is (model.py as it is: an edited copy's,
tests/test_modern_block.py); KEY=VALUE: the model's shape, over the default below, or steps=N (2)
and allocator=glibc (glibc's own, as a rank with room for its slack runs: bench/glibc_slack.py).
"""
import ast
import functools
import json
import os
import sys

import torch
from torch.utils.checkpoint import checkpoint

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hetgpt import hardware  # noqa: E402
import model  # noqa: E402
from hetgpt.planner import costs, memory  # noqa: E402

strategy, b, variant = sys.argv[1], int(sys.argv[2]), sys.argv[3]
extra = dict(a.split('=', 1) for a in sys.argv[4:])
steps = int(extra.pop('steps', 2))  # (the second holds the optimizer state the first made)
if extra.pop('allocator', None) != 'glibc' and not hardware.return_freed_host_memory():
    sys.exit("peak_step.py: no glibc mallopt here: the resident set would not follow live bytes")
if variant != 'as-is':
    from test_plan_measured import VARIANTS
    for name, cls in VARIANTS[variant].items():
        setattr(model, name, cls)
torch.set_num_threads(1)
shape = dict(n_layer=4, n_head=4, n_embd=256, block_size=256, vocab_size=8192, bias=False)
shape.update((k, ast.literal_eval(v)) for k, v in extra.items())
cfg = model.config_from(shape)  # (its fields: an edited model.py may have no bias)


def status(key):  # bytes, from the kernel's account of this process
    return next(int(line.split()[1]) * 1024 for line in open('/proc/self/status')
                if line.startswith(key))


def build(config):
    net = model.GPT(config)
    if strategy.endswith('+ac'):  # as train.py applies it
        for block in net.transformer.h:
            block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)
    return net


def step(net, optimizer, idx):
    net(idx, idx, reduction='sum')[1].backward()
    torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
    for opt in optimizer:
        opt.step()
        opt.zero_grad(set_to_none=True)


predicted = memory.estimate(cfg, strategy, b, 1, dtype='float32', device='cpu', overhead=0,
                          micro_batches=1)['total']
torch.manual_seed(0)
idx = torch.randint(0, cfg.vocab_size, (b, cfg.block_size))
tiny = build(model.config_from({**shape, 'n_layer': 1, 'n_embd': 32}))
step(tiny, model.make_optimizer(tiny, costs.train_knobs()), idx[:1])  # the kernels' own first allocations
del tiny
base = status('VmRSS')
open('/proc/self/clear_refs', 'w').write('5')  # resets the peak (VmHWM) to the current RSS
net = build(cfg)
optimizer = model.make_optimizer(net, costs.train_knobs())
peaks = []
for _ in range(steps):
    step(net, optimizer, idx)
    peaks.append(status('VmHWM') - base)
print(json.dumps({'predicted': predicted, 'measured': peaks[-1], 'peaks': peaks}))
