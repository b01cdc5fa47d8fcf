"""
What a machine leaving or joining costs an elastic run (issue 14): seconds from the event (the
machine killed; the new agent started) to the first step trained after it. Agents A and B train
(torchrun --nnodes=1:2, c10d rendezvous on localhost, one rank each, as tests/test_membership.py);
B is killed, agent and worker, 1 s after the run's first checkpoint; once A trains alone, C joins.
Each cost is split in two at the new worker's plan table: the rendezvous and the worker's start
(up to and including its probe step), then the resume and the first step.

  python bench/elastic.py                                # torchrun's default rendezvous timings
  python bench/elastic.py --rdzv_conf=last_call_timeout=2,keep_alive_interval=1,keep_alive_max_attempt=3
"""
import argparse
import os
import re
import shutil
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, 'tests'))
from elastic_run import leave_and_join  # noqa: E402
from trainer import TINY, make_dataset  # noqa: E402

p = argparse.ArgumentParser(description=__doc__.split('\n')[1],
                            formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument('--rdzv_conf', default='', help="torchrun's --rdzv-conf for every agent")
p.add_argument('--slow', type=float, default=0.05,
               help='seconds added to each forward per sequence, so that the run outlasts both events')
p.add_argument('--max_iters', type=int, default=300)
p.add_argument('--keep', action='store_true', help='keep the work directory (data, checkpoints)')
args = p.parse_args()

work = tempfile.mkdtemp(prefix='hetgpt_elastic_')
make_dataset(work)
train_args = TINY + ['--batch_size=4', f'--max_iters={args.max_iters}', '--eval_interval=1000',
                     '--checkpoint_interval=4', '--init_from=auto', '--out_dir=run']
(a, b, c), events = leave_and_join(work, 'run', train_args, 1.0, args.rdzv_conf,
                                   env={'HETGPT_TEST_SLOW_RANK': f'*:{args.slow}'}, timeout=900)
lines = sorted(line for agent in (a, b, c) for line in agent.lines)


def first_after(t, pattern):
    return next(when for when, line in lines if when > t and re.search(pattern, line))


print(f"rdzv_conf: {args.rdzv_conf or '(defaults)'}; torch {__import__('torch').__version__}")
for event, change in (('leave', 'left: '), ('join', 'joined: ')):
    t = events[event]
    start = first_after(t, r'^plan: ')  # the new worker's first line: its plan
    step = first_after(first_after(t, 'resumed from .*' + change), r'^iter \d+: loss')
    print(f"{event}: {step - t:.1f} s to the next step ({start - t:.1f} s to the new plan, then "
          f"{step - start:.1f} s)")
if not args.keep:
    shutil.rmtree(work)
