"""
Plot a run's metrics.jsonl: train and val loss against tokens trained, the learning rate on a
second y axis.
  python plot.py out/tiny    # writes out/tiny/loss.png
"""
import json
import os
import sys

if len(sys.argv) != 2:
    sys.exit("usage: python plot.py OUT_DIR  (reads OUT_DIR/metrics.jsonl, writes OUT_DIR/loss.png)")
out_dir = sys.argv[1]
try:
    import matplotlib
except ImportError:
    sys.exit("plot.py needs matplotlib: pip install matplotlib")
matplotlib.use('Agg')  # files only: no display needed
import matplotlib.pyplot as plt

path = os.path.join(out_dir, 'metrics.jsonl')
if not os.path.isfile(path):
    sys.exit(f"no {path}: train first (python train.py configs/gpt_tiny.py)")
train, val = {}, {}
for line in open(path):
    try:
        row = json.loads(line)
    except json.JSONDecodeError:  # the last line may be half written while training runs
        continue
    # keyed by iter: after a resume the same iters come again, and the later rows are the run's
    if row.get('loss') is not None:
        train[row['iter']] = row
    if row.get('val_loss') is not None:
        val[row['iter']] = row
if not train and not val:
    sys.exit(f"no train or eval rows in {path} yet")
train = [train[i] for i in sorted(train)]
val = [val[i] for i in sorted(val)]

fig, ax = plt.subplots(figsize=(9, 5))
ax.plot([r['tokens'] for r in train], [r['loss'] for r in train], lw=1, label='train loss')
ax.plot([r['tokens'] for r in val], [r['val_loss'] for r in val], 'o-', label='val loss')
ax.set_xlabel('tokens')
ax.set_ylabel('loss')
ax.grid(alpha=0.3)
lr = ax.twinx()
lr.plot([r['tokens'] for r in train if 'lr' in r], [r['lr'] for r in train if 'lr' in r],
        color='gray', ls='--', lw=1, label='lr')
lr.set_ylabel('learning rate')
lr.set_ylim(bottom=0)
lines = ax.get_lines() + lr.get_lines()
ax.legend(lines, [l.get_label() for l in lines], loc='upper right')
ax.set_title(out_dir)
fig.tight_layout()
fig.savefig(os.path.join(out_dir, 'loss.png'), dpi=120)
print(f"wrote {os.path.join(out_dir, 'loss.png')}")
