"""
The planner's clock (hetgpt/planner/timing.py) against this GPU: every matmul shape and attention kernel
of one micro-batch of the model, as the planner records them (costs.work), timed on the device,
beside the seconds the clock gives each at its published rate; and a streaming copy, the rate the
clock gives every other kernel's bytes. One JSON line at the end: per kind, predicted and measured
seconds of the micro-batch, and their ratio.

  python bench/kernel_rates.py configs/gpt_1p3b.py                # on a GPU: its plan's micro-batch
  python bench/kernel_rates.py configs/gpt_1p3b.py --micro=8 --budget=20
  python bench/kernel_rates.py configs/gpt_tiny.py --device=cpu   # the same walk on the CPU

The micro-batch, strategy and activation checkpointing are the planner's for one of this GPU
(--micro overrides the micro-batch). Each shape runs until it has taken about 20 ms (at least 3
times, after one warm-up), so that the whole walk ends inside --budget seconds (default 30): the
shapes that take the most predicted time go first, and those left when the budget is spent are
counted at their predicted time and said. On the CPU (--device=cpu) the predictions are still a
GPU's (--gpu, default H200): the walk is checked, not the rates. bench/gpu_check.py runs this.
"""
import argparse
import json
import math
import os
import sys
import time
from dataclasses import fields

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from hetgpt import gpus  # noqa: E402
from hetgpt.errors import die  # noqa: E402
from hetgpt.knobs import configure  # noqa: E402
from hetgpt.planner import costs, search, timing  # noqa: E402
from model import GPTConfig, config_from  # noqa: E402

DTYPES = {'bfloat16': torch.bfloat16, 'float16': torch.float16, 'float32': torch.float32}
SHAPE_S = 0.02   # seconds each shape is timed for, about
COPY_BYTES = 2**30  # the streaming copy's buffer (read and written: twice this moved)


def timer(device):
    # seconds of fn() run n times, after the device has finished what it had
    def run(fn, n):
        if device == 'cuda':
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            for _ in range(n):
                fn()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) / 1e3
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return time.perf_counter() - t0
    return run


def seconds_each(fn, run):
    # one call's seconds: one warm-up, then as many calls as fill SHAPE_S (at least 3)
    first = run(fn, 1)
    n = max(3, min(1000, math.ceil(SHAPE_S / max(first, 1e-6))))
    return run(fn, n) / n


def matmul_fn(b, m, n, k, dtype, device):
    x = torch.randn(b, m, k, dtype=dtype, device=device)
    y = torch.randn(b, k, n, dtype=dtype, device=device)
    if b == 1:
        x, y = x[0], y[0]
        return lambda: torch.mm(x, y)
    return lambda: torch.bmm(x, y)


def attention_fns(batch, heads, q, kv, head_dim, causal, dtype, device):
    # the forward alone, and forward + backward (the backward: their difference)
    make = lambda n: torch.randn(batch, heads, n, head_dim, dtype=dtype, device=device,
                                 requires_grad=True)
    xq, xk, xv = make(q), make(kv), make(kv)
    grad = torch.randn(batch, heads, q, head_dim, dtype=dtype, device=device)
    fwd = lambda: F.scaled_dot_product_attention(xq, xk, xv, is_causal=causal)

    def both():
        out = fwd()
        torch.autograd.grad(out, (xq, xk, xv), grad)
    return fwd, both


def plan_of(cfg, gpu, micro):
    # the planner's strategy, micro-batch and checkpointing for one of this GPU
    p = search.make_plan(cfg, max(micro, 1) * 8 if micro else 64,
                          [dict(device='cuda', gpu=gpu)], micro_batch_size=micro)
    return p.strategy, p.caps[0] or 1, p.ac[0], p.dtypes[0], p.fits


