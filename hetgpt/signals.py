"""
Stop signals while training: noted, and the run checkpoints at the end of the step.
"""
import signal

from hetgpt.ckpt import checkpoints
from hetgpt.errors import die


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
