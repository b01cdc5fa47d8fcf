"""
One run per out_dir: the lock, and the claim that never overwrites another
run's checkpoints.
"""
import atexit
import json
import os
import socket
import sys

from hetgpt.errors import die
from hetgpt.run import signals
from hetgpt.run.checkpoint import checkpoints, damaged, read_meta


# out_dir lock: one run per out_dir. Two runs at once would interleave
# metrics.jsonl and prune each other's checkpoints. The lock is a file made
# with O_EXCL holding its owner; it is taken over when that owner is gone:
# a dead process on this host, or an earlier attempt of this torchrun job.
def _start_time(pid):
    """The process's start time in clock ticks since boot (Linux), None
    if unknown: a reused pid has another one."""
    try:
        stat = open(f'/proc/{pid}/stat').read()
        return stat.rsplit(')', 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _stale(owner):
    """Whether the lock's owner (its JSON, a dict) is gone."""
    job = os.environ.get('TORCHELASTIC_RUN_ID')
    if owner.get('job') and owner['job'] == job:
        return True  # a restart of this very job (torchrun --max-restarts)
    if owner.get('host') != socket.gethostname():
        return False  # can't tell from here
    start = _start_time(owner.get('pid'))
    return start is None or start != owner.get('start')


def lock(out_dir):
    """Takes out_dir's lock for this process, or dies naming its owner;
    the lock goes at exit."""
    signals.claimed()  # a stop from here on releases the lock (atexit)
    path = os.path.join(out_dir, '.lock')
    me = {'pid': os.getpid(), 'host': socket.gethostname(),
          'start': _start_time(os.getpid()),
          'job': os.environ.get('TORCHELASTIC_RUN_ID')}
    for _ in range(3):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            if os.path.isdir(path) and not os.path.islink(path):
                # never one of ours (ours is a file): someone's folder,
                # left as it is
                die(f"{path} is a directory, not a lock file of a run: "
                    f"move it away (nothing was touched), or use another "
                    f"out_dir")
            try:
                with open(path) as f:
                    owner = json.load(f)
            except (OSError, ValueError):
                owner = None
            if not isinstance(owner, dict):
                # torn by a crash between create and write: nobody's
                owner = {}
            if owner and not _stale(owner):
                die(f"{out_dir} is in use by another run (pid "
                    f"{owner.get('pid')} on {owner.get('host')}); wait for "
                    f"it, use another out_dir, or delete {path} if that "
                    f"run is gone")
            try:
                os.remove(path)
            except FileNotFoundError:
                pass
            except OSError as e:
                # (a folder that lets us create files but not delete them)
                die(f"cannot take over the stale lock {path} "
                    f"({e.strerror}); delete it, or use another out_dir")
            continue
        except OSError as e:
            die(f"cannot make the lock {path} ({e.strerror}); use another "
                f"out_dir")
        with os.fdopen(fd, 'w') as f:
            json.dump(me, f)
        atexit.register(lambda: _unlock(path, me))
        return
    die(f"cannot take the lock {path}: another run keeps taking it; use "
        f"another out_dir")


def claim(config, rank):
    """out_dir for this run, and what it resumes.

    out_dir: writable now (not at the first checkpoint an hour from
    here), locked, and not another run's: a new run over its checkpoints
    would lose its metrics and prune them. Returns the checkpoint to
    resume from (None: a new run) and its hetgpt.json, checked before
    anything starts.
    """
    out_dir, init_from = config['out_dir'], config['init_from']
    try:
        os.makedirs(out_dir, exist_ok=True)
        probe = os.path.join(out_dir, f'.write_test_{rank}')
        open(probe, 'w').close()
        os.remove(probe)
    except OSError as e:
        die(f"out_dir={out_dir!r} is not writable ({e.strerror}); choose "
            f"another out_dir")
    if rank == 0:
        lock(out_dir)
    found = checkpoints(out_dir)
    resumes = init_from in ('resume', 'auto')
    if not resumes and found:
        latest = os.path.basename(found[-1])
        die(f"{out_dir} holds another run's checkpoints (latest "
            f"{latest}): init_from=auto to go on from it, or another "
            f"out_dir")
    if init_from == 'resume' and not found:
        die(f"init_from=resume but {out_dir} has no checkpoint; train "
            f"first or use init_from=auto")
    if not found or not resumes:
        return None, {}
    path = found[-1]
    try:  # (ckpt.load reads it again)
        saved = read_meta(path)
    except (OSError, ValueError) as e:
        damaged(path, e)
    dataset = config['dataset']
    was = saved.get('config', {}).get('dataset', dataset)
    if was != dataset and not config['new_dataset']:
        die(f"{path} was trained on dataset={was!r}, not {dataset!r}: "
            f"new_dataset=True to go on with {dataset!r}, or "
            f"dataset={was!r}")
    was = saved.get('config', {}).get('optimizer', 'adamw')
    if was != config['optimizer']:  # (its state is that optimizer's)
        die(f"{path} was trained with optimizer={was!r}, not "
            f"{config['optimizer']!r}: optimizer={was!r} to resume it, "
            f"or another out_dir")
    done = saved.get('iter', 0) >= config['max_iters']
    if done and not config['eval_only']:
        if rank == 0:
            print(f"{path} is at iter {saved['iter']}, "
                  f"max_iters={config['max_iters']}: nothing to train; "
                  f"raise max_iters to go on", flush=True)
        sys.exit(0)
    return path, saved


def same_data(path, saved, fingerprint, log):
    """Whether the checkpoint at path (None: a new run; saved: its
    hetgpt.json) trained on the content of this run's data (fingerprint:
    membership's, with its config). Other content dies, unless
    new_dataset; a checkpoint that recorded no digests is noted (log)."""
    if path is None:
        return
    config, now = fingerprint['config'], fingerprint['data']
    was = saved.get('fingerprint')
    if isinstance(was, dict):
        was = was.get('data')
    if not isinstance(was, dict) or not all(
            isinstance(v, str) for v in was.values()) or not was:
        log(f"note: {path} records no digest of its data's content "
            f"(saved before they were): the data it resumes on is not "
            f"checked")
        return
    changed = [k for k in now if was.get(k) != now[k]]
    if not changed:
        return
    files = ' and '.join(f"data/{config['dataset']}/{k}" for k in changed)
    verb = 'holds'
    if len(changed) > 1:
        verb = 'hold'
    said = (f"{path} was trained on other data: {files} {verb} other "
            f"content now (sha256 {now[changed[0]][:12]}, then "
            f"{str(was.get(changed[0]))[:12]})")
    if not config['new_dataset']:
        die(f"{said}; new_dataset=True to go on with it, or put back the "
            f"data it trained on")
    log(f"note: {said}; going on with it (new_dataset=True)")


def _unlock(path, me):
    """Removes the lock at path if it is still this process's (me)."""
    try:
        with open(path) as f:
            if json.load(f) == me:
                os.remove(path)
    except (OSError, ValueError):
        pass
