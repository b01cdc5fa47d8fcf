"""
Tokens/s and MFU of train.py for a config and plan: the median of the steps after warm-up.
It runs train.py itself (on random tokens, so no data set is needed) and reads its metrics.jsonl:
the plan row (strategy, predicted and probed memory) and the step rows. No checkpoint is written.

  python bench/throughput.py configs/gpt_tiny.py --device=cpu
  python bench/throughput.py configs/gpt2_124m.py --device=cpu --batch_size=8 --block_size=256 --steps=8
  python bench/throughput.py configs/gpt_1p3b.py --steps=20 --compile=True   # on a GPU
  python bench/throughput.py configs/gpt_tiny.py --nproc=2 --record          # torchrun; append to RESULTS.md

Options of its own: --steps (default 10), --warmup (default 3), --nproc (torchrun ranks),
--record (append a row to bench/RESULTS.md). Everything else goes to train.py.
bench/gpu_check.py calls measure() directly.
"""
import contextlib
import datetime
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from hetgpt.run.metrics import read_rows  # noqa: E402


def measure(train_args, steps=10, warmup=3, nproc=1, timeout=None, log_path=None, work=None,
            then=()):
    # Runs train.py; returns a dict: tokens_per_sec, mfu, mem_gib (max allocated), reserved_gib,
    # host_gib (peak RSS) over the steps after warm-up, their losses, the plan row, the plan
    # table, step_s and pred_step_s (the median step's seconds, and the step the plan's table
    # predicted: its line 'predicted: step ... s'; None when not said), wall seconds; or error
    # (the output's tail) when it failed or ran out of time.
    # log_path: train.py's output. work: a folder that outlives the run (its data and out_dir:
    # a second run resumes there), else a temporary one. then: arguments after measure's own
    # (which write no checkpoint and start from scratch), e.g. --checkpoint_interval=2.
    t0 = time.time()
    with contextlib.nullcontext(work) if work else tempfile.TemporaryDirectory() as work:
        # Random GPT-2 token ids: enough for any block_size; the speed does not depend on the text.
        os.makedirs(os.path.join(work, 'data', 'bench'), exist_ok=True)
        rng = np.random.default_rng(0)
        for split, n in (('train', 4_000_000), ('val', 200_000)):
            path = os.path.join(work, 'data', 'bench', f'{split}.bin')
            if not os.path.exists(path):
                rng.integers(0, 50257, size=n, dtype=np.uint16).tofile(path)
        launcher = [sys.executable] if nproc == 1 else [
            sys.executable, '-m', 'torch.distributed.run', '--standalone', f'--nproc_per_node={nproc}']
        # config files are read from train.py's working folder, a temporary one
        args = [a if a.startswith('--') else os.path.abspath(a) for a in train_args]
        cmd = launcher + [os.path.join(ROOT, 'train.py')] + args + [
            '--dataset=bench', f'--out_dir={work}/out', f'--max_iters={warmup + steps}', '--log_interval=1',
            '--eval_interval=1000000', '--eval_iters=1', '--checkpoint_interval=0', '--init_from=scratch',
            *then]
        threads = os.environ.get('OMP_NUM_THREADS', str(max(1, os.cpu_count() // nproc)))
        env = dict(os.environ, OMP_NUM_THREADS=threads)
        # its own session: at the time limit the whole group goes (torchrun's ranks, inductor's
        # compile workers), not only the process started here; so it does on a Ctrl-C or SIGTERM
        # (SystemExit) to the caller, since the group no longer hears the terminal's
        p = subprocess.Popen(cmd, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, start_new_session=True)
        try:
            out, err = p.communicate(timeout=timeout)
            failed = p.returncode and f"exit code {p.returncode}"
        except BaseException as e:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            if not isinstance(e, subprocess.TimeoutExpired):
                raise
            out, err = p.communicate()
            failed = f"timed out after {timeout:.0f} s"
        if log_path:
            with open(log_path, 'w') as f:
                f.write(' '.join(cmd) + '\n' + out + '\n--- stderr\n' + err)
        rows = read_rows(os.path.join(work, 'out', 'metrics.jsonl'))
    wall = time.time() - t0
    plan = next((r for r in rows if 'plan' in r), {})
    steps_rows = [r for r in rows if 'tokens_per_sec' in r and r['iter'] > warmup]
    if failed or not steps_rows:
        return dict(error=failed or f"no step logged after {warmup} of warm-up",
                    tail=(out[-1500:] + '\n' + err[-2500:]).strip(), wall=wall)
    lines = out.splitlines()  # the planner's table: predicted and measured memory per rank
    start = next((i for i, line in enumerate(lines) if line.startswith('plan:')), 0)
    end = next((i + 1 for i, line in enumerate(lines) if line.startswith('candidates:')), start)
    mfus = [r['mfu'] for r in steps_rows if r.get('mfu')]
    tokens_per_sec = statistics.median(r['tokens_per_sec'] for r in steps_rows)
    pred_step = re.search(r'^predicted: step (\S+) s', out, re.M)
    per_step = re.search(r'([\d,]+) tokens per step', out)
    step_s = per_step and int(per_step[1].replace(',', '')) / tokens_per_sec
    # a peak the run could not measure is null in its rows (the host's on CUDA without a reset)
    peak = lambda key: max((r[key] for r in steps_rows if r.get(key) is not None), default=None)
    return dict(tokens_per_sec=tokens_per_sec, step_s=step_s,
                pred_step_s=pred_step and float(pred_step[1]),
                mfu=statistics.median(mfus) if mfus else None,
                mem_gib=peak('mem_gib'), reserved_gib=peak('reserved_gib'), host_gib=peak('host_gib'),
                mem_per_step=[r.get('mem_gib') for r in steps_rows],
                losses={r['iter']: r['loss'] for r in steps_rows},
                steps=len(steps_rows), plan=plan, table='\n'.join(lines[start:end]), wall=wall)


def main():
    opts, train_args, record = dict(steps=10, warmup=3, nproc=1), [], False
    for arg in sys.argv[1:]:
        key, _, value = arg.lstrip('-').partition('=')
        if key in opts:
            opts[key] = int(value)
        elif key == 'record':
            record = True
        else:
            train_args.append(arg)
    r = measure(train_args, **opts)
    if 'error' in r:
        sys.exit(f"train.py failed ({r['error']}):\n{r['tail']}")
    mfu = f"{100 * r['mfu']:.1f}%" if r['mfu'] else 'n/a'
    print(f"{r['tokens_per_sec']:,.0f} tokens/s, MFU {mfu}, peak memory {r['mem_gib']:.2f} GiB, "
          f"median of {r['steps']} steps after {opts['warmup']}")
    print(r['table'])
    if record:
        command = 'python bench/throughput.py ' + ' '.join(sys.argv[1:])
        record_row(command, train_args, r, mfu)


def record_row(command, train_args, r, mfu):
    try:
        import torch
        on_gpu = torch.cuda.is_available() and 'device=cpu' not in ' '.join(train_args)
        device = torch.cuda.get_device_name() if on_gpu else f"CPU ({os.cpu_count()} cores)"
    except Exception:
        device = 'unknown'
    # into the table under RESULTS.md's '## Recorded by bench/throughput.py' (made at the end if missing)
    path = os.path.join(ROOT, 'bench', 'RESULTS.md')
    header = '| date | machine | device | command | tokens/s | MFU | peak GiB |'
    lines = open(path).read().splitlines()
    if header not in lines:
        lines += ['', '## Recorded by bench/throughput.py', '', header, '|---|---|---|---|---|---|---|']
    end = lines.index(header) + 2
    while end < len(lines) and lines[end].startswith('|'):
        end += 1
    lines.insert(end, f"| {datetime.date.today()} | {platform.node()} | {device} | `{command}` | "
                      f"{r['tokens_per_sec']:,.0f} | {mfu} | {r['mem_gib']:.2f} |")
    open(path, 'w').write('\n'.join(lines) + '\n')


if __name__ == '__main__':
    main()
