"""
Stop signals: Ctrl-C, preemption (SIGTERM) or Slurm's warning (SIGUSR1). While starting, one line
and nothing written; while training, noted, and the run checkpoints at the end of the step.
(Imported before torch: a signal may come while torch is imported.)
"""
import os
import signal
import sys

from hetgpt.errors import die, last_at_exit, say, speaks

STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)
claimed = False  # out_dir locked (rundir.lock): from then on a stop exits through atexit


def starting():
    last_at_exit()  # (registered first: it runs last)
    for sig in STOPS:
        signal.signal(sig, _stop_while_starting)


def _stop_while_starting(signum, frame):
    msg = f"stopped by {signal.Signals(signum).name} while starting; nothing was written"
    if claimed:
        die(msg)
    # Nothing to undo yet: the process ends here, not by SystemExit, which may surface inside
    # torch's import, where its C++ aborts on it (SIGABRT, seen once in CI). As die: torchrun's
    # other local ranks leave the line to local rank 0.
    if speaks():
        say(f"error: {msg}")
    try:
        sys.stdout.flush()
    except (OSError, RuntimeError):  # (the signal came inside a write to stdout)
        pass
    os._exit(2)


class Signals(list):
    # From here a signal checkpoints at the end of the step; a second Ctrl-C stops at once.
    def __init__(self, out_dir):
        super().__init__()
        self.out_dir = out_dir
        for sig in STOPS:
            signal.signal(sig, self.on_signal)

    def on_signal(self, signum, frame):
        from hetgpt.ckpt import checkpoints
        self.append(signum)
        if self.count(signal.SIGINT) > 1:
            die(f"interrupted twice: stopped without a checkpoint; the last is "
                f"{(checkpoints(self.out_dir) or ['none'])[-1]}")

    def agreed(self):
        # Whether any rank has a signal: it may reach the ranks at different steps. (A host
        # tensor: gloo, no wait for the GPU.)
        import torch
        import torch.distributed as dist
        stop = torch.tensor(len(self))
        dist.all_reduce(stop)
        return bool(stop)
