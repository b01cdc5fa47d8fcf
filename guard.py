"""
What keeps a run safe from other runs, bad input and its own faults, for train.py: the claim on
out_dir (writable, locked, another run's checkpoints never overwritten), the metrics file (rewritten
atomically, appended without ever stopping training), the checks of a token file, the signals that
stop a run at a checkpoint, and the watchdog that ends a job whose ranks stopped answering.
"""
import atexit
import functools
import hashlib
import json
import os
import pickle
import shutil
import signal
import socket
import sys
import threading
import time

from collections import Counter
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from ckpt import checkpoints, lost_peer, why
from configurator import die, say


# -----------------------------------------------------------------------------
# out_dir lock: one run per out_dir. Two runs at once would interleave metrics.jsonl and prune each
# other's checkpoints. The lock is a file made with O_EXCL holding its owner; it is taken over when
# that owner is gone: a dead process on this host, or an earlier attempt of this torchrun job.
def _start_time(pid):
    # The process's start time in clock ticks since boot (Linux): a reused pid has another one.
    try:
        return open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _stale(owner):
    if owner.get('job') and owner['job'] == os.environ.get('TORCHELASTIC_RUN_ID'):
        return True  # a restart of this very job (torchrun --max-restarts)
    if owner.get('host') != socket.gethostname():
        return False  # can't tell from here
    start = _start_time(owner.get('pid'))
    return start is None or start != owner.get('start')


def lock(out_dir):
    path = os.path.join(out_dir, '.lock')
    me = {'pid': os.getpid(), 'host': socket.gethostname(), 'start': _start_time(os.getpid()),
          'job': os.environ.get('TORCHELASTIC_RUN_ID')}
    for _ in range(3):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            if os.path.isdir(path) and not os.path.islink(path):
                # never one of ours (ours is a file): someone's folder, left as it is
                die(f"{path} is a directory, not a lock file of a run: move it away (nothing "
                    f"was touched), or use another out_dir")
            try:
                owner = json.load(open(path))
                assert isinstance(owner, dict)
            except (OSError, ValueError, AssertionError):
                owner = {}  # torn by a crash between create and write: nobody's
            if owner and not _stale(owner):
                die(f"{out_dir} is in use by another run (pid {owner.get('pid')} on "
                    f"{owner.get('host')}); wait for it, use another out_dir, or delete "
                    f"{path} if that run is gone")
            try:
                os.remove(path)
            except FileNotFoundError:
                pass
            except OSError as e:  # (a folder that lets us create files but not delete them)
                die(f"cannot take over the stale lock {path} ({e.strerror}); delete it, or use "
                    f"another out_dir")
            continue
        except OSError as e:
            die(f"cannot make the lock {path} ({e.strerror}); use another out_dir")
        with os.fdopen(fd, 'w') as f:
            json.dump(me, f)
        atexit.register(lambda: _unlock(path, me))
        return
    die(f"cannot take the lock {path}: another run keeps taking it; use another out_dir")


def claim(out_dir, rank, init_from):
    # out_dir for this run: writable now (not at the first checkpoint an hour from here), locked,
    # and not another run's: a new run over its checkpoints would lose its metrics and prune them.
    # Returns the checkpoints found there.
    try:
        os.makedirs(out_dir, exist_ok=True)
        probe = os.path.join(out_dir, f'.write_test_{rank}')
        open(probe, 'w').close()
        os.remove(probe)
    except OSError as e:
        die(f"out_dir={out_dir!r} is not writable ({e.strerror}); choose another out_dir")
    if rank == 0:
        lock(out_dir)
    found = checkpoints(out_dir)
    if init_from not in ('resume', 'auto') and found:
        die(f"{out_dir} holds another run's checkpoints (latest {os.path.basename(found[-1])}): "
            f"init_from=auto to go on from it, or another out_dir")
    if init_from == 'resume' and not found:
        die(f"init_from=resume but {out_dir} has no checkpoint; train first or use init_from=auto")
    return found


