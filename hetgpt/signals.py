"""
Stop signals: Ctrl-C, preemption (SIGTERM) or Slurm's warning (SIGUSR1). While starting, one line
and nothing written; while training, noted, and the run checkpoints at the end of the step.
(Imported before torch: a signal may come while torch is imported.)
"""
import signal

from hetgpt.errors import die

STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)


def starting():
    for sig in STOPS:
        signal.signal(sig, lambda signum, frame: die(
            f"stopped by {signal.Signals(signum).name} while starting; nothing was written"))


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
