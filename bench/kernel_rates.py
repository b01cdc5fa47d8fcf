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
(--micro overrides the micro-batch). Each kernel is timed twice, as MAMF and as MSMF (Maximum
Sustained Matmul FLOPS, stas00/ml-engineering: a clock settled under the GPU's power and thermal
limits, not a burst):
  burst      every shape as the walk always did: about 20 ms (at least 3 calls, after one warm-up),
             the shapes that take the most predicted time first; those left when a third of
             --budget is spent are counted at their predicted time and said;
  settle     then the matmul of the most predicted time in a loop, in windows of --window / 4
             seconds, until two windows in a row are within 2% of each other's rate (at most
             5 × --window seconds);
  sustained  then the shapes that carry the most predicted time, each over one window of at least
             --window seconds (default 2 on a GPU), until they carry 90% of the predicted kernel
             time or the budget is spent (a window's time kept for the copy); the rest count at
             their burst seconds. The streaming copy is timed both ways too.
Each kind's "measured" is the sustained walk's seconds and "burst" the burst walk's; "big" is
that matmul's sustained and burst TFLOP/s and their ratio (MSMF / MAMF: 0.84-0.88 published).
On the CPU (--device=cpu) the predictions are still a GPU's (--gpu, default H200) and the window
tiny (0.05 s): the walk is checked, not the rates. bench/gpu_check.py runs this.
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
SHAPE_S = 0.02   # seconds each shape's burst is timed for, about
WINDOW_S = {'cuda': 2.0, 'cpu': 0.05}  # a sustained window, by default
SETTLED = 0.02  # two settling windows this close in rate: the clock settled
COVER = 0.9  # of the predicted kernel time: sustained shapes enough
BURST_SHARE = 1 / 3  # of the budget: for the burst walk, at most
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


def seconds_each(fn, run, span=SHAPE_S):
    # one call's seconds: one warm-up, then as many calls as fill span seconds (at least 3)
    first = run(fn, 1)
    n = max(3, math.ceil(span / max(first, 1e-6)))
    if span == SHAPE_S:
        n = min(1000, n)
    return run(fn, n) / n


def settle(fn, run, window):
    # fn in a loop, in windows of window / 4 seconds, until two windows in a row are within
    # SETTLED of each other's rate, or 5 windows' seconds have passed: (seconds, settled)
    t0, last = time.time(), None
    while time.time() - t0 < 5 * window:
        now = seconds_each(fn, run, window / 4)
        if last and abs(now - last) <= SETTLED * last:
            return time.time() - t0, True
        last = now
    return time.time() - t0, False


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


def time_shape(kind, key, dtype, device, run, span, fwd):
    # one call's seconds of a shape, each timed over span seconds; an attention's backward: its
    # forward and backward less its forward (fwd: the forwards timed so far, by shape)
    if kind == 'matmuls':
        seconds = seconds_each(matmul_fn(*key[:4], dtype, device), run, span)
    else:
        batch, heads, q, kv, head_dim, causal, backward = key[:7]
        forward, both = attention_fns(batch, heads, q, kv, head_dim, causal, dtype, device)
        if key[:6] not in fwd:
            fwd[key[:6]] = seconds_each(forward, run, span)
        seconds = fwd[key[:6]]
        if backward:
            seconds = max(seconds_each(both, run, span) - seconds, 0.0)
    if device == 'cuda':
        torch.cuda.empty_cache()
    return seconds


def copy_rate(device, run, span):
    # bytes/s of a streaming copy (read and written), timed over span seconds
    n = COPY_BYTES // 4 if device == 'cuda' else COPY_BYTES // 64
    src = torch.empty(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    return 2 * src.numel() * 4 / seconds_each(lambda: dst.copy_(src), run, span)


def walk(cfg, gpu, device, micro, strategy, ac, dtype, budget, window):
    # every matmul and attention kernel of one micro-batch (largest predicted time first): the
    # burst walk, the clock settled, the sustained walk (the module's docstring says how)
    run, t0 = timer(device), time.time()
    t_end = t0 + budget
    w = costs.work(cfg, micro, strategy, dtype, ac)
    todo = [('matmuls', key, count, timing.matmul_seconds(gpu, dtype, *key[:4]))
            for key, count in w['matmuls'].items()]
    todo += [('attention', key, count, timing.attention_seconds(gpu, dtype, *key[:7]))
             for key, count in w['attention'].items()]
    todo.sort(key=lambda t: -t[2] * t[3])
    rows, fwd, torch_dtype = [], {}, DTYPES[dtype]
    for kind, key, count, predicted in todo:  # the burst walk
        burst = None
        if time.time() < t0 + BURST_SHARE * budget:
            burst = time_shape(kind, key, torch_dtype, device, run, SHAPE_S, fwd)
        rows.append(dict(kind=kind, shape=list(key[:-1]), count=count, predicted=predicted,
                         burst=burst, sustained=None))
    burst_rate = copy_rate(device, run, SHAPE_S)
    # the clock settled on the matmul that carries the most predicted time
    big = next(r for r in rows if r['kind'] == 'matmuls')
    shape = big['shape'][:4]
    settle_s, settled = settle(matmul_fn(*shape, torch_dtype, device), run, window)
    total = sum(r['count'] * r['predicted'] for r in rows)
    covered, fwd = 0.0, {}
    for (kind, key, count, predicted), r in zip(todo, rows):  # the sustained walk
        if covered >= COVER * total or time.time() + 3 * window > t_end:
            break
        r['sustained'] = time_shape(kind, key, torch_dtype, device, run, window, fwd)
        covered += count * predicted
    rate = copy_rate(device, run, window)
    kinds = {k: dict(predicted=0.0, burst=0.0, measured=0.0, timed=0, sustained=0, untimed=0)
             for k in ('matmuls', 'attention')}
    for r in rows:  # a shape not timed: its burst's seconds, else its predicted
        k = kinds[r['kind']]
        burst = r['burst']
        if burst is None:
            burst = r['predicted']
            k['untimed'] += 1
        measured = r['sustained']
        if measured is None:
            measured = burst
        else:
            k['sustained'] += 1
        k['timed'] += r['burst'] is not None
        k['predicted'] += r['count'] * r['predicted']
        k['burst'] += r['count'] * burst
        k['measured'] += r['count'] * measured
    # every other kernel: its bytes at the rate of a streaming copy (read and write)
    kinds['memory'] = dict(predicted=timing.memory_seconds(gpu, w['bytes']),
                           burst=w['bytes'] / burst_rate, measured=w['bytes'] / rate,
                           timed=1, sustained=1, untimed=0, bytes=w['bytes'],
                           copy_gbs=rate / 1e9, copy_burst_gbs=burst_rate / 1e9)
    for k in kinds.values():
        k['ratio'] = k['measured'] / k['predicted'] if k['predicted'] else None
    flops = 2 * math.prod(shape)
    tflops = lambda s: s and flops / s / 1e12
    ratio = None
    if big['sustained'] and big['burst']:
        ratio = big['burst'] / big['sustained']
    sustained = dict(window=window, settle_s=settle_s, settled=settled,
                     share=covered / total, big=dict(shape=big['shape'],
                     tflops=tflops(big['sustained']), burst_tflops=tflops(big['burst']),
                     ratio=ratio))
    return kinds, rows, sustained


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('config', nargs='+', help="configs/*.py and --key=value model knobs")
    ap.add_argument('--device', default='cuda', choices=('cuda', 'cpu'))
    ap.add_argument('--gpu', default=None, help="the GPU table's row to predict for "
                    "(default: this GPU's; on the CPU H200)")
    ap.add_argument('--micro', type=int, default=0, help="micro-batch (default: the plan's)")
    ap.add_argument('--budget', type=float, default=30.0, help="seconds for the whole walk")
    ap.add_argument('--window', type=float, default=None,
                    help="seconds of each sustained window (default: 2 on a GPU, 0.05 on the CPU)")
    a, rest = ap.parse_known_args(argv)
    if a.device == 'cuda' and not torch.cuda.is_available():
        die("no CUDA GPU here: run it on the GPU host, or with --device=cpu")
    window = a.window
    if window is None:
        window = WINDOW_S[a.device]
    if a.micro < 0 or not 0 < a.budget < math.inf or not 0 < window < a.budget:
        die("--micro must be >= 0, --budget a number of seconds > 0 and --window between 0 "
            "and --budget")
    defaults = {f.name: f.default for f in fields(GPTConfig)}
    cfg = config_from(configure(defaults, a.config + rest, strict_files=False))
    name = torch.cuda.get_device_name() if a.device == 'cuda' else None
    gpu = gpus.gpu_key(a.gpu or name) or 'H200'
    t0 = time.time()
    strategy, micro, ac, dtype, fits = plan_of(cfg, gpu, a.micro)
    micro = a.micro or micro
    planned = time.time() - t0
    kinds, rows, sustained = walk(cfg, gpu, a.device, micro, strategy, ac, dtype,
                                  max(1.0, a.budget - planned), window)
    us = lambda s: '        -' if s is None else f"{s * 1e6:9.1f}"
    for r in rows:
        print(f"{r['kind']:<9} {str(r['shape']):<44} ×{r['count']:<4} predicted "
              f"{us(r['predicted'])} us  burst {us(r['burst'])} us  sustained "
              f"{us(r['sustained'])} us")
    tokens = micro * cfg.block_size
    pred, meas, burst = (sum(k[x] for k in kinds.values())
                         for x in ('predicted', 'measured', 'burst'))
    out = dict(device=name or 'cpu', gpu=gpu, torch=torch.__version__, strategy=strategy,
               ac=ac, dtype=dtype, micro=micro, block_size=cfg.block_size, fits=fits,
               kinds=kinds, sustained=sustained, predicted_s=pred, measured_s=meas,
               burst_s=burst, predicted_tokens_per_sec=tokens / pred,
               measured_tokens_per_sec=tokens / meas, burst_tokens_per_sec=tokens / burst,
               wall=time.time() - t0)
    big, state = sustained['big'], 'settled'
    if not sustained['settled']:
        state = 'not settled'
    print(f"one micro-batch of {micro} × {cfg.block_size} ({strategy}"
          f"{', ac' if ac else ''}, {dtype}) on {name or 'the CPU'}, predicted as {gpu}: "
          + '; '.join(f"{k} {v['predicted'] * 1e3:.2f} ms predicted, {v['measured'] * 1e3:.2f} "
                      f"sustained ({v['ratio']:.2f}×), {v['burst'] * 1e3:.2f} burst"
                      for k, v in kinds.items() if v['predicted']))
    print(f"clock {state} after {sustained['settle_s']:.1f} s; windows of {window:g} s over "
          f"{sustained['share']:.0%} of the predicted kernel time; matmul {big['shape']}: "
          f"{big['tflops'] or 0:.4g} TFLOP/s sustained, {big['burst_tflops'] or 0:.4g} burst")
    print(json.dumps(out))
    return out


if __name__ == '__main__':
    main()