def _unlock(path, me):
    try:
        if json.load(open(path)) == me:
            os.remove(path)
    except (OSError, ValueError):
        pass


# -----------------------------------------------------------------------------
# metrics.jsonl: a row per log line and eval. A kill or a full disk can tear the last line.
def read_rows(path):
    rows = []
    if os.path.exists(path):
        for line in open(path, errors='replace'):
            try:
                row = json.loads(line)
            except ValueError:
                continue  # a torn line
            if isinstance(row, dict) and isinstance(row.get('iter'), int):
                rows.append(row)
    return rows


def rewrite_rows(path, rows):
    # Through a temporary file and a rename: a crash leaves the old file or the new, never half.
    tmp = path + '.tmp'
    with open(tmp, 'w') as f:
        f.writelines(json.dumps(r) + '\n' for r in rows)
    os.replace(tmp, path)


_append_failed = []


def append_row(path, row):
    # Never stops training: a full or read-only disk gets one line, once (the next checkpoint
    # will say what to do if the disk stays full).
    try:
        with open(path, 'a') as f:
            f.write(json.dumps(row) + '\n')
    except OSError as e:
        if not _append_failed:
            say(f"warning: cannot append to {path} ({e.strerror}); training goes on, the rows "
                f"are in the log lines")
        _append_failed.append(row['iter'])


class Metrics:
    # Rank 0's record of the run: a row per log line and evaluation in metrics.jsonl, and in wandb
    # when asked (offline unless WANDB_API_KEY is set; a failure there only disables it). It starts
    # by dropping checkpoints a killed run left half-written and the rows past the iteration the run
    # starts from (a torn last line is skipped), then writes first_row: the plan.
    def __init__(self, out_dir, iter_num, first_row, wandb_init=None):
        for d in os.listdir(out_dir):
            if d.endswith('.tmp'):
                shutil.rmtree(os.path.join(out_dir, d), ignore_errors=True)
        self.path, self.wandb = os.path.join(out_dir, 'metrics.jsonl'), None
        rows = read_rows(self.path) if iter_num else []
        rewrite_rows(self.path, [r for r in rows if r['iter'] <= iter_num] + [first_row])
        if wandb_init:
            try:
                import wandb
                mode = os.environ.get('WANDB_MODE') or \
                    ('online' if os.environ.get('WANDB_API_KEY') else 'offline')
                self.wandb = wandb.init(**wandb_init, mode=mode, dir=out_dir,
                                        settings=wandb.Settings(init_timeout=30))
            except Exception as e:
                print(f"wandb disabled: {type(e).__name__}: {e}", flush=True)

    def __call__(self, row):
        append_row(self.path, row)
        if self.wandb:
            self.wandb.log(row, step=row['iter'])

    def finish(self):
        if self.wandb:
            self.wandb.finish()


# -----------------------------------------------------------------------------
# data: a flat uint16 token file, checked as untrusted input
class PlainUnpickler(pickle.Unpickler):
    def find_class(self, module, name):  # dicts, strings and numbers only: no code can run
        raise pickle.UnpicklingError(f"it refers to {module}.{name}")


def dataset_vocab(folder):
    # nanoGPT's prepare scripts of other tokenizers (shakespeare_char: 65 characters) leave
    # meta.pkl = {'vocab_size', 'stoi', 'itos'} beside the tokens; None where there is none.
    path = os.path.join(folder, 'meta.pkl')
    if not os.path.exists(path):
        return None
    try:
        with open(path, 'rb') as f:
            meta = PlainUnpickler(f).load()
    except Exception as e:  # damaged, or a pickle that would import something
        die(f"cannot read {path} ({type(e).__name__}: {e}); it should be a nanoGPT meta.pkl "
            f"(a dict with vocab_size): prepare the data again or remove it")
    vocab = meta.get('vocab_size') if isinstance(meta, dict) else None
    if type(vocab) is not int or vocab < 1:
        die(f"{path} has no positive int vocab_size (got {vocab!r}): prepare the data again")
    return meta


