"""
The CPU default against float32 eager, in one run: train.py with its defaults (dtype=auto,
compile=True) and with --dtype=float32 --compile=False, from the same seed on the same data.
Prints the median step-time ratio and the validation loss of both at the end.

  python bench/cpu_default.py configs/gpt_tiny.py --steps=300
  python bench/cpu_default.py configs/gpt2_124m.py --steps=300 --batch_size=2 --block_size=128 --record

Options of its own: --steps (default 300), --record (append the result to bench/RESULTS.md).
Everything else goes to train.py. Needs data/pydocs (python data/prepare.py --dataset pydocs).
"""
import datetime
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from hetgpt.run.metrics import read_rows  # noqa: E402
steps, record, train_args = 300, False, []
for arg in sys.argv[1:]:
    key, _, value = arg.lstrip('-').partition('=')
    if key == 'steps':
        steps = int(value)
    elif key == 'record':
        record = True
    else:
        train_args.append(arg if arg.startswith('--') else os.path.abspath(arg))
if not os.path.exists(os.path.join(ROOT, 'data', 'pydocs', 'train.bin')):
    sys.exit("no data/pydocs: run python data/prepare.py --dataset pydocs")

SETTINGS = {'float32 eager': ['--dtype=float32', '--compile=False'], 'default': []}
results = {}
with tempfile.TemporaryDirectory() as work:
    for name, extra in SETTINGS.items():
        cmd = [sys.executable, os.path.join(ROOT, 'train.py')] + train_args + extra + [
            '--device=cpu', '--dataset=pydocs', f'--out_dir={work}/{len(results)}', f'--max_iters={steps}',
            f'--lr_decay_iters={steps}', '--log_interval=1', f'--eval_interval={steps}', f'--checkpoint_interval={steps}',
            '--init_from=scratch']
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if p.returncode:
            sys.exit(f"train.py failed:\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
        rows = read_rows(os.path.join(work, str(len(results)), 'metrics.jsonl'))
        step_rate = statistics.median(r['tokens_per_sec'] for r in rows if 'tokens_per_sec' in r and r['iter'] > 5)
        banner = next(line for line in p.stdout.splitlines() if 'parameters;' in line)
        results[name] = dict(tps=step_rate, val=[r['val_loss'] for r in rows if 'val_loss' in r][-1], banner=banner)
        print(f"{name}: {step_rate:,.0f} tokens/s, val loss {results[name]['val']:.4f} after {steps} steps\n  {banner}", flush=True)

base, new = results['float32 eager'], results['default']
line = (f"default / float32 eager: {new['tps'] / base['tps']:.2f}× tokens/s; val loss {new['val']:.4f} vs "
        f"{base['val']:.4f} (difference {new['val'] - base['val']:+.4f}) after {steps} steps")
print(line)
if record:
    with open(os.path.join(ROOT, 'bench', 'RESULTS.md'), 'a') as f:
        f.write(f"\n{datetime.date.today()}, `python bench/cpu_default.py {' '.join(sys.argv[1:])}`, "
                f"CPU ({os.cpu_count()} cores): {line}\n")
