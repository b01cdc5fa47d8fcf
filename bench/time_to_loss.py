"""
Time to loss (issue 50, item 5): Muon for the blocks' matrices against AdamW, side by side on
this machine, each at the best learning rate of a small sweep, on configs/gpt_tiny.py and on a
4-layer 256-wide model over the pydocs corpus; then make demo's run and samples for both.
  python bench/time_to_loss.py                   # the sweeps, the demo-length pair, the samples
  python bench/time_to_loss.py --stage=sweep     # only the sweeps (--stage=demo: only the pair)
Every run is a plain train.py command (printed), one thread each; all the runs of a stage run AT
THE SAME TIME (a sweep's 12, the demo's 2), so all meet the same load from the machine's other
work: the per-step time ratio is read between runs that ran at once. Tokens to a loss are
deterministic; seconds are not.
Muon: train.py's --optimizer=muon when the repository has that knob; until then an edited copy
of the repository (out/ttl/code) whose make_optimizer gives the blocks' 2-D weights to
torch.optim.Muon (lr scaled as adjust_lr_fn='match_rms_adamw', Moonshot's arXiv 2502.16982: its
lr is on AdamW's scale) and the rest to AdamW, as tests/test_optimizer.py's MUON edit.
Prints markdown tables for bench/RESULTS.md ("Time to loss").
"""
import json
import os
import re
import shutil
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from hetgpt.knobs import configure, is_knob

# -----------------------------------------------------------------------------
stage = 'all'          # 'sweep', 'demo' or 'all'
work = 'out/ttl'       # runs, copies and samples (under the repository root)
threads = 1            # OMP_NUM_THREADS of each run (two run at once)
sweep_steps = 100      # gpt_tiny's steps in the sweep (make demo's are 500: cut to fit)
wide_steps = 60        # the 256-wide model's steps (batch 8 × 128 tokens)
lrs = '1.5e-3,3e-3,6e-3'     # AdamW: gpt_tiny's 3e-3 × {0.5, 1, 2}
muon_lrs = ''          # Muon's; '': the edited copy's '3e-3,6e-3,1.2e-2' (match_rms_adamw: on
                       # AdamW's scale, gpt_tiny's lr × {1, 2, 4}), the knob's '1e-2,2e-2,4e-2'
                       # (Keller Jordan's scale, lr × max(1, rows/cols)^0.5: about 2.2× the
                       # other for these shapes)
wide_lrs = '7.5e-4,1.5e-3,3e-3,6e-3'  # AdamW on the 256-wide model (its best was 1.5e-3,
                       # the grid's edge: one lower)
best_lr = 0.0          # stage=demo: AdamW's lr (0: the sweep's best, read from work)
best_muon_lr = 0.0
demo_steps = 500       # make demo's (gpt_tiny's max_iters)
evals = 5              # evaluations per run after step 0 (the val curve's points)
eval_iters = 8         # × 8 fixed validation sequences each
# -----------------------------------------------------------------------------
globals().update(configure({k: v for k, v in globals().items() if is_knob(k, v)}))
work = os.path.join(ROOT, work)

TINY = ['configs/gpt_tiny.py', '--device=cpu']
WIDE = TINY + ['--n_embd=256', '--batch_size=8']
MAKE_OPTIMIZER = """    return [adamw([{'params': decay, 'weight_decay': config['weight_decay']},
                   {'params': other, 'weight_decay': 0.0}], config)]"""
MUON = """    if config.get('optimizer', 'adamw') == 'muon':
        blocks = {p for n, p in model.named_parameters() if '.h.' in n and p.dim() == 2}
        return [torch.optim.Muon([p for p in decay if p in blocks], lr=config['muon_lr'],
                                 momentum=config['muon_momentum'],
                                 weight_decay=config['muon_weight_decay'],
                                 adjust_lr_fn='match_rms_adamw'),
                adamw([{'params': [p for p in decay if p not in blocks],
                        'weight_decay': config['weight_decay']},
                       {'params': other, 'weight_decay': 0.0}], config)]
""" + MAKE_OPTIMIZER
KNOB = "outer_momentum = 0.9"
KNOBS = """optimizer = 'adamw'
muon_lr = 0.02
muon_momentum = 0.95
muon_weight_decay = 0.1
"""


def train_py():
    # the repository's train.py if it has the Muon knob, else an edited copy's
    if 'muon_lr' in open(os.path.join(ROOT, 'train.py')).read():
        return os.path.join(ROOT, 'train.py'), 'the repository (--optimizer=muon)'
    code = os.path.join(work, 'code')
    os.makedirs(code, exist_ok=True)
    for f in os.listdir(ROOT):
        if f.endswith('.py'):
            shutil.copy(os.path.join(ROOT, f), code)
    shutil.copytree(os.path.join(ROOT, 'hetgpt'), os.path.join(code, 'hetgpt'),
                    ignore=shutil.ignore_patterns('__pycache__'), dirs_exist_ok=True)
    for name, old, new in [('model.py', MAKE_OPTIMIZER, MUON),
                           ('train.py', KNOB, KNOBS + KNOB)]:
        path = os.path.join(code, name)
        text = open(path).read()
        assert text.count(old) == 1, (name, old)
        open(path, 'w').write(text.replace(old, new))
    return os.path.join(code, 'train.py'), 'an edited copy (out/ttl/code: make_optimizer)'


