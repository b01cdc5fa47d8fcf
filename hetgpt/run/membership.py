"""
Who is in the run: machines that come and go, and the check that they run the same run.
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

from hetgpt.errors import end, say


# Membership. A rank's machine is its host and torchrun agent (one per machine; under elastic
# runs a machine leaves or joins as its agent does): a checkpoint records them, a resume says
# who left and who joined since.
def machine():
    return f"{socket.gethostname()}/{os.getppid()}" if 'TORCHELASTIC_RUN_ID' in os.environ \
        else socket.gethostname()


def membership(was, now):
    if not (isinstance(was, list) and all(isinstance(m, str) for m in was)):
        return ''  # (a checkpoint from before this was recorded, or a damaged list)
    left, joined = Counter(was) - Counter(now), Counter(now) - Counter(was)
    if not left and not joined:
        return ''
    name = lambda c: ', '.join(f"{m} ({n} rank{'s' * (n > 1)})" for m, n in c.items())
    return (f"; {len(was)} rank(s) then, {len(now)} now" + (f"; left: {name(left)}" * bool(left))
            + (f"; joined: {name(joined)}" * bool(joined)))


# A machine that joins an elastic run must run the same run: the same knobs, the same model.py,
# train.py and package, the same torch and the same data. Otherwise DDP either fails on every rank
# ("expects same model") or, with equal shapes, silently averages two different models.
def fingerprint(config, data_files):
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    root = os.path.dirname(package)
    digest = lambda paths: hashlib.sha256(b''.join(open(p, 'rb').read() for p in paths))
    code = {name: digest([os.path.join(root, name)]).hexdigest()[:16]
            for name in ('model.py', 'train.py')}
    code['hetgpt'] = digest(sorted(glob.glob(os.path.join(package, '**', '*.py'), recursive=True))).hexdigest()[:16]
    sizes = {os.path.basename(p): os.path.getsize(p) for p in data_files}
    return {'config': config, 'code': code, 'torch': torch.__version__, 'data': sizes}


def differences(mine, theirs):
    # What differs between two fingerprints, in words: "n_layer=3 where the run has 2, model.py"
    out = [f"{k}={mine['config'].get(k)!r} where the run has {v!r}"
           for k, v in theirs['config'].items() if mine['config'].get(k) != v]
    out += [f"another {k}" for k in theirs['code'] if mine['code'].get(k) != theirs['code'][k]]
    if mine['torch'] != theirs['torch']:
        out.append(f"torch {mine['torch']} where the run has {theirs['torch']}")
    out += [f"{k} of {n:,} bytes where the run's has {theirs['data'].get(k, 0):,}"
            for k, n in mine['data'].items() if theirs['data'].get(k) != n]
    return ', '.join(out)


def the_run(prints, saved=None):
    # Which fingerprint is the run's: the one the checkpoint it resumes recorded, when a rank has
    # it; else the most ranks' (a tie: the lowest rank's).
    keys = [json.dumps(p, sort_keys=True) for p in prints]
    if saved is not None and json.dumps(saved, sort_keys=True) in keys:
        return saved
    counts = Counter(keys)
    return prints[max(range(len(keys)), key=lambda r: (counts[keys[r]], -r))]


def same_run(prints, machines, rank, saved=None):
    # Every rank's fingerprint against the run's. A rank of another run says so in one line (the
    # first of its machine) and ends its machine's torchrun agent: killed, the agent leaves the
    # elastic rendezvous open (an agent that exits closes it for every machine). The other ranks
    # say who left and exit, so that their agents (--max-restarts) restart them without it.
    run = the_run(prints, saved)
    odd = [r for r, p in enumerate(prints) if p != run]
    if not odd:
        return
    mine = machines[rank]
    if rank in odd:
        if rank == min(r for r in odd if machines[r] == mine):
            say(f"error: machine {mine} runs another run than the others: "
                f"{differences(prints[rank], run)}; it leaves, the others go on: use the run's "
                f"config, code, torch and data on it")
        if 'TORCHELASTIC_RUN_ID' in os.environ:
            os.kill(os.getppid(), signal.SIGKILL)
        end(2)
    gone = sorted({machines[r] for r in odd})
    if rank == min(r for r in range(len(prints)) if r not in odd):
        say(f"machine(s) {', '.join(gone)} run another run: {differences(prints[odd[0]], run)}; "
            f"they leave, the others go on without them (torchrun --max-restarts restarts them)")
    time.sleep(3)  # (the odd agents are killed first: else they might rejoin the next round)
    end(3)
