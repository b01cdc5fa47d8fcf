"""
A CPU training step three ways, on the same data, model and batch, in one run: train.py as it
runs by default (a CPU rank with room for glibc's slack keeps glibc's allocator as it is), train.py
on a rank whose stated memory leaves no such room (HETGPT_MEM_GIB: freed memory goes back to the OS
at once, hardware.return_freed_host_memory), and nanoGPT's own train.py (float32, eager: its CPU
path). Each round runs the three in turn, the next round in the opposite order, so that each meets
the machine's load alike. Prints each run's median tokens/s (steps after the first 5) and its
ratio to the default's in the same round.

  python bench/cpu_step.py /path/to/nanoGPT             # 4 × 256, 8 × 256 tokens, 40 steps, 2 rounds
  python bench/cpu_step.py /path/to/nanoGPT --steps=60 --rounds=2 --n_embd=384

nanoGPT is not part of hetgpt: give a checkout of github.com/karpathy/nanoGPT (its train.py and
model.py run as they are; the data is hetgpt's pydocs corpus, in nanoGPT's own format). Needs
data/pydocs (python data/prepare.py --dataset pydocs). Threads: OMP_NUM_THREADS, else 2.
"""
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from hetgpt.run.metrics import read_rows  # noqa: E402

if len(sys.argv) < 2 or not os.path.isfile(os.path.join(sys.argv[1], 'train.py')):
    sys.exit("usage: python bench/cpu_step.py NANOGPT_DIR [--steps=40 --rounds=2 --KNOB=VALUE ...]")
nano = os.path.abspath(sys.argv[1])
knobs = dict(n_layer=4, n_head=4, n_embd=256, block_size=256, batch_size=8, steps=40, rounds=2)
for arg in sys.argv[2:]:
    key, _, value = arg.lstrip('-').partition('=')
    knobs[key] = int(value)
steps, rounds = knobs.pop('steps'), knobs.pop('rounds')
shape = [f'--{k}={v}' for k, v in knobs.items()]
common = shape + ['--dropout=0.0', '--bias=False', '--learning_rate=6e-4', '--weight_decay=0.1',
                  f'--max_iters={steps}', f'--lr_decay_iters={steps}', '--warmup_iters=5',
                  '--min_lr=6e-5', '--grad_clip=1.0', '--dataset=pydocs', '--log_interval=1',
                  '--device=cpu', '--dtype=float32', '--compile=False']
env = dict(os.environ, OMP_NUM_THREADS=os.environ.get('OMP_NUM_THREADS', '2'))
env.pop('MALLOC_MMAP_THRESHOLD_', None)
data = os.path.join(ROOT, 'data', 'pydocs')
if not os.path.exists(os.path.join(data, 'train.bin')):
    sys.exit("no data/pydocs: run python data/prepare.py --dataset pydocs")


def hetgpt(work, name, extra_env=None, keeps=True):
    out = os.path.join(work, name)
    cmd = [sys.executable, os.path.join(ROOT, 'train.py'), *common, f'--out_dir={out}',
           f'--eval_interval={steps}', f'--checkpoint_interval={steps}', '--eval_iters=1']
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**env, **(extra_env or {})})
    if p.returncode:
        sys.exit(f"train.py failed:\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    rows = read_rows(os.path.join(out, 'metrics.jsonl'))
    if keeps != ("glibc's slack" in p.stdout):  # (the plan table says when freed memory is kept)
        sys.exit(f"train.py {'returned' if keeps else 'kept'} freed memory:\n{p.stdout[-2000:]}")
    tps = [r['tokens_per_sec'] for r in rows if 'tokens_per_sec' in r and r['iter'] > 5]
    shutil.rmtree(out)
    return statistics.median(tps), rows[0]


def nanogpt(work):
    # nanoGPT reads configurator.py and data/<dataset>/{train,val}.bin (uint16) in its working
    # directory: its three files and the data, there
    here = os.path.join(work, 'nanogpt')
    if not os.path.exists(here):
        os.makedirs(os.path.join(here, 'data'))
        for f in ('train.py', 'model.py', 'configurator.py'):
            shutil.copy(os.path.join(nano, f), here)
        os.symlink(data, os.path.join(here, 'data', 'pydocs'))
    cmd = [sys.executable, 'train.py', *common, '--gradient_accumulation_steps=1',
           f'--eval_interval={steps + 1}', '--eval_iters=1', '--always_save_checkpoint=False',
           f'--out_dir={os.path.join(work, "nano")}', '--beta2=0.95']
    p = subprocess.run(cmd, cwd=here, capture_output=True, text=True, env=env)
    if p.returncode:
        sys.exit(f"nanoGPT's train.py failed:\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    ms = [float(t) for i, t in re.findall(r'iter (\d+): loss [\d.]+, time ([\d.]+)ms', p.stdout)
          if int(i) > 5]
    tokens = knobs['batch_size'] * knobs['block_size']
    return tokens / (statistics.median(ms) / 1000)


results = {}
with tempfile.TemporaryDirectory() as work:
    # the stated memory that leaves no room for glibc's slack: 1.5 × the planner's prediction
    tight = {'HETGPT_MEM_GIB': f"{1.5 * hetgpt(work, 'measure')[1]['pred_gib']:.4f}"}
    runs = {'train.py, default': lambda: hetgpt(work, 'default')[0],
            'train.py, memory returned': lambda: hetgpt(work, 'tight', tight, keeps=False)[0],
            "nanoGPT's train.py": lambda: nanogpt(work)}
    for r in range(rounds):
        for name in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
            results.setdefault(name, []).append(runs[name]())
            print(f"round {r + 1}: {name}: {results[name][-1]:,.0f} tokens/s", flush=True)
base = results['train.py, default']
print(json.dumps({'shape': knobs, 'steps': steps, 'threads': env['OMP_NUM_THREADS'],
                  'tokens_per_sec': results}))
for name, tps in results.items():
    ratios = ', '.join(f"{t / b:.2f}×" for t, b in zip(tps, base))
    print(f"{name}: {', '.join(f'{t:,.0f}' for t in tps)} tokens/s (against the default: {ratios})")