def args_of(model, arm, lr, steps, name):
    # a run's train.py arguments: the model's, the schedule over `steps`, the arm's rates
    args = {'tiny': TINY, 'wide': WIDE}[model] + [
        f'--out_dir={os.path.relpath(os.path.join(work, name), ROOT)}',
        f'--max_iters={steps}', f'--lr_decay_iters={steps}', f'--eval_iters={eval_iters}',
        f'--eval_interval={max(steps // evals, 1)}', '--log_interval=10']
    if steps != demo_steps:
        args.append('--checkpoint_interval=0')  # (only the demo's runs are sampled)
    if arm == 'adamw':
        return args + [f'--learning_rate={lr:g}', f'--min_lr={lr / 10:g}']
    return args + ['--optimizer=muon', f'--muon_lr={lr:g}',  # AdamW's part: the config's lr
                   '--muon_weight_decay=0.1']  # (the config's weight_decay)


def run_all(script, jobs):
    # each (name, args) at once, each in its own process; the wall seconds and CPU seconds
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONWARNINGS='ignore')
    procs = []
    for name, args in jobs:
        if os.path.exists(os.path.join(work, name, 'done.json')):
            continue
        shutil.rmtree(os.path.join(work, name), ignore_errors=True)
        print('$ OMP_NUM_THREADS=%d python %s %s' % (threads, os.path.relpath(script, ROOT),
                                                     ' '.join(args)), file=sys.stderr)
        log = open(os.path.join(work, name + '.log'), 'w')
        procs.append((name, time.time(), subprocess.Popen(
            [sys.executable, script, *args], cwd=ROOT, env=env, stdout=log, stderr=log)))
    running = {p.pid: (name, t0, p) for name, t0, p in procs}
    while running:  # each as it ends: its own wall time
        pid, status, usage = os.wait4(-1, 0)
        if pid not in running:
            continue
        name, t0, p = running.pop(pid)
        p.returncode = status
        assert status == 0, open(os.path.join(work, name + '.log')).read()[-3000:]
        done = {'wall_s': time.time() - t0, 'cpu_s': usage.ru_utime + usage.ru_stime}
        json.dump(done, open(os.path.join(work, name, 'done.json'), 'w'))


def curve(name):
    # (val rows [(step, tokens, loss)], median step seconds after the first log interval,
    # the run's wall and CPU seconds)
    rows = [json.loads(line) for line in open(os.path.join(work, name, 'metrics.jsonl'))]
    vals = [(r['iter'], r['tokens'], r['val_loss']) for r in rows if 'val_loss' in r]
    tps = [r['tokens_per_sec'] for r in rows if 'tokens_per_sec' in r]
    per_step = rows[-1]['tokens'] / rows[-1]['iter']
    step_s = float(np.median([per_step / t for t in tps[1:]]))  # (the first: compiling)
    done = json.load(open(os.path.join(work, name, 'done.json')))
    return vals, step_s, done


def reach(vals, target):
    # the (step, tokens) where the val curve first reaches target, linear between evaluations;
    # None if it never does
    for (s0, t0, l0), (s1, t1, l1) in zip(vals, vals[1:]):
        if l1 <= target:
            f = (l0 - target) / (l0 - l1)
            return s0 + f * (s1 - s0), t0 + f * (t1 - t0)
    return None


def sweep_jobs(model, steps):
    # AdamW at each of lrs (wide_lrs), Muon at each of muon_lrs: (name, args)
    rates = {'tiny': lrs, 'wide': wide_lrs}[model]
    return [(f'{model}_{arm}_{r:g}', args_of(model, arm, r, steps, f'{model}_{arm}_{r:g}'))
            for arm, rates in (('adamw', rates), ('muon', muon_lrs))
            for r in map(float, rates.split(','))]


def sweep(model, steps):
    # the final val loss of each run; the best of each arm
    curves = {name: curve(name) for name, _ in sweep_jobs(model, steps)}
    finals = {name: c[0][-1][2] for name, c in curves.items()}
    print(f'\n{model}, {steps} steps: final val loss per learning rate\n')
    print('| arm | lr | final val loss | median step s |\n|---|---|---|---|')
    for name, loss in finals.items():
        print(f"| {name.split('_')[1]} | {name.split('_')[2]} | {loss:.4f} | "
              f"{curves[name][1]:.3f} |")
    step = {arm: np.median([c[1] for n, c in curves.items() if f'_{arm}_' in n])
            for arm in ('adamw', 'muon')}
    print(f"\nper-step time, Muon/AdamW, medians over the sweep's runs: "
          f"{step['muon'] / step['adamw']:.3f}")
    best = {arm: min((n for n in finals if f'_{arm}_' in n), key=finals.get)
            for arm in ('adamw', 'muon')}
    return best['adamw'], best['muon']