def open_tokens(path, block_size, vocab_size, dataset):
    if not os.path.exists(path):
        die(f"no {path}: run python data/prepare.py --dataset {dataset} "
            f"(or --input FILES --name {dataset})")
    if not os.path.isfile(path):
        die(f"{path} is not a file ({'a directory' if os.path.isdir(path) else 'not regular'}): "
            f"move it away and run python data/prepare.py for {dataset} again")
    if os.path.getsize(path) % 2:
        die(f"{path} has an odd number of bytes: it is truncated or not uint16; "
            f"run data/prepare.py again")
    try:
        tokens = np.memmap(path, dtype=np.uint16, mode='r') if os.path.getsize(path) else \
            np.zeros(0, np.uint16)
        if len(tokens) <= block_size + 1:
            die(f"{path} has {len(tokens)} tokens, fewer than block_size+1={block_size + 1}; "
                f"lower block_size or prepare more data")
        top = max_token(path, tokens)
    except OSError as e:  # unreadable (permissions, an I/O error)
        die(f"cannot read {path} ({e.strerror or e}); check its permissions or prepare it again")
    if top >= vocab_size:
        die(f"{path} holds token id {top}, not below vocab_size={vocab_size}: wrong tokenizer "
            f"or dtype, or raise vocab_size")
    return tokens


# Every token id of a file below vocab_size, checked once (chunked, vectorised) and the file's
# largest id cached next to it, keyed by its size, modification time and content: a blake2b of
# SAMPLES blocks of SAMPLE_BYTES, the first, the last and the rest evenly spaced between (the whole
# file when they cover it), about 4 MB read whatever the file's size. The content key catches a
# file copied over another of the same size with its times kept (cp -p, rsync -t); a change that
# falls between the blocks is what check_batch meets, before a step uses it.
SAMPLES, SAMPLE_BYTES = 66, 1 << 16


