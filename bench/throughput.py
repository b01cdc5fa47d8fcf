"""
Tokens/s and MFU of train.py for a config and plan: the median of the steps after warm-up.
It runs train.py itself (on random tokens, so no data set is needed) and reads its metrics.jsonl.

  python bench/throughput.py configs/gpt_tiny.py --device=cpu
  python bench/throughput.py configs/gpt2_124m.py --device=cpu --batch_size=8 --block_size=256 --steps=8
  python bench/throughput.py configs/gpt_1p3b.py --steps=20 --compile=True   # on a GPU
  python bench/throughput.py configs/gpt_tiny.py --nproc=2 --record          # torchrun; append to RESULTS.md

Options of its own: --steps (default 10), --warmup (default 3), --nproc (torchrun ranks),
--record (append a row to bench/RESULTS.md). Everything else goes to train.py.
"""
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
steps, warmup, nproc, record, train_args = 10, 3, 1, False, []
for arg in sys.argv[1:]:
    key, _, value = arg.lstrip('-').partition('=')
    if key in ('steps', 'warmup', 'nproc'):
        globals()[key] = int(value)
    elif key == 'record':
        record = True
    else:  # config files are read from train.py's working folder, a temporary one
        train_args.append(arg if arg.startswith('--') else os.path.abspath(arg))

with tempfile.TemporaryDirectory() as work:
    # Random GPT-2 token ids: enough for any block_size; the speed does not depend on the text.
    os.makedirs(os.path.join(work, 'data', 'bench'))
    rng = np.random.default_rng(0)
    for split, n in (('train', 4_000_000), ('val', 200_000)):
        rng.integers(0, 50257, size=n, dtype=np.uint16).tofile(os.path.join(work, 'data', 'bench', f'{split}.bin'))
    launcher = [sys.executable] if nproc == 1 else [sys.executable, '-m', 'torch.distributed.run', '--standalone',
                                                    f'--nproc_per_node={nproc}']
    cmd = launcher + [os.path.join(ROOT, 'train.py')] + train_args + [
        '--dataset=bench', f'--out_dir={work}/out', f'--max_iters={warmup + steps}', '--log_interval=1',
        '--eval_interval=1000000', '--eval_iters=1', '--checkpoint_interval=1000000', '--init_from=scratch']
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get('OMP_NUM_THREADS', str(max(1, os.cpu_count() // nproc))))
    p = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"train.py failed:\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    rows = [json.loads(line) for line in open(os.path.join(work, 'out', 'metrics.jsonl'))]
    rows = [r for r in rows if 'tokens_per_sec' in r and r['iter'] > warmup]
    lines = p.stdout.splitlines()  # the planner's table: predicted and measured memory per rank
    start = next((i for i, line in enumerate(lines) if line.startswith('plan:')), 0)
    plan_table = '\n'.join(lines[start:next((i + 1 for i, line in enumerate(lines) if line.startswith('candidates:')), start)])

tps = statistics.median(r['tokens_per_sec'] for r in rows)
mfus = [r['mfu'] for r in rows if r.get('mfu')]
mfu = f"{100 * statistics.median(mfus):.1f}%" if mfus else 'n/a'
mem = max(r.get('mem_gib', 0) for r in rows)
command = 'python bench/throughput.py ' + ' '.join(sys.argv[1:])
print(f"{tps:,.0f} tokens/s, MFU {mfu}, peak memory {mem:.2f} GiB, median of {len(rows)} steps after {warmup}")
print(plan_table)
if record:
    try:
        import torch
        device = torch.cuda.get_device_name() if torch.cuda.is_available() and 'device=cpu' not in ' '.join(train_args) \
            else f"CPU ({os.cpu_count()} cores)"
    except Exception:
        device = 'unknown'
    # into the table under RESULTS.md's '## Recorded by bench/throughput.py' (made at the end if missing)
    path, header = os.path.join(ROOT, 'bench', 'RESULTS.md'), '| date | machine | device | command | tokens/s | MFU | peak GiB |'
    lines = open(path).read().splitlines()
    if header not in lines:
        lines += ['', '## Recorded by bench/throughput.py', '', header, '|---|---|---|---|---|---|---|']
    end = lines.index(header) + 2
    while end < len(lines) and lines[end].startswith('|'):
        end += 1
    lines.insert(end, f"| {datetime.date.today()} | {platform.node()} | {device} | `{command}` | {tps:,.0f} | {mfu} | {mem:.2f} |")
    open(path, 'w').write('\n'.join(lines) + '\n')
