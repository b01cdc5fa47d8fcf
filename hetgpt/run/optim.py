"""
The optimizer step, for the list of optimizers model.make_optimizer builds: gradients unscaled
and clipped, the update skipped when they are not finite, and such steps counted; and the
probe's steps that leave the weights as they are.
"""
import math
from contextlib import contextmanager

import torch

from hetgpt.errors import die
from hetgpt.run.checkpoint import checkpoints


def scaler(device_type, dtypes):
    # float16's loss scale (dtypes: each rank's compute dtype), on every rank when any computes in
    # float16, so that every rank's gradient is scaled alike before they are summed. One scale for
    # all: each rank's overflow check is reduced over ranks (ShardedGradScaler's unscale_; FSDP's
    # gradients are shards, and DDP's are the same sum on every rank), so every rank skips the
    # same steps and changes the scale alike.
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
    return ShardedGradScaler(device_type, enabled='float16' in dtypes)


def restore_scale(scaler, scale):
    # A checkpoint's loss scale (a float16 run's), so that a resumed run does not search for it
    # again from 2^16 (each overflow a lost batch). Anything else there: the default start.
    if scaler.is_enabled() and type(scale) is float and 0 < scale < math.inf:
        state = scaler.state_dict()
        state['scale'] = scale
        scaler.load_state_dict(state)


def step(model, optimizers, scaler, grad_clip):
    # One update from the accumulated gradients. Returns the gradient norm before clipping (a
    # tensor, not read here) and whether the update was skipped (a tensor too).
    for opt in optimizers:
        scaler.unscale_(opt)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip or float('inf'))
    norm = norm.full_tensor() if hasattr(norm, 'full_tensor') else norm  # FSDP: a DTensor
    bad = ~torch.isfinite(norm)  # a non-finite loss or gradient: no update (the batch is lost)
    # (not scaler.step: the gradients are unscaled, and bad is the same on every rank)
    for opt in optimizers:
        if opt.defaults.get('fused'):  # the kernel skips it itself: the host does not wait
            opt.found_inf = bad.float()
            opt.step()
        elif not bad:  # (one scalar to the host per step)
            opt.step()
    scaler.update()  # (from unscale_'s overflow checks, reduced over ranks)
    for opt in optimizers:
        opt.zero_grad(set_to_none=True)
    return norm, bad


def param_groups(optimizers):
    return [g for opt in optimizers for g in opt.param_groups]


def scale_lr(optimizers, base_lrs, scale):  # each group's own lr (base_lrs), scaled
    for g, base in zip(param_groups(optimizers), base_lrs):
        g['lr'] = base * scale


@contextmanager
def frozen(optimizers):
    # Steps at lr 0 (with zero gradients, train.py's probe: the weights stay as they are); after
    # them each group's lr is back and the state they made is dropped.
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


# Updates skipped for a non-finite loss or gradient (the batch is not seen again). Counted on the
# device, so that a step never waits for the host: steps in a row, the most of them in a row and
# their count since the last log line; the log line says so, and `limit` in a row stop the run.
# Under float16's loss scale, which starts at 2^16 and halves at each overflow, the halvings down to
# 1 are the scale finding its level, not the run failing: they add to the limit.
class BadSteps:

    def __init__(self, device, limit, out_dir, scaler):
        self.run = self.worst = self.skipped = torch.zeros((), device=device)
        halvings = math.ceil(math.log2(scaler.get_scale())) if scaler.is_enabled() else 0
        self.limit, self.out_dir, self.scaler = limit + max(0, halvings), out_dir, scaler

    def add(self, bad):
        self.run = (self.run + 1) * bad
        self.worst, self.skipped = torch.maximum(self.worst, self.run), self.skipped + bad

    def report(self, iter_num, steps, log):
        if self.skipped.item():
            log(f"iter {iter_num}: {int(self.skipped)} of the last {steps} updates skipped: "
                f"loss or gradients not finite" + (f" (float16's loss scale now "
                f"{self.scaler.get_scale():g})" if self.scaler.is_enabled() else ''))
        if self.worst.item() >= self.limit:
            die(f"{int(self.worst)} steps in a row with non-finite loss or gradients, by iter "
                f"{iter_num - 1}; the last good checkpoint is "
                f"{(checkpoints(self.out_dir) or ['none yet'])[-1]}: lower learning_rate or "
                f"check the data, then init_from=resume")
        self.worst, self.skipped = self.run.clone(), torch.zeros_like(self.skipped)