def content_key(path, size):
    h = hashlib.blake2b(str(size).encode(), digest_size=16)
    with open(path, 'rb') as f:
        if size <= SAMPLES * SAMPLE_BYTES:
            for block in iter(lambda: f.read(1 << 20), b''):
                h.update(block)
        else:
            for i in range(SAMPLES):
                f.seek(i * (size - SAMPLE_BYTES) // (SAMPLES - 1))
                h.update(f.read(SAMPLE_BYTES))
    return h.hexdigest()


def max_token(path, tokens, chunk=1 << 26):
    st = os.stat(path)
    key = {'size': st.st_size, 'mtime_ns': st.st_mtime_ns,
           'blake2b': content_key(path, st.st_size)}
    cache = path + '.max.json'
    try:
        cached = json.load(open(cache))
        if isinstance(cached, dict) and {k: cached.get(k) for k in key} == key:
            return int(cached['max'])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    top = max((int(tokens[i:i + chunk].max()) for i in range(0, len(tokens), chunk)), default=0)
    try:  # a read-only data directory just means checking again next time
        with open(cache + f'.{os.getpid()}', 'w') as f:
            json.dump({**key, 'max': top}, f)
        os.replace(cache + f'.{os.getpid()}', cache)
    except OSError:
        pass
    return top


def check_batch(path, windows, offsets, vocab_size):
    # A batch as train.py takes it: row r holds the tokens of the file at path from offsets[r] on.
    # One max() per batch; only a bad id is looked for, and named with its offset in tokens. (Under
    # torchrun each rank checks its own rows; die prints the line once.)
    if windows.size and int(windows.max()) >= vocab_size:
        rows, cols = np.nonzero(windows >= vocab_size)
        at = np.asarray(offsets, dtype=np.int64)[rows] + cols
        first = int(np.argmin(at))
        die(f"{path} holds token id {int(windows[rows[first], cols[first]])} at offset "
            f"{int(at[first])}, not below vocab_size={vocab_size}: the file changed where its "
            f"cached check ({path}.max.json) samples none of it; no step used it: delete that "
            f"file to check it whole at start-up, or prepare the data again")
    return windows


# -----------------------------------------------------------------------------
# Signals. Ctrl-C, preemption (SIGTERM) or Slurm's warning (SIGUSR1) while training: noted, and the
# loop checkpoints at the end of the step; a second Ctrl-C stops at once.
class Signals(list):

    def __init__(self, out_dir):
        super().__init__()
        self.out_dir = out_dir
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
            signal.signal(sig, self.on_signal)

    def on_signal(self, signum, frame):
        self.append(signum)
        if self.count(signal.SIGINT) > 1:
            die(f"interrupted twice: stopped without a checkpoint; the last is "
                f"{(checkpoints(self.out_dir) or ['none'])[-1]}")


# -----------------------------------------------------------------------------
# Updates skipped for a non-finite loss or gradient (the batch is not seen again). Counted on the
# device, so that a step never waits for the host: steps in a row, the most of them in a row and
# their count since the last log line; the log line says so, and `limit` in a row stop the run.
class BadSteps:

    def __init__(self, device, limit, out_dir):
        self.run = self.worst = self.skipped = torch.zeros((), device=device)
        self.limit, self.out_dir = limit, out_dir

    def add(self, bad):
        self.run = (self.run + 1) * bad
        self.worst, self.skipped = torch.maximum(self.worst, self.run), self.skipped + bad

    def report(self, iter_num, steps, log):
        if self.skipped.item():
            log(f"iter {iter_num}: {int(self.skipped)} of the last {steps} updates skipped: "
                f"loss or gradients not finite")
        if self.worst.item() >= self.limit:
            die(f"{int(self.worst)} steps in a row with non-finite loss or gradients, by iter "
                f"{iter_num - 1}; the last good checkpoint is "
                f"{(checkpoints(self.out_dir) or ['none yet'])[-1]}: lower learning_rate or "
                f"check the data, then init_from=resume")
        self.worst, self.skipped = self.run.clone(), torch.zeros_like(self.skipped)


# -----------------------------------------------------------------------------
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


# A machine that joins an elastic run must run the same run: the same knobs, the same model.py
# and train.py, the same torch and the same data. Otherwise DDP either fails on every rank
# ("expects same model") or, with equal shapes, silently averages two different models.
def fingerprint(config, data_files):
    here = os.path.dirname(os.path.abspath(__file__))
    code = {name: hashlib.sha256(open(os.path.join(here, name), 'rb').read()).hexdigest()[:16]
            for name in ('model.py', 'train.py')}
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
        sys.exit(2)
    gone = sorted({machines[r] for r in odd})
    if rank == min(r for r in range(len(prints)) if r not in odd):
        say(f"machine(s) {', '.join(gone)} run another run: {differences(prints[odd[0]], run)}; "
            f"they leave, the others go on without them (torchrun --max-restarts restarts them)")
    time.sleep(3)  # (the odd agents are killed first: else they might rejoin the next round)
    sys.exit(3)


# -----------------------------------------------------------------------------
# The process group. Every run has one, one rank or many, so that train.py has one path.
def start_group(backend, rank, world_size, stall_timeout):
    store = None
    if world_size > 1:
        # torchrun's own store (its default) outlives a restart of the group: without a prefix per
        # attempt the new ranks can read the dead ones' addresses and fail to connect. With
        # TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (elastic runs, README) rank 0 hosts a new store
        # each round, and agents that joined at different times count their restarts apart.
        store, _, _ = next(dist.rendezvous('env://'))
        shared = os.environ.get('TORCHELASTIC_USE_AGENT_STORE') == 'True'
        attempt = os.environ.get('TORCHELASTIC_RESTART_COUNT', 0) if shared else 'new'
        store = dist.PrefixStore(f"attempt_{attempt}", store)
    # A silent rank is found by the watchdog; the group's own timeout only backs it up.
    dist.init_process_group(backend, store=store or dist.HashStore(), rank=rank,
                            world_size=world_size,
                            timeout=timedelta(seconds=5 * stall_timeout or 1800))
    watchdog = Watchdog(store, rank, world_size, stall_timeout, limit_factor=4)
    if world_size > 1:
        sys.excepthook = functools.partial(_lost_peer, sys.excepthook, rank)
    # On any exit, a one-line error included: the watchdog's thread and the group's own threads
    # stopped before the interpreter tears down (left running, they can abort it at exit:
    # "terminate called without an active exception").
    atexit.register(lambda: watchdog.stop() or dist.is_initialized() and
                    dist.destroy_process_group())
    return watchdog


def _lost_peer(default, rank, kind, e, tb):
    # A rank whose peer died (its machine gone, killed, out of memory) fails in the collective it
    # was in: one line for that, not a traceback from the middle of the backward
    if lost_peer(e):
        say(f"error: rank {rank}: a collective failed, another rank is probably gone "
            f"({why(e)}); torchrun --max-restarts resumes from the last "
            f"checkpoint, or use init_from=resume")
    else:
        default(kind, e, tb)


# -----------------------------------------------------------------------------
# Watchdog. A rank that stops (SIGSTOP, a swapped-out host, a frozen GPU) leaves the others waiting
# in a collective, by default for 30 minutes. Each rank's thread bumps a counter in the rendezvous
# store every few seconds; when this rank's main thread has made no progress for `limit` seconds,
# it looks for counters that stopped moving, names those ranks and ends this process, so that
# torchrun (--max-restarts) restarts the group from the last checkpoint.
class Watchdog:

    def __init__(self, store, rank, world_size, timeout, limit_factor):
        # store None or timeout 0: no watchdog (one process has nobody to wait for)
        self.store, self.rank, self.world_size = store, rank, world_size
        self.timeout, self.limit = timeout, timeout * limit_factor
        self.period = max(0.2, min(5.0, timeout / 8))
        self.last, self.stopped, self.thread = time.monotonic(), threading.Event(), None
        if store is not None and timeout:
            store.set(f'who/{rank}', f"{socket.gethostname()} pid {os.getpid()}")
            store.add(f'alive/{rank}', 1)
            self.thread = threading.Thread(target=self._watch, daemon=True)
            self.thread.start()

    def stop(self):
        # Before the process group goes: a thread still in a store call while the interpreter
        # tears down can abort the process ("terminate called without an active exception").
        self.stopped.set()
        if self.thread:
            self.thread.join()

    def progress(self, limit_factor=None):
        # Called by the main thread as it works. limit_factor: the wait in units of timeout from
        # now on (more for start-up, with its compiles, and for checkpoint writes); None: as it was.
        self.last = time.monotonic()
        if limit_factor is not None:
            self.limit = self.timeout * limit_factor

    def _counters(self):
        return [self.store.add(f'alive/{r}', 0) for r in range(self.world_size)]

    def _watch(self):
        try:
            self._run()
        except Exception:  # the store is gone: torchrun itself is ending the job
            pass

    def _run(self):
        while not self.stopped.wait(self.period):
            self.store.add(f'alive/{self.rank}', 1)
            if time.monotonic() - self.last < self.limit:
                continue
            before = self._counters()
            for _ in range(4):  # beat on while the others get three chances to beat
                if self.stopped.wait(self.period):
                    return
                self.store.add(f'alive/{self.rank}', 1)
            if time.monotonic() - self.last < self.limit:
                continue  # the main thread moved on meanwhile
            silent = [r for r, a, b in zip(range(self.world_size), before, self._counters())
                      if a == b and r != self.rank]
            waited = time.monotonic() - self.last
            if silent:
                names = ', '.join(f"rank {r} ({self.store.get(f'who/{r}').decode()})"
                                  for r in silent)
                cause = f"{names} stopped answering"
            elif self.limit > self.timeout:
                continue  # start-up or a checkpoint: compiles and writes take long on live ranks
            else:
                cause = "every rank is alive but none finished its step (a hung device?)"
            say(f"error: rank {self.rank}: no progress for {waited:.0f} s: {cause}; exiting so "
                f"that torchrun --max-restarts resumes from the last checkpoint (stall_timeout "
                f"sets the wait)")
            sys.stdout.flush()
            os._exit(2)
