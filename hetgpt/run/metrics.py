"""
metrics.jsonl: rank 0's record of a run, written atomically, and the one
reader of it.
"""
import json
import netrc
import os
import re
import secrets
import shutil
import urllib.parse

from hetgpt.errors import say


# metrics.jsonl: a row per log line and eval. A kill or a full disk can
# tear the last line.
def read_rows(path):
    """The rows of path, in order (none if it is not there); raises
    OSError if it can't be read."""
    rows = []
    if os.path.exists(path):
        with open(path, encoding='utf-8', errors='replace') as f:
            for line in f:
                try:
                    row = json.loads(line)
                except ValueError:
                    continue  # a torn line
                if isinstance(row, dict) and type(row.get('iter')) is int:
                    rows.append(row)
    return rows


def rewrite_rows(path, rows):
    """Writes rows to path, through a temporary file and a rename: a
    crash leaves the old file or the new, never half."""
    tmp = path + '.tmp'
    with open(tmp, 'w') as f:
        f.writelines(json.dumps(r) + '\n' for r in rows)
    os.replace(tmp, path)


_append_failed = []


def append_row(path, row):
    """Appends row to path. Never stops training: a full or read-only
    disk gets one line, once (the next checkpoint will say what to do if
    the disk stays full)."""
    try:
        with open(path, 'a') as f:
            f.write(json.dumps(row) + '\n')
    except OSError as e:
        if not _append_failed:
            say(f"warning: cannot append to {path} ({e.strerror}); "
                f"training goes on, the rows are in the log lines")
        _append_failed.append(row['iter'])


def wandb_logged_in():
    """Whether wandb has a key, as wandb itself finds one.

    WANDB_API_KEY, else `wandb login`'s entry in ~/.netrc (NETRC: another
    file) for its host (WANDB_BASE_URL).
    """
    if os.environ.get('WANDB_API_KEY'):
        return True
    base = os.environ.get('WANDB_BASE_URL') or 'https://api.wandb.ai'
    host = urllib.parse.urlparse(base)
    try:
        found = netrc.netrc(os.environ.get('NETRC'))
        return found.authenticators(host.hostname) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def wandb_mode():
    """WANDB_MODE, else online when logged in (wandb_logged_in), else
    offline."""
    mode = os.environ.get('WANDB_MODE')
    if mode:
        return mode
    if wandb_logged_in():
        return 'online'
    return 'offline'


def wandb_run_id(out_dir, resumed):
    """The W&B run's id: one W&B run per hetgpt run.

    Its id is kept in out_dir/wandb_id, so that a resume (a restart, a
    change of machines) continues the same W&B run; a run from scratch
    starts a new one.
    """
    path = os.path.join(out_dir, 'wandb_id')
    try:
        if not resumed:
            raise OSError
        with open(path) as f:
            kept = f.read().strip()
        if re.fullmatch(r'[a-z0-9]{1,64}', kept):
            return kept
    except OSError:
        pass
    made = secrets.token_hex(4)
    with open(path, 'w') as f:
        f.write(made + '\n')
    return made


class Metrics:
    """Rank 0's record of the run: a row per log line and evaluation in
    metrics.jsonl, and in wandb when asked (online when logged in, else
    offline; a failure there only disables it).

    It starts by dropping checkpoints a killed run left half-written and
    the rows past the iteration the run starts from (a torn last line is
    skipped), then writes first_row: the plan. On the other ranks (master
    False) it records nothing.
    """

    def __init__(self, out_dir, iter_num, first_row, wandb_init=None,
                 master=True):
        """Starts the record (wandb_init: wandb.init's arguments, or
        None: no wandb)."""
        self.path = os.path.join(out_dir, 'metrics.jsonl')
        self.wandb, self.master = None, master
        if not master:
            return
        for d in os.listdir(out_dir):
            if d.endswith('.tmp'):
                shutil.rmtree(os.path.join(out_dir, d), ignore_errors=True)
        rows = []
        if iter_num:
            rows = read_rows(self.path)
        kept = [r for r in rows if r['iter'] <= iter_num]
        rewrite_rows(self.path, kept + [first_row])
        if wandb_init:
            try:
                import wandb
                mode = wandb_mode()
                run_id = wandb_run_id(out_dir, iter_num > 0)
                settings = wandb.Settings(init_timeout=30)
                self.wandb = wandb.init(**wandb_init, mode=mode,
                                        dir=out_dir, id=run_id,
                                        resume='allow', settings=settings)
            except Exception as e:
                print(f"wandb disabled: {type(e).__name__}: {e}",
                      flush=True)

    def __call__(self, row):
        """Records row (on rank 0)."""
        if not self.master:
            return
        append_row(self.path, row)
        if self.wandb:
            self.wandb.log(row, step=row['iter'])

    def finish(self):
        """Ends the wandb run, if any."""
        if self.wandb:
            self.wandb.finish()


def line(row, eta):
    """A training row as the log line a user reads; eta: the time left,
    said."""
    mfu = 'n/a'
    if row['mfu'] is not None:
        mfu = f"{100 * row['mfu']:.1f}%"
    return (f"iter {row['iter']}: loss {row['loss']:.4f}, "
            f"lr {row['lr']:.2e}, grad norm {row['grad_norm']:.3g}, "
            f"{row['tokens_per_sec']:,.0f} tok/s, mfu {mfu}, "
            f"mem {row['mem_gib']:.2f} GiB, eta {eta}")
