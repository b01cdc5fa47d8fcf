"""
Who is in the run: machines that come and go, and the check that they run
the same run.
"""
import glob
import hashlib
import json
import os
import signal
import socket
import time

from collections import Counter

import torch

from hetgpt.data.digest import digest
from hetgpt.errors import end, say


# Membership. A rank's machine is its host and torchrun agent (one per
# machine; under elastic runs a machine leaves or joins as its agent
# does): a checkpoint records them, a resume says who left and who joined
# since.
def machine():
    """This rank's machine: its host name, and under an elastic run its
    torchrun agent's pid ('host/pid')."""
    if 'TORCHELASTIC_RUN_ID' in os.environ:
        return f"{socket.gethostname()}/{os.getppid()}"
    return socket.gethostname()


def membership(was, now):
    """Who left and who joined, from the machines of every rank then
    (was, a checkpoint's) and now: '' if nobody."""
    if not (isinstance(was, list) and all(isinstance(m, str) for m in was)):
        # (a checkpoint from before this was recorded, or a damaged list)
        return ''
    left = Counter(was) - Counter(now)
    joined = Counter(now) - Counter(was)
    if not left and not joined:
        return ''
    said = f"; {len(was)} rank(s) then, {len(now)} now"
    if left:
        said += f"; left: {_machines(left)}"
    if joined:
        said += f"; joined: {_machines(joined)}"
    return said


def _machines(counts):
    """'host-a (2 ranks), host-b (1 rank)' from a Counter of machines."""
    return ', '.join(f"{m} ({n} rank{'s' * (n > 1)})"
                     for m, n in counts.items())


# A machine that joins an elastic run must run the same run: the same
# knobs, the same model.py, train.py and package, the same torch and the
# same data. Otherwise DDP either fails on every rank ("expects same
# model") or, with equal shapes, silently averages two different models.
def fingerprint(config, data_files):
    """What makes this run this run: its config, the digests of its code,
    its torch and its data files' content (their sha256, cached)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    root = os.path.dirname(package)
    code = {name: _digest([os.path.join(root, name)])
            for name in ('model.py', 'train.py')}
    pattern = os.path.join(package, '**', '*.py')
    code['hetgpt'] = _digest(sorted(glob.glob(pattern, recursive=True)))
    data = {os.path.basename(p): digest(p) for p in data_files}
    return {'config': config, 'code': code, 'torch': torch.__version__,
            'data': data}


def _digest(paths):
    """The first 16 hex digits of the sha256 of the files' bytes, in
    order."""
    data = b''.join(open(p, 'rb').read() for p in paths)
    return hashlib.sha256(data).hexdigest()[:16]


def differences(mine, theirs):
    """What differs between two fingerprints, in words: "n_layer=3 where
    the run has 2, another model.py"."""
    config = mine['config']
    out = [f"{k}={config.get(k)!r} where the run has {v!r}"
           for k, v in theirs['config'].items() if config.get(k) != v]
    out += [f"another {k}" for k in theirs['code']
            if mine['code'].get(k) != theirs['code'][k]]
    if mine['torch'] != theirs['torch']:
        out.append(f"torch {mine['torch']} where the run has "
                   f"{theirs['torch']}")
    data = theirs['data']
    out += [f"another {k} (its content differs: sha256 {str(n)[:12]} "
            f"where the run's is {str(data.get(k))[:12]})"
            for k, n in mine['data'].items() if data.get(k) != n]
    return ', '.join(out)


def the_run(prints, saved=None):
    """Which fingerprint is the run's: the one the checkpoint it resumes
    recorded (saved), when a rank has it; else the most ranks' (a tie:
    the lowest rank's)."""
    keys = [json.dumps(p, sort_keys=True) for p in prints]
    if saved is not None and json.dumps(saved, sort_keys=True) in keys:
        return saved
    counts = Counter(keys)
    best = max(range(len(keys)), key=lambda r: (counts[keys[r]], -r))
    return prints[best]


def same_run(prints, machines, rank, saved=None):
    """Every rank's fingerprint against the run's: a rank of another run
    leaves, and so do the others, to restart without it.

    A rank of another run says so in one line (the first of its machine)
    and ends its machine's torchrun agent: killed, the agent leaves the
    elastic rendezvous open (an agent that exits closes it for every
    machine). The other ranks say who left and exit, so that their agents
    (--max-restarts) restart them without it.
    """
    run = the_run(prints, saved)
    odd = [r for r, p in enumerate(prints) if p != run]
    if not odd:
        return
    mine = machines[rank]
    if rank in odd:
        if rank == min(r for r in odd if machines[r] == mine):
            say(f"error: machine {mine} runs another run than the "
                f"others: {differences(prints[rank], run)}; it leaves, "
                f"the others go on: use the run's config, code, torch "
                f"and data on it")
        if 'TORCHELASTIC_RUN_ID' in os.environ:
            os.kill(os.getppid(), signal.SIGKILL)
        end(2)
    gone = sorted({machines[r] for r in odd})
    if rank == min(r for r in range(len(prints)) if r not in odd):
        say(f"machine(s) {', '.join(gone)} run another run: "
            f"{differences(prints[odd[0]], run)}; they leave, the others "
            f"go on without them (torchrun --max-restarts restarts them)")
    # (the odd agents are killed first: else they might rejoin the next
    # round)
    time.sleep(3)
    end(3)
