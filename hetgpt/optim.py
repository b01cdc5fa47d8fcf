"""
The optimizer step: updates skipped for a non-finite loss or gradient, and counted.
"""


import torch

from hetgpt.ckpt import checkpoints
from hetgpt.errors import die


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
