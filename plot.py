"""
Plot a run's metrics.jsonl: train and val loss against tokens trained, the learning rate on a
second y axis. Several runs: their losses against tokens in one plot, a colour each.
  python plot.py out/tiny             # writes out/tiny/loss.png
  python plot.py out/ddp out/local    # writes out/ddp/compare.png
"""
import os
import sys

from hetgpt.errors import die
from hetgpt.run.metrics import read_rows


def number(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool)


if '-h' in sys.argv[1:] or '--help' in sys.argv[1:]:
    try:
        print(f"usage: python plot.py OUT_DIR [OUT_DIR ...]\n{__doc__.rstrip()}", flush=True)
    except BrokenPipeError:  # `--help | head -1`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (the exit's flush)
    sys.exit(0)
if len(sys.argv) < 2 or any(a.startswith('-') for a in sys.argv[1:]):
    die("usage: python plot.py OUT_DIR [OUT_DIR ...]  (reads each OUT_DIR/metrics.jsonl, writes "
        "the first's loss.png, or with several its compare.png)")


def losses(out_dir):
    # (train rows, val rows) of a run's metrics.jsonl, by iter
    if os.path.isfile(out_dir):
        die(f"{out_dir} is a file: give the run's folder, python plot.py OUT_DIR")
    path = os.path.join(out_dir, 'metrics.jsonl')
    if not os.path.isfile(path):
        die(f"no {path}: train first (python train.py configs/gpt_tiny.py)")
    train, val = {}, {}
    try:
        rows = read_rows(path)  # (the last line may be half written while training runs)
    except OSError as e:
        die(f"cannot read {path} ({e.strerror})")
    for row in rows:
        if not number(row.get('tokens')):
            continue  # not a row train.py writes
        # keyed by iter: after a resume the same iters come again, and the later rows are the run's
        if number(row.get('loss')):
            train[row['iter']] = row
        if number(row.get('val_loss')):
            val[row['iter']] = row
    if not train and not val:
        die(f"no train or eval rows in {path} yet")
    return [train[i] for i in sorted(train)], [val[i] for i in sorted(val)]


runs = {d: losses(d) for d in sys.argv[1:]}
out_dir = sys.argv[1]
png = os.path.join(out_dir, 'loss.png' if len(runs) == 1 else 'compare.png')
if os.path.exists(png) and not os.path.isfile(png):
    die(f"{png} is not a file: move it away")
if not os.access(out_dir, os.W_OK):
    die(f"{out_dir} is not writable: plot a copy of metrics.jsonl elsewhere")
try:
    import matplotlib
except ImportError:
    die("plot.py needs matplotlib: pip install matplotlib")
matplotlib.use('Agg')  # files only: no display needed
import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(9, 5))
for i, (name, (train, val)) in enumerate(runs.items()):
    c = f'C{i}' if len(runs) > 1 else None  # (one run: train and val in colours of their own)
    tag = f"{name}: " if len(runs) > 1 else ''
    ax.plot([r['tokens'] for r in train], [r['loss'] for r in train], lw=1, color=c,
            alpha=0.5 if c else 1, label=f'{tag}train loss')
    ax.plot([r['tokens'] for r in val], [r['val_loss'] for r in val], 'o-', color=c,
            label=f'{tag}val loss')
ax.set_xlabel('tokens')
ax.set_ylabel('loss')
ax.grid(alpha=0.3)
lines = ax.get_lines()
if len(runs) == 1:  # the learning rate on a second axis
    lr = ax.twinx()
    lr.plot([r['tokens'] for r in train if number(r.get('lr'))],
            [r['lr'] for r in train if number(r.get('lr'))],
            color='gray', ls='--', lw=1, label='lr')
    lr.set_ylabel('learning rate')
    lr.set_ylim(bottom=0)
    lines += lr.get_lines()
ax.legend(lines, [l.get_label() for l in lines], loc='upper right')
ax.set_title(' vs '.join(runs))
fig.tight_layout()
try:  # into a .tmp file first: a failed write leaves the last loss.png as it was
    fig.savefig(png + '.tmp', dpi=120, format='png')
    os.replace(png + '.tmp', png)
except OSError as e:
    if os.path.isfile(png + '.tmp'):
        os.remove(png + '.tmp')
    die(f"cannot write {png} ({e.strerror or e})")
print(f"wrote {png}")
