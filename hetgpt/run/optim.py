"""
The optimizer step, for the list of optimizers model.make_optimizer
builds: gradients unscaled and clipped, the update skipped when they are
not finite, and such steps counted; and the probe's steps that leave the
weights as they are.
"""
import math
import os
from contextlib import contextmanager

import torch
import torch.distributed as dist

from hetgpt.errors import die
from hetgpt.run import whole_matrix
from hetgpt.run.checkpoint import (checkpoints, confirm, is_good,
                                   newest_good, set_aside)


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


def whole(optimizers):
    """make_optimizer's optimizers; each that holds FSDP2's shards and
    whose update needs whole matrices (Muon) steps them whole
    (hetgpt/run/whole_matrix.py)."""
    return whole_matrix.wrap(optimizers)


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
    seen again), outer steps not applied, and which checkpoints are good.

    Counted on the device, so that a step never waits for the host: steps
    in a row, the most of them in a row and their count since the last
    log line; the log line says so, and `limit` in a row stop the run.
    Under float16's loss scale, which starts at 2^16 and halves at each
    overflow, the halvings down to 1 are the scale finding its level, not
    the run failing: they add to the limit. Under local steps an outer
    step that is not applied (hetgpt/run/local_steps.py) is a bad step,
    and the round's steps it undid do not end a run of them.

    A checkpoint is known good once the step that starts from its weights
    has a finite loss and gradients on every rank: it is marked
    (checkpoint.confirm) and rotation keeps it (checkpoint.save's keep).
    A checkpoint is written only after a step that completed, its outer
    step included, and of finite weights (may_save): a finite update of
    weights that passed a step. When bad steps stop the run, the
    checkpoints this run wrote or resumed from that never passed a step
    started them: they are set aside (checkpoint.set_aside), and the
    error names the one init_from=resume takes then.
    """

    def __init__(self, device, limit, out_dir, scaler, held=None):
        """Counts from zero; limit: the steps in a row that stop the
        run, before the loss scale's halvings are added. held: the
        checkpoint the run resumed from (its weights are the model's)."""
        zero = torch.zeros((), device=device)
        self.run = self.worst = self.skipped = zero
        self.round_run = zero  # self.run at the last outer step
        halvings = 0
        if scaler.is_enabled():
            halvings = math.ceil(math.log2(scaler.get_scale()))
        self.limit = limit + max(0, halvings)
        self.out_dir, self.scaler = out_dir, scaler
        self.master = not dist.is_initialized() or dist.get_rank() == 0
        # the checkpoint whose weights every rank has now, not yet
        # through a step; those this run wrote or resumed from and no
        # step has passed; the newest known good
        self.held = held
        self.unchecked = [held] if held else []
        self.good = newest_good(out_dir)
        self.local = False  # outer steps have run
        self.outer_failed = 0  # outer steps not applied, since the log line

    def add(self, bad, outer=None):
        """Counts a step (bad: whether its update was skipped; outer:
        None, or after an outer step whether it was not applied)."""
        self.run = (self.run + 1) * bad
        if outer is not None:
            self.local = True
            if outer:  # the round undone: its steps end no run of bad ones
                self.run = torch.maximum(self.run, self.round_run + 1)
                self.outer_failed += 1
            self.round_run = self.run
        self.worst = torch.maximum(self.worst, self.run)
        self.skipped = self.skipped + bad
        if not self.held:
            return
        # The step from the held checkpoint's weights: a finite loss and
        # gradients from them on every rank confirm them (an outer step
        # not applied is the update's fault, and it was not applied).
        # Read once per checkpoint, and in a run of bad steps after one.
        any_bad, all_bad = _across(bad)
        if not any_bad:
            self.confirmed(self.held)
        if not any_bad or not all_bad or outer is not None:
            self.held = None  # the weights moved on

    def confirmed(self, path):
        """Checkpoint path passed a step: marked, and the newest good."""
        if self.master:
            confirm(path, _iter(path) + 1)
        self.good = path
        self.unchecked = [c for c in self.unchecked if c != path]

    def may_save(self, model, iter_num, due, log):
        """Whether a checkpoint of model may be written now (on every
        rank alike): every rank's last step completed (run > 0: it was
        bad) and left finite weights. If not and one is due (due), says
        so."""
        finite = [torch.isfinite(p.to_local() if hasattr(p, 'to_local')
                                 else p).all().to(self.run.device)
                  for p in model.parameters()]
        any_bad, _ = _across((self.run > 0) | ~torch.stack(finite).all())
        if not any_bad:
            return True
        if due:
            what = 'loss or gradients'
            if self.local:
                what = 'loss, gradients or outer step'
            log(f"iter {iter_num}: no checkpoint: not finite after the "
                f"last step ({what}, or the weights), so these weights are "
                f"not known good; the last good checkpoint is "
                f"{self.good or 'none yet'}; the next is written after a "
                f"step that completes")
        return False

    def saved(self, path):
        """A checkpoint of the weights as they are was written."""
        self.held = path
        self.unchecked.append(path)

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
        if self.outer_failed:
            log(f"iter {iter_num}: {self.outer_failed} outer step(s) not "
                f"applied: not finite; the nodes went back to the round's "
                f"start")
        worst = _most(self.worst)
        if worst >= self.limit:
            self.stop(int(worst), iter_num)
        self.worst = self.run.clone()
        self.skipped = torch.zeros_like(self.skipped)
        self.outer_failed = 0

    def stop(self, worst, iter_num):
        """Dies: worst bad steps in a row. The checkpoints whose weights
        started them go aside first (every rank waits for rank 0)."""
        after = _iter(self.good) if self.good else -1
        suspects = [c for c in self.unchecked if _iter(c) > after]
        moved = []
        if self.master:
            moved = [os.path.basename(c) for c in suspects
                     if os.path.isdir(c) and set_aside(c)]
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.barrier()  # (then every rank names the same one)
        aside = ''
        if moved:
            aside = (f"{', '.join(moved)} set aside as .bad (the bad steps "
                     f"started from {'its' if len(moved) == 1 else 'their'}"
                     f" weights); ")
        what, lower = 'loss or gradients', 'learning_rate'
        if self.local:
            what = 'loss, gradients or outer steps'
            lower = 'learning_rate or outer_lr'
        last = (checkpoints(self.out_dir) or [None])[-1]
        if last is None:
            then = (f"no checkpoint is left: lower {lower} or check the "
                    f"data, then init_from=auto starts again")
        else:
            known = 'good ' if is_good(last) else ''
            then = (f"the last {known}checkpoint is {last}: lower {lower} "
                    f"or check the data, then init_from=resume")
        die(f"{worst} steps in a row with non-finite {what}, by iter "
            f"{iter_num - 1}; {aside}{then}")


def _across(flag):
    """(whether flag, a bool tensor, holds on any rank, on every rank),
    on the host."""
    both = torch.stack([flag, ~flag]).float()
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(both, op=dist.ReduceOp.MAX)
    return bool(both[0]), not bool(both[1])


def _most(x):
    """The largest of x (a tensor) over the ranks, on the host."""
    x = x.clone()
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(x, op=dist.ReduceOp.MAX)
    return x.item()


def _iter(path):
    """A checkpoint's iter, from its name (ckpt_<iter>)."""
    return int(os.path.basename(path)[len('ckpt_'):])

