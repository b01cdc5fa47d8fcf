"""
Two machines on an ordinary network, rehearsed on this host (issue 38): two network namespaces
joined by a veth pair whose rate a token bucket holds, 100 Mbit/s and 1 Gbit/s (tests/nodes.py),
a torchrun agent in each (c10d rendezvous, gloo), one rank per machine. gpt_tiny (7.3M parameters:
29 MB of float32 gradients a step, 2.5 s at 100 Mbit/s, against about 0.5 s of compute) on
pydocs, eager, 4 of the 8 sequences of each step on each machine.

0. gloo's collectives at each rate, as DDP and FSDP call them (bench/gloo_collectives.py), for
   gpt_tiny's float32 gradients.
1. Speed, alternating: each round runs a one-process step of a machine's part (4 sequences: a node
   alone, no link; its FLOP/s is what plan.py's prediction takes, --cpu_gflops), then at each rate
   every-step DDP, every-step FSDP and local steps (outer_interval=H), each a short run whose log
   rows after the first are its tokens/s; beside each, plan.py's predicted step for that link.
2. Loss at equal tokens: gpt_tiny's whole schedule (200 steps, val loss every 50) as every-step DDP
   (at 1 Gbit/s: the link's rate changes its speed, never its numbers) and as local steps at each H
   (at 100 Mbit/s, their speed over the whole run measured too); plot.py draws them (compare.png).

  python bench/two_nodes.py                   # about 25 minutes on 2 cores; as root
  python bench/two_nodes.py --rounds 1 --intervals 10 --steps 200
  python bench/two_nodes.py --phases loss --intervals 10:1:0,5   # H[:outer_lr:outer_momentum]

Prints the table bench/RESULTS.md quotes, and writes the plot to --plot.
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, 'tests'))
sys.path.insert(0, ROOT)
from nodes import Netns, agents, ok  # noqa: E402
from trainer import run_train  # noqa: E402
from hetgpt.run.metrics import read_rows  # noqa: E402

# gpt_tiny as these runs measured it (bench/RESULTS.md), before make demo's settings
BASE = ['configs/gpt_tiny.py', '--device=cpu', '--compile=False', '--checkpoint_interval=0',
        '--balance=even', '--block_size=256', '--batch_size=8', '--learning_rate=2e-3',
        '--min_lr=2e-4', '--eval_interval=50']
RATES = {'100 Mbit/s': 100e6, '1 Gbit/s': 1e9}


def rows(out_dir, key):
    return [r for r in read_rows(os.path.join(out_dir, 'metrics.jsonl')) if key in r]


def speed(out_dir):  # tokens/s: the mean of the log rows after the first (its warm-up)
    return statistics.mean(r['tokens_per_sec'] for r in rows(out_dir, 'tokens_per_sec')[1:])


def predicted(mode, H, gbit, gflops):
    # plan.py's predicted step (every step: its plan; local steps: its local-steps line)
    args = [sys.executable, os.path.join(ROOT, 'plan.py'), 'configs/gpt_tiny.py', '--gpus', '2xcpu',
            '--host_mem', '16', '--nodes', '2', '--link_gbit', str(gbit), '--cpu_gflops',
            f'{gflops:.1f}', '--plan', 'fsdp' if mode == 'fsdp' else 'ddp']
    out = subprocess.run(args + ([f'--outer_interval={H}'] if H else []), cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    if H:
        return float(re.search(r'local steps, outer_interval=\d+: step ([\d.e+-]+) s', out)[1])
    return float(re.search(r'predicted: step ([\d.e+-]+) s', out)[1])


def load():  # other processes' share of the 2 cores, from /proc/loadavg (1 min)
    return float(open('/proc/loadavg').read().split()[0])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--rounds', type=int, default=2)
    ap.add_argument('--intervals', default='10,25,50',
                    help="local steps' H[:outer_lr:outer_momentum], by commas (default lr and "
                    "momentum: DiLoCo's); the first is also timed in phase 1")
    ap.add_argument('--phases', default='speed,loss', help="speed (0 and 1), loss (2)")
    ap.add_argument('--steps', type=int, default=200, help="the loss runs' max_iters")
    ap.add_argument('--work', default=None, help="keep the runs here (default: a temporary dir)")
    ap.add_argument('--plot', default=os.path.join(ROOT, 'bench', 'two_nodes.png'))
    a = ap.parse_args()
    specs = [dict(zip(('H', 'lr', 'momentum'), spec.split(':'))) for spec in
             a.intervals.split(',')]
    Hs = [int(x['H']) for x in specs]
    work = a.work or tempfile.mkdtemp(prefix='two_nodes_')
    os.makedirs(os.path.join(work, 'data'), exist_ok=True)
    if not os.path.exists(os.path.join(ROOT, 'data', 'pydocs', 'train.bin')):
        subprocess.run([sys.executable, 'data/prepare.py', '--dataset', 'pydocs'], cwd=ROOT,
                       check=True)
    shutil.copytree(os.path.join(ROOT, 'data', 'pydocs'), os.path.join(work, 'data', 'pydocs'),
                    dirs_exist_ok=True)
    shutil.copytree(os.path.join(ROOT, 'configs'), os.path.join(work, 'configs'),
                    dirs_exist_ok=True)
    net = Netns().up()
    t0 = time.time()
    try:
        def run(out, args):  # two machines, one rank each
            ok(agents(work, [*BASE, f'--out_dir={out}', *args], net.hosts, namespaces=net.names))
        # 0. gloo's collectives
        for name, rate in RATES.items() if 'speed' in a.phases else ():
            net.rate(rate)
            out = ok(agents(work, [], net.hosts, namespaces=net.names,
                            script=os.path.join(ROOT, 'bench', 'gloo_collectives.py')))
            print(f"{name}: {re.search(r'gloo .*', out)[0]}", flush=True)
        # 1. speed, alternating
        measured, gflops_seen, loads = {}, [], []
        from hetgpt.planner.costs import flops_per_sequence
        from model import GPTConfig
        cfg = GPTConfig(n_layer=4, n_head=4, n_embd=128, block_size=256, bias=True)
        H = Hs[0]
        first = [f"--outer_{k}={specs[0][k]}" for k in ('lr', 'momentum') if k in specs[0]]
        for r in range(a.rounds if 'speed' in a.phases else 0):
            out = f'alone_{r}'
            run_train(work, *BASE, f'--out_dir={out}', '--batch_size=4', '--max_iters=9',
                      '--log_interval=3', '--eval_interval=1000')
            alone = speed(os.path.join(work, out))
            gflops_seen.append(flops_per_sequence(cfg) * alone / 256 / 1e9)
            measured.setdefault(('alone', '-'), []).append(alone)
            for name, rate in RATES.items():
                net.rate(rate)
                for mode, args in (('ddp', ['--plan=ddp', '--max_iters=9', '--log_interval=3']),
                                   ('fsdp', ['--plan=fsdp', '--max_iters=9', '--log_interval=3']),
                                   (f'local H={H}', ['--plan=ddp', f'--outer_interval={H}', *first,
                                                     f'--max_iters={3 * H}',
                                                     f'--log_interval={H}'])):
                    out = f"{mode.replace(' ', '_').replace('=', '')}_{rate:.0e}_{r}"
                    loads.append(load())
                    run(out, [*args, '--eval_interval=1000'])
                    measured.setdefault((mode, name), []).append(speed(os.path.join(work, out)))
                    print(f"round {r}: {mode} at {name}: {measured[mode, name][-1]:,.0f} tok/s "
                          f"({time.time() - t0:.0f} s)", flush=True)
        gflops = statistics.median(gflops_seen or [0])
        # 2. loss at equal tokens
        loss_runs = {'ddp': ('1 Gbit/s', ['--plan=ddp'])}
        for x in specs:  # (its knobs: train.py's, as a user gives them)
            knobs = [f"--outer_{k}={x[k]}" for k in ('lr', 'momentum') if k in x]
            mode = f"local H={x['H']}" + ''.join(f" {k[8:]}" for k in knobs)
            loss_runs[mode] = ('100 Mbit/s', ['--plan=ddp', f"--outer_interval={x['H']}", *knobs])
        curves, whole = {}, {}
        for mode, (name, args) in loss_runs.items():
            net.rate(RATES[name])
            out = 'loss_' + re.sub(r'[^\w.]+', '_', mode)
            loads.append(load())
            run(out, [*args, f'--max_iters={a.steps}', f'--lr_decay_iters={a.steps}'])
            curves[mode] = {r['tokens']: r['val_loss'] for r in rows(os.path.join(work, out),
                                                                     'val_loss')}
            whole[mode] = (name, statistics.mean(
                r['tokens_per_sec'] for r in rows(os.path.join(work, out), 'tokens_per_sec')))
            print(f"loss run {mode} at {name}: {whole[mode][1]:,.0f} tok/s, val "
                  f"{list(curves[mode].values())} ({time.time() - t0:.0f} s)", flush=True)
    finally:
        net.down()
    # the table
    tokens = 8 * 256
    print(f"\n{a.rounds} round(s); a machine alone: {gflops:.1f} GFLOP/s (median); load average "
          f"{min(loads):.1f}-{max(loads):.1f} during the runs; {time.time() - t0:.0f} s\n")
    print("| mode | link | predicted tok/s | measured tok/s (rounds) | measured / predicted "
          "| × every-step DDP |")
    print("|---|---|---|---|---|---|")
    for (mode, name), speeds in measured.items():
        if mode == 'alone':
            print(f"| a machine alone (4 sequences, no link) | - | - | "
                  f"{' / '.join(f'{s:,.0f}' for s in speeds)} | - | - |")
            continue
        gbit = RATES[name] / 1e9
        h = int(mode.split('=')[1]) if mode.startswith('local') else 0
        p = tokens / predicted(mode.split()[0], h, gbit, gflops)
        ddp = [x / y for x, y in zip(speeds, measured['ddp', name])]
        print(f"| {mode} | {name} | {p:,.0f} | {' / '.join(f'{s:,.0f}' for s in speeds)} | "
              f"{statistics.mean(speeds) / p:.2f} | {' / '.join(f'{x:.2f}' for x in ddp)} |")
    print("\n| run | link | tok/s over the run | " + ' | '.join(
        f"val @ {t // 1000}k tokens" for t in curves['ddp']) + " | last vs DDP |")
    print("|---|---|---|" + '---|' * (len(curves['ddp']) + 1))
    last = list(curves['ddp'].values())[-1]
    for mode, curve in curves.items():
        print(f"| {mode} | {whole[mode][0]} | {whole[mode][1]:,.0f} | " + ' | '.join(
            f"{curve.get(t, float('nan')):.4f}" for t in curves['ddp']) +
            f" | {list(curve.values())[-1] / last - 1:+.2%} |")
    outs = ['loss_' + re.sub(r'[^\w.]+', '_', m) for m in curves]
    subprocess.run([sys.executable, os.path.join(ROOT, 'plot.py'), *outs], cwd=work, check=True)
    shutil.copy(os.path.join(work, outs[0], 'compare.png'), a.plot)
    print(f"wrote {a.plot}; runs in {work}")


if __name__ == '__main__':
    main()
