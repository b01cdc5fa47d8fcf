"""
Each rank's compute seconds, measured as it trains, and the split of the
batch they call for (hetgpt/planner/balance.py's maths).
"""
import dataclasses
import json
import os
import time
from contextlib import contextmanager

import torch

from hetgpt.gpus import peak_flops
from hetgpt.knobs import OPTIMIZER
from hetgpt.planner import measured
from hetgpt.planner.balance import fit, rebalance
from hetgpt.planner.costs import mfu
from hetgpt.run.process_group import gather


class Speed:
    """Each rank's compute seconds, measured as it trains, and the split
    of the batch they call for.

    train.py calls measure() once at start-up, start() and end() around
    each step, forward() around each forward, and report() at each log
    line, which also rewrites out_dir/measured.json on rank 0 (record). A
    rank's compute is (3 + ac) × its forwards' seconds (a backward
    is about two forwards, plus one when it recomputes), less FSDP's
    waits: its pre-hook on a module waits for the all-gather of its
    weights, that is, for the slowest rank. Timed on CPU always; on CUDA
    (reading an event synchronises) only in the few steps before a
    rebalance.
    """

    def __init__(self, device_type, rank, world_size, plan, out_dir,
                 interval, model, log, config):
        """Hooks a mark before and after each FSDP module's pre-hook.

        plan: the run's (search.make_plan's); out_dir: where rank 0
        records what it measured (record); config: train.py's knobs
        (the record names the optimizer they build).
        """
        self.cuda = device_type == 'cuda'
        self.rank, self.world_size = rank, world_size
        self.factor, self.interval = 3 + plan.ac[rank], interval
        self.lockstep, self.log = plan.shard, log
        self.plan, self.out_dir = plan, out_dir
        self.optimizer = {k: config[k] for k in OPTIMIZER}
        self.intervals = []  # (record's: this start's log intervals)
        self.timing, self.marks = False, []
        self.c0, self.c1 = None, None
        # smoothed (compute, whole step) seconds of this rank
        self.busy = [0.0, 0.0]

        def wait(module, args):
            """A mark, while timing. (A hook that returns something
            replaces the args: this one returns None.)"""
            if self.timing:
                self.marks.append(self.stamp())
        wait = torch.compiler.disable(wait)
        # (FSDP's pre-hook was prepended: this one runs before it)
        for m in model.modules():
            if hasattr(m, 'set_requires_gradient_sync'):
                m.register_forward_pre_hook(wait, prepend=True)
                m.register_forward_pre_hook(wait)

    def stamp(self):
        """Now, by the host's clock, or (CUDA) an event in this rank's GPU
        work."""
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        return torch.cuda.current_stream().record_event(event)

    def seconds(self, a, b):
        """The seconds from stamp a to b (CUDA: waits for b)."""
        if not self.cuda:
            return b - a
        b.synchronize()
        return a.elapsed_time(b) / 1000

    @contextmanager
    def forward(self):
        """Marks a forward's start and end, while timing.

        marks: [start, wait start, wait end, ..., end] of each timed
        forward, read after the step (so that on CUDA the host does not
        wait for the forward before the backward).
        """
        if self.timing:
            self.marks.append(self.stamp())
        yield
        if self.timing:
            self.marks.append(self.stamp())

    def compute(self):
        """The timed forwards' seconds, less their waits, × factor.

        marks pair up as (start, wait start), (wait end, next wait
        start), ..., (last wait end, end).
        """
        m, self.marks = self.marks, []
        return self.factor * sum(map(self.seconds, m[::2], m[1::2]))

    def measure(self, cap, run):
        """This rank's c0, c1, then every rank's: (c0, c1), a tuple per
        rank.

        From forward-backwards (run(sizes)) of half its cap (twice: the
        first warms up) and its cap.
        """
        sizes = (max(1, cap // 2), max(1, cap // 2), cap)
        times = []
        for b in sizes:
            self.timing = True
            run([b])
            times.append(self.compute())
        self.timing = False
        mine = fit(sizes[1:], times[1:])
        self.c0, self.c1 = zip(*gather(mine))
        return self.c0, self.c1

    def start(self, it):
        """Before step it: whether to time it, and its first stamp."""
        self.timing = self.world_size > 1 and (
            not self.cuda or it % self.interval >= self.interval - 5)
        self.t_step = None
        if self.timing:
            self.t_step = self.stamp()

    def end(self, it, sizes, caps):
        """The sizes to run next, after step it-1 (it: steps done).

        Smoothed times; every `interval` steps, the split refitted to
        every rank's measured compute (rebalance).
        """
        if self.timing:
            now = [self.compute(),
                   self.seconds(self.t_step, self.stamp())]
            self.busy = [0.7 * b + 0.3 * n
                         for b, n in zip(self.busy, now)]
        self.timing = False
        if self.c0 is None or it % self.interval:
            return sizes
        times = gather(self.busy[0])
        new, self.c1 = rebalance(sizes, caps, self.c0, self.c1, times,
                                 self.lockstep)
        if new != sizes:
            self.log(f"iter {it}: rebalanced {list(map(sum, sizes))} -> "
                     f"{list(map(sum, new))}")
        return new

    def report(self, ran, mfu, row):
        """Logs what each rank ran in its last step, its idle fraction
        and its MFU; records it with row's tokens/s (record).

        ran: this rank's micro-batches. mfu(sequences, seconds, rank): a
        rank's MFU on its own peak (None: unknown). row: the log line's
        metrics.jsonl row.
        """
        seen = [(ran, *self.busy)]
        if self.world_size > 1:
            seen = gather(seen[0])
        if self.rank == 0:
            self.record(row, seen)
        if self.world_size == 1 or self.busy[1] <= 0:
            return
        parts = []
        for r, (ms, c, w) in enumerate(seen):
            part = f"rank {r}: {sum(ms)} seq in {'+'.join(map(str, ms))}"
            part += f", idle {max(0, 1 - c / w):.0%}"
            if mfu(sum(ms), w, r) is not None:
                part += f", mfu {mfu(sum(ms), w, r):.0%}"
            parts.append(part)
        self.log('  ' + '; '.join(parts))

    def record(self, row, seen):
        """Rewrites out_dir/measured.json: what plan.py --measured reads
        (hetgpt/planner/measured.py).

        The plan's model, batch, strategy, optimizer (knobs.OPTIMIZER)
        and each rank's kind, dtype, ac and threads (a CPU rank's: its
        compute's rate); per log interval of this start (the last 50): its tokens/s,
        each rank's micro-batches and its compute seconds of a step
        (None where not timed: one rank; CUDA before its first timed
        step). Through a temporary file and a rename: a reader sees the
        old record or the new. A disk that refuses it: no record, the
        run goes on.
        """
        p = self.plan
        compute = None
        if self.world_size > 1 and self.busy[1] > 0:
            compute = [c for _, c, _ in seen]
        self.intervals = self.intervals[-49:] + [dict(
            iter=row['iter'], tokens_per_sec=row['tokens_per_sec'],
            sizes=[list(ms) for ms, _, _ in seen], compute_s=compute)]
        ranks = [dict(kind=r['gpu'] or 'cpu', dtype=d, ac=a,
                      node=r['node'], threads=r.get('threads', 1))
                 for r, d, a in zip(p.ranks, p.dtypes, p.ac)]
        out = {'format': measured.FORMAT,
               'model': dataclasses.asdict(p.config),
               'batch_size': p.batch_size, 'block_size': p.block_size,
               'strategy': p.strategy, 'optimizer': self.optimizer,
               'accumulate': not p.reduce_every_micro_batch,
               'ranks': ranks, 'intervals': self.intervals}
        path = os.path.join(self.out_dir, 'measured.json')
        try:
            with open(path + '.tmp', 'w') as f:
                json.dump(out, f)
            os.replace(path + '.tmp', path)
        except OSError:
            pass


class MFU:
    """train.py's mfu(sequences, seconds, r): on rank r's peak (its GPU in
    its dtype), or on all ranks' together (r None); None where a peak is
    unknown (a CPU)."""

    def __init__(self, cfg, ranks, dtypes):
        """cfg: the model's; ranks: each rank's hardware; dtypes: each
        rank's compute dtype."""
        self.cfg = cfg
        self.peaks = [peak_flops(r['gpu'], d)
                      for r, d in zip(ranks, dtypes)]

    def __call__(self, sequences, seconds, r=None):
        """The MFU of sequences in seconds, on rank r's peak or all's."""
        if r is not None:
            peak = self.peaks[r]
        elif all(self.peaks):
            peak = sum(self.peaks)
        else:
            peak = None
        return mfu(self.cfg, sequences, seconds, peak)
