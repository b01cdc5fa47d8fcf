"""
Stop signals: Ctrl-C, preemption (SIGTERM) or Slurm's warning (SIGUSR1).
While starting, one line and nothing written; while training, noted, and
the run checkpoints at the end of the step. (Imported before torch: a
signal may come while torch is imported.)
"""
import os
import signal
import sys

from hetgpt.errors import (STOP_SIGNALS, die, last_at_exit, say,
                           speaks)


def starting():
    """Until training starts, a stop signal ends the process in one line."""
    last_at_exit()  # (registered first: it runs last)
    for sig in STOP_SIGNALS:
        signal.signal(sig, _stop_while_starting)


def claimed():
    """out_dir is locked (rundir.lock): from here a stop while starting
    exits through die, so that the lock's at-exit handler releases it."""
    for sig in STOP_SIGNALS:
        if signal.getsignal(sig) is _stop_while_starting:
            signal.signal(sig, _stop_after_claim)


def _said(signum):
    """What a stop by signal signum while starting says."""
    name = signal.Signals(signum).name
    return f"stopped by {name} while starting; nothing was written"


def _stop_after_claim(signum, frame):
    """A stop while starting, out_dir claimed: die, whose exit runs the
    at-exit handlers (the lock's)."""
    die(_said(signum))


def _stop_while_starting(signum, frame):
    """A stop while starting: one line, then os._exit(2).

    Nothing to undo yet: the process ends here, not by SystemExit, which
    may surface inside torch's import, where its C++ aborts on it
    (SIGABRT, seen once in CI). As die: torchrun's other local ranks
    leave the line to local rank 0.
    """
    if speaks():
        say(f"error: {_said(signum)}")
    try:
        sys.stdout.flush()
    except (OSError, RuntimeError):  # (the signal came inside a write)
        pass
    os._exit(2)


class Signals(list):
    """The stop signals this rank got while training, in order.

    From here a signal checkpoints at the end of the step; a second
    Ctrl-C stops at once. So does a rank whose torchrun agent is gone
    (the watchdog's `gone`), and the run then ends in an error.
    """

    def __init__(self, out_dir, watchdog):
        """Takes the stop signals (out_dir: the run's, whose last
        checkpoint a second Ctrl-C names; watchdog: this rank's)."""
        super().__init__()
        self.out_dir, self.watchdog = out_dir, watchdog
        self.orphaned = False  # (agreed: some rank's agent is gone)
        for sig in STOP_SIGNALS:
            signal.signal(sig, self.on_signal)

    def on_signal(self, signum, frame):
        """Notes signal signum; a second SIGINT ends the run at once."""
        from hetgpt.run.checkpoint import checkpoints
        self.append(signum)
        if self.count(signal.SIGINT) > 1:
            last = (checkpoints(self.out_dir) or ['none'])[-1]
            die(f"interrupted twice: stopped without a checkpoint; "
                f"the last is {last}")

    def agreed(self):
        """Whether any rank has a signal or lost its agent: they may
        reach the ranks at different steps. (A host tensor: gloo, no
        wait for the GPU.)"""
        import torch
        import torch.distributed as dist
        gone = self.watchdog.gone is not None
        stop = torch.tensor([len(self), gone])
        dist.all_reduce(stop)
        self.orphaned = bool(stop[1])
        return bool(stop.sum())

    def said(self, it, log, saved=True):
        """The run's last line, stopped at iter it (saved: with a
        checkpoint; not when the last step left no good weights): log's
        (a signal), or an error (an agent gone); returns the exit
        status."""
        kept = 'checkpoint saved'
        if not saved:
            kept = 'no checkpoint'
        if not self.orphaned:
            log(f"iter {it}: stopped by a signal; {kept}, "
                f"init_from=resume continues")
            return 0
        # (this rank's own reason, if its thread has not seen it yet)
        why = self.watchdog.gone or self.watchdog.agent_gone()
        if why is None:
            why = "another machine's torchrun agent or store is gone"
        if speaks():
            say(f"error: rank {os.environ.get('RANK', 0)}: {why}; "
                f"stopped at iter {it} ({kept}): "
                f"init_from=resume continues")
        return 2