def side_by_side(title, adamw, muon):
    # AdamW's final val loss; the tokens, steps and step seconds Muon takes to reach it
    (a_vals, a_step, a_done), (m_vals, m_step, m_done) = curve(adamw), curve(muon)
    target = a_vals[-1][2]
    got = reach(m_vals, target)
    a_s = a_vals[-1][0] * a_step
    to = 'not reached'
    if got:
        to = (f'{got[1]:,.0f} tokens ({got[1] / a_vals[-1][1]:.2f}×), step {got[0]:.0f}, '
              f'{got[0] * m_step:.0f} s of steps ({got[0] * m_step / a_s:.2f}×)')
    print(f'\n{title}\n')
    print('| arm (lr) | final val loss | median step s | steps s | run wall s | run CPU s |')
    print('|---|---|---|---|---|---|')
    for name, (vals, step, done) in ((adamw, (a_vals, a_step, a_done)),
                                     (muon, (m_vals, m_step, m_done))):
        print(f"| {name.split('_')[1]} ({name.split('_')[2]}) | {vals[-1][2]:.4f} | {step:.3f} | "
              f"{vals[-1][0] * step:.0f} | {done['wall_s']:.0f} | {done['cpu_s']:.0f} |")
    print(f'\nMuon to AdamW\'s final {target:.4f}: {to}; per-step time Muon/AdamW '
          f'{m_step / a_step:.3f} (the runs ran at once)')
    print('val curves (step: AdamW, Muon): ' + ', '.join(
        f'{a[0]}: {a[2]:.3f}, {m[2]:.3f}' for a, m in zip(a_vals, m_vals)))


def triples_rate(name, known):
    # make demo's sample command on this run's checkpoint: the share of the samples' word
    # triples found in the training text (tests/test_readme.py's measure)
    start = 'The dictionary'
    out = os.path.relpath(os.path.join(work, name), ROOT)
    p = subprocess.run([sys.executable, 'sample.py', f'--out_dir={out}', f'--start={start}',
                        '--num_samples=10', '--max_new_tokens=100', '--top_k=40'],
                       cwd=ROOT, capture_output=True, text=True,
                       env=dict(os.environ, OMP_NUM_THREADS=str(threads)), timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    open(os.path.join(work, name + '.samples.txt'), 'w').write(p.stdout)
    samples = p.stdout[p.stdout.index(start):].split('\n---------------\n')[:-1]
    triples = [t for text in samples for t in word_triples(text)]
    return sum(t in known for t in triples) / len(triples), len(triples), len(samples)


def word_triples(text):
    words = re.findall(r'[A-Za-z]+', text)
    return list(zip(words, words[1:], words[2:]))


os.makedirs(work, exist_ok=True)
script_path, source = train_py()
if not muon_lrs:
    muon_lrs = '1e-2,2e-2,4e-2' if 'repository' in source else '3e-3,6e-3,1.2e-2'
print(f'Muon from {source}; OMP_NUM_THREADS={threads} per run, a stage\'s runs at once',
      file=sys.stderr)
best_file = os.path.join(work, 'best.json')
if stage in ('sweep', 'all'):
    run_all(script_path, sweep_jobs('tiny', sweep_steps) + sweep_jobs('wide', wide_steps))
    a, m = sweep('tiny', sweep_steps)
    side_by_side(f'gpt_tiny, {sweep_steps} steps, best lr of each arm', a, m)
    wa, wm = sweep('wide', wide_steps)
    side_by_side(f'4 layers × 256 wide, {wide_steps} steps × 1,024 tokens, best lr of each arm',
                 wa, wm)
    json.dump({'adamw': float(a.split('_')[2]), 'muon': float(m.split('_')[2])},
              open(best_file, 'w'))
if stage in ('demo', 'all'):
    best = json.load(open(best_file)) if not (best_lr and best_muon_lr) else {}
    lr, mlr = best_lr or best['adamw'], best_muon_lr or best['muon']
    jobs = [(f'demo_{arm}_{r:g}', args_of('tiny', arm, r, demo_steps, f'demo_{arm}_{r:g}'))
            for arm, r in (('adamw', lr), ('muon', mlr))]
    run_all(script_path, jobs)
    side_by_side(f"gpt_tiny, make demo's {demo_steps} steps, the sweep's best lr of each arm",
                 jobs[0][0], jobs[1][0])
    from hetgpt.data.tokenizer import gpt2_encoding
    train = np.fromfile(os.path.join(ROOT, 'data', 'pydocs', 'train.bin'), dtype=np.uint16)
    known = set(word_triples(gpt2_encoding().decode(train.tolist())))
    print("\nmake demo's samples (10 × 100 tokens, top_k 40, \"The dictionary\"): the share of "
          "their word triples found in the training text\n")
    print('| arm | word triples in the corpus | triples | samples |\n|---|---|---|---|')
    for name, _ in jobs:
        rate, n, k = triples_rate(name, known)
        print(f"| {name.split('_')[1]} | {rate:.3f} | {n} | {k} |")
