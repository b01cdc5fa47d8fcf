"""
How often a process that ran a gloo collective aborts at exit ("terminate called without an
active exception", SIGABRT, pytorch#190489): with errors.skip_teardown (train.py's: os._exit after
the at-exit handlers) and without it (the interpreter's own teardown), in one run. Each child
starts a one-rank gloo group as train.py does (process_group.start), holds it as a wrapped model
would, gathers one object and exits 2 at once, as a mistake found while resuming does (CI saw it
once, in test_ckpt_trust). The two settings alternate, LANES children at a time, so that both
meet the same load.

  python bench/exit_abort.py               # 200 children per setting, 4 at a time
  python bench/exit_abort.py 300 4

Prints, per setting, the children that did not exit 2 and what they said.
"""
import collections
import concurrent.futures
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = '''
import sys
sys.path.insert(0, sys.argv[2])
from hetgpt import errors
errors.last_at_exit()  # (as train.py, before torch)
import torch.distributed as dist
from hetgpt.run import process_group
process_group.start('gloo', 'cpu', 0, 1, 0)
errors.teardown = sys.argv[1] == 'teardown'  # (the interpreter's teardown: as before)
held = dist.group.WORLD  # (a DDP or FSDP model holds the group so)
process_group.gather('one object')
errors.die('a mistake found after a collective')
'''


def child(setting):
    p = subprocess.run([sys.executable, '-c', CHILD, setting, ROOT],
                       capture_output=True, text=True, timeout=120)
    return setting, p.returncode, p.stderr.strip().splitlines()[-1:] or ['']


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    lanes = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    settings = ('skip', 'teardown')
    bad = collections.defaultdict(collections.Counter)
    with concurrent.futures.ThreadPoolExecutor(lanes) as pool:
        for setting, rc, last in pool.map(child, settings * n):
            if rc != 2:
                bad[setting][(rc, last[0])] += 1
    for setting in settings:
        wrong = sum(bad[setting].values())
        print(f"{setting}: {wrong} of {n} children did not exit 2 "
              f"({', '.join(f'{c}× rc {rc}: {line}' for (rc, line), c in bad[setting].items())})")


if __name__ == '__main__':
    main()
