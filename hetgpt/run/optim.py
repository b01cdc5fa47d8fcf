"""
The optimizer step, for the list of optimizers model.make_optimizer
builds: gradients unscaled and clipped, the update skipped when they are
not finite, and such steps counted; and the probe's steps that leave the
weights as they are.
"""
import math
from contextlib import contextmanager

import torch

from hetgpt.errors import die
from hetgpt.run.checkpoint import checkpoints


def scaler(device_type, dtypes):
    """float16's loss scale (dtypes: each rank's compute dtype).

    On every rank when any computes in float16, so that every rank's
    gradient is scaled alike before they are summed. One scale for all:
    each rank's overflow check is reduced over ranks (ShardedGradScaler's
    unscale_; FSDP's gradients are shards, and DDP's are the same sum on
    every rank), so every rank skips the same steps and changes the scale
    alike.
    """
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
    return ShardedGradScaler(device_type, enabled='float16' in dtypes)


def restore_scale(scaler, scale):
    """Sets a checkpoint's loss scale (a float16 run's) on scaler.

    So that a resumed run does not search for it again from 2^16 (each
    overflow a lost batch). Anything else there: the default start.
    """
    finite = type(scale) is float and 0 < scale < math.inf
    if scaler.is_enabled() and finite:
        state = scaler.state_dict()
        state['scale'] = scale
        scaler.load_state_dict(state)


def step(model, optimizers, scaler, grad_clip):
    """One update from the accumulated gradients.

    Returns the gradient norm before clipping (a tensor, not read here)
    and whether the update was skipped (a tensor too).
    """
    for opt in optimizers:
        scaler.unscale_(opt)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(),
                                          grad_clip or float('inf'))
    if hasattr(norm, 'full_tensor'):  # FSDP: a DTensor
        norm = norm.full_tensor()
    # a non-finite loss or gradient: no update (the batch is lost)
    bad = ~torch.isfinite(norm)
    # (not scaler.step: the gradients are unscaled, and bad is the same on
    # every rank)
    for opt in optimizers:
        if opt.defaults.get('fused'):
            # the kernel skips it itself: the host does not wait
            opt.found_inf = bad.float()
            opt.step()
        elif not bad:  # (one scalar to the host per step)
            opt.step()
    scaler.update()  # (from unscale_'s overflow checks, reduced over ranks)
    for opt in optimizers:
        opt.zero_grad(set_to_none=True)
    return norm, bad


def param_groups(optimizers):
    """Every param group of the optimizers, in order."""
    return [g for opt in optimizers for g in opt.param_groups]


def scale_lr(optimizers, base_lrs, scale):
    """Sets each group's lr to its own (base_lrs) × scale."""
    for g, base in zip(param_groups(optimizers), base_lrs):
        g['lr'] = base * scale


@contextmanager
def frozen(optimizers):
    """Steps at lr 0 (with zero gradients, train.py's probe: the weights
    stay as they are); after them each group's lr is back and the state
    they made is dropped."""
    lrs = [g['lr'] for g in param_groups(optimizers)]
    for g in param_groups(optimizers):
        g['lr'] = 0.0
    try:
        yield
    finally:
        for g, lr in zip(param_groups(optimizers), lrs):
            g['lr'] = lr
        for opt in optimizers:
            opt.zero_grad(set_to_none=True)
            opt.state.clear()


class BadSteps:
    """Updates skipped for a non-finite loss or gradient (the batch is not
    seen again).

    Counted on the device, so that a step never waits for the host: steps
    in a row, the most of them in a row and their count since the last
    log line; the log line says so, and `limit` in a row stop the run.
    Under float16's loss scale, which starts at 2^16 and halves at each
    overflow, the halvings down to 1 are the scale finding its level, not
    the run failing: they add to the limit.
    """

    def __init__(self, device, limit, out_dir, scaler):
        """Counts from zero; limit: the steps in a row that stop the
        run, before the loss scale's halvings are added."""
        zero = torch.zeros((), device=device)
        self.run = self.worst = self.skipped = zero
        halvings = 0
        if scaler.is_enabled():
            halvings = math.ceil(math.log2(scaler.get_scale()))
        self.limit = limit + max(0, halvings)
        self.out_dir, self.scaler = out_dir, scaler

    def add(self, bad):
        """Counts a step (bad: whether its update was skipped)."""
        self.run = (self.run + 1) * bad
        self.worst = torch.maximum(self.worst, self.run)
        self.skipped = self.skipped + bad

    def report(self, iter_num, steps, log):
        """At a log line: says the updates skipped since the last one
        (steps: the updates since then); dies when too many in a row."""
        if self.skipped.item():
            scale = ''
            if self.scaler.is_enabled():
                scale = (f" (float16's loss scale now "
                         f"{self.scaler.get_scale():g})")
            log(f"iter {iter_num}: {int(self.skipped)} of the last "
                f"{steps} updates skipped: loss or gradients not finite"
                + scale)
        if self.worst.item() >= self.limit:
            last = (checkpoints(self.out_dir) or ['none yet'])[-1]
            die(f"{int(self.worst)} steps in a row with non-finite loss "
                f"or gradients, by iter {iter_num - 1}; the last good "
                f"checkpoint is {last}: lower learning_rate or check the "
                f"data, then init_from=resume")
        self.worst = self.run.clone()
        self.skipped = torch.zeros_like(self.skipped)