def walk(cfg, gpu, device, micro, strategy, ac, dtype, budget):
    # every matmul and attention kernel of one micro-batch (largest predicted time first), timed
    # until the budget is spent; the rest counted at their predicted seconds
    run, t_end = timer(device), time.time() + budget
    w = costs.work(cfg, micro, strategy, dtype, ac)
    todo = [('matmuls', key, count, timing.matmul_seconds(gpu, dtype, *key[:4]))
            for key, count in w['matmuls'].items()]
    todo += [('attention', key, count, timing.attention_seconds(gpu, dtype, *key[:7]))
             for key, count in w['attention'].items()]
    todo.sort(key=lambda t: -t[2] * t[3])
    kinds = {k: dict(predicted=0.0, measured=0.0, timed=0, untimed=0) for k in
             ('matmuls', 'attention', 'memory')}
    rows, fwd_seconds = [], {}
    torch_dtype = DTYPES[dtype]
    for kind, key, count, predicted in todo:
        k = kinds[kind]
        k['predicted'] += count * predicted
        if time.time() > t_end:
            k['measured'] += count * predicted
            k['untimed'] += 1
            continue
        if kind == 'matmuls':
            measured = seconds_each(matmul_fn(*key[:4], torch_dtype, device), run)
        else:
            batch, heads, q, kv, head_dim, causal, backward = key[:7]
            fwd, both = attention_fns(batch, heads, q, kv, head_dim, causal, torch_dtype, device)
            at = key[:6]
            if at not in fwd_seconds:
                fwd_seconds[at] = seconds_each(fwd, run)
            measured = fwd_seconds[at] if not backward else \
                max(seconds_each(both, run) - fwd_seconds[at], 0.0)
        if device == 'cuda':
            torch.cuda.empty_cache()
        k['measured'] += count * measured
        k['timed'] += 1
        rows.append(dict(kind=kind, shape=list(key[:-1]), count=count, predicted=predicted,
                         measured=measured))
    # every other kernel: its bytes at the rate of a streaming copy (read and write)
    n = COPY_BYTES // 4 if device == 'cuda' else COPY_BYTES // 64
    src = torch.empty(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    copy = seconds_each(lambda: dst.copy_(src), run)
    rate = 2 * src.numel() * 4 / copy
    kinds['memory'].update(predicted=timing.memory_seconds(gpu, w['bytes']),
                           measured=w['bytes'] / rate, timed=1, bytes=w['bytes'],
                           copy_gbs=rate / 1e9)
    for k in kinds.values():
        k['ratio'] = k['measured'] / k['predicted'] if k['predicted'] else None
    return kinds, rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('config', nargs='+', help="configs/*.py and --key=value model knobs")
    ap.add_argument('--device', default='cuda', choices=('cuda', 'cpu'))
    ap.add_argument('--gpu', default=None, help="the GPU table's row to predict for "
                    "(default: this GPU's; on the CPU H200)")
    ap.add_argument('--micro', type=int, default=0, help="micro-batch (default: the plan's)")
    ap.add_argument('--budget', type=float, default=30.0, help="seconds for the whole walk")
    a, rest = ap.parse_known_args(argv)
    if a.device == 'cuda' and not torch.cuda.is_available():
        die("no CUDA GPU here: run it on the GPU host, or with --device=cpu")
    if a.micro < 0 or not 0 < a.budget < math.inf:
        die("--micro must be >= 0 and --budget a number of seconds > 0")
    defaults = {f.name: f.default for f in fields(GPTConfig)}
    cfg = config_from(configure(defaults, a.config + rest, strict_files=False))
    name = torch.cuda.get_device_name() if a.device == 'cuda' else None
    gpu = gpus.gpu_key(a.gpu or name) or 'H200'
    t0 = time.time()
    strategy, micro, ac, dtype, fits = plan_of(cfg, gpu, a.micro)
    micro = a.micro or micro
    planned = time.time() - t0
    kinds, rows = walk(cfg, gpu, a.device, micro, strategy, ac, dtype,
                       max(1.0, a.budget - planned))
    for r in sorted(rows, key=lambda r: -r['count'] * r['predicted']):
        print(f"{r['kind']:<9} {str(r['shape']):<44} ×{r['count']:<4} predicted "
              f"{r['predicted'] * 1e6:9.1f} us  measured {r['measured'] * 1e6:9.1f} us  "
              f"{r['measured'] / r['predicted']:5.2f}×")
    tokens = micro * cfg.block_size
    pred, meas = (sum(k[x] for k in kinds.values()) for x in ('predicted', 'measured'))
    out = dict(device=name or 'cpu', gpu=gpu, torch=torch.__version__, strategy=strategy,
               ac=ac, dtype=dtype, micro=micro, block_size=cfg.block_size, fits=fits,
               kinds=kinds, predicted_s=pred, measured_s=meas,
               predicted_tokens_per_sec=tokens / pred, measured_tokens_per_sec=tokens / meas,
               wall=time.time() - t0)
    print(f"one micro-batch of {micro} × {cfg.block_size} ({strategy}"
          f"{', ac' if ac else ''}, {dtype}) on {name or 'the CPU'}, predicted as {gpu}: "
          + '; '.join(f"{k} {v['predicted'] * 1e3:.2f} ms predicted, {v['measured'] * 1e3:.2f} "
                      f"measured ({v['ratio']:.2f}×)" for k, v in kinds.items() if v['predicted']))
    print(json.dumps(out))
    return out


if __name__ == '__main__':
    main()
