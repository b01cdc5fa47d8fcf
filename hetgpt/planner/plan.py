"""
The plan: every decision the planner makes (hetgpt/planner/search.py), as
train.py applies it (Plan), and the table that shows it, beside the probe
step's measured memory when there is one.
"""
import math
from dataclasses import dataclass, field

from hetgpt.planner import cluster, costs, timing
from hetgpt.planner.memory import GLIBC_SLACK, GiB, held
from model import GPTConfig

# The compute dtypes as the table's column names them
SHORT = {'bfloat16': 'bf16', 'float16': 'fp16', 'float32': 'fp32'}


@dataclass
class Plan:
    """Every decision train.py applies.

    Lists hold one item per rank, or (plan.py's identical ranks,
    hetgpt/planner/cluster.py) per part of the split: ranks[i]['count']
    ranks alike, their first and last rank and node in ranks[i]['span'].
    """
    strategy: str
    # per rank: activation checkpointing of each block (a +ac rung; under
    # DDP only on the ranks that need it)
    ac: list
    shard: bool
    reshard_after_forward: bool
    offload: bool
    # FSDP: reduce-scatter after each micro-batch, or accumulate
    reduce_every_micro_batch: bool
    # where weights are first made: 'cpu' (whole) or 'meta'
    init_device: str
    # per rank: the largest micro-batch (sequences) that fits
    caps: list
    share: list  # per rank: sequences of the global batch
    # per rank: its micro-batch sizes (FSDP: as many on every rank)
    sizes: list
    # per rank: memory.estimate() at its largest micro-batch
    predicted: list
    step_time: float
    tokens_per_sec: float
    mfu: float
    fits: bool
    advice: str = ''
    needs: dict = field(default_factory=dict)
    ranks: list = field(default_factory=list)
    batch_size: int = 0
    block_size: int = 0
    n_params: int = 0
    # the ranks' compute dtype, or 'mixed' (dtypes)
    dtype: str = 'bfloat16'
    dtypes: list = None  # each rank's compute dtype
    # FSDP, dtype=auto: (dtype, step) tried
    dtype_steps: list = field(default_factory=list)
    # (strategy, fits, predicted step time)
    candidates: list = field(default_factory=list)
    config: GPTConfig = None
    # balance by these weights; None: by speed
    weights: list = None

    @property
    def accum(self):
        """Each rank's number of micro-batches."""
        return [len(m) for m in self.sizes]

    def room(self, r, overhead=None):
        """Bytes rank r's probe step may peak at.

        As its allocator counts them (a GPU's CUDA context and NCCL
        buffers are outside it: overhead, measured, else as planned) or
        its host's RSS does (all of the process).
        """
        x = self.ranks[r]
        if x['device'] != 'cuda':
            return x['budget']
        if overhead is None:
            overhead = x['overhead']
        return x['budget'] - overhead

    def frees_host_memory(self, r):
        """Whether rank r's freed host memory goes back to the OS at once
        (hardware.return_freed_host_memory).

        It does, so that its RSS follows its live tensors as predicted, on
        a GPU rank (few host blocks: no cost) and on a CPU rank whose room
        cannot hold glibc's slack beside its predicted peak. Elsewhere
        glibc keeps freed blocks for reuse, and a CPU step runs at glibc's
        speed (the threshold's fresh pages: 1.31-1.36× a 4 × 256 float32
        step, bench/RESULTS.md).
        """
        device = self.ranks[r]['device']
        if device != 'cpu':
            return True
        slack = held(device, self.predicted[r]) * GLIBC_SLACK
        return slack > self.room(r)

    def record(self, probed):
        """rank 0's plan against its probe step (probe.probe's peak):
        metrics.jsonl's first row."""
        predicted = self.predicted[0]
        return {'plan': self.strategy, 'ac': self.ac[0],
                'micro_batch': self.caps[0],
                'pred_gib': _gib(predicted['total']),
                'pred_host_gib': _gib(predicted['host_rank']),
                'pred_tokens_per_sec': self.tokens_per_sec,
                'probe_gib': _gib(probed['total']),
                'probe_alloc_gib': _gib(probed['alloc']
                                        or probed['total']),
                'overhead_gib': _gib(probed['overhead'])}

    def table(self, measured=None):
        """The plan as plan.py and train.py print it.

        measured: per rank, the probe step's memory ({part: bytes}, or
        None), shown under its prediction.
        """
        parts = ('params', 'grads', 'optim', 'activations', 'other',
                 'total')
        verdict = 'fits'
        if not self.fits:
            verdict = 'does NOT fit'
        dtype = self.dtype
        if dtype == 'mixed':
            dtype = 'dtype by rank'
        out = [f"plan: {self.strategy} ({verdict}), "
               f"{cluster.world(self.ranks):,} rank(s), "
               f"{self.n_params:,} parameters, {dtype}, batch "
               f"{self.batch_size} × {self.block_size} tokens; "
               f"memory in GiB"]
        rows = []  # (its ranks' span, how many, the rest of its lines)
        for i, r in enumerate(self.ranks):
            lines = [self._row(i, parts)]
            if measured and i < len(measured) and measured[i]:
                lines.append(_measured_row(measured[i], parts))
            where = r.get('span', (i, i, r['node'], r['node']))
            rows.append((list(where), r.get('count', 1), lines))
        # Consecutive ranks that would print the same lines: one row,
        # "0-63" (ranks alike that are not consecutive, a kind in nodes of
        # several kinds: how many, "32 of 0-63")
        groups = []  # [first, last rank, first, last node, how many, lines]
        for (a, b, m, n), k, lines in rows:
            if groups and _joins(groups[-1], a, b, k, lines):
                last = groups[-1]
                last[1], last[3], last[4] = b, n, last[4] + k
            else:
                groups.append([a, b, m, n, k, lines])
        named = [(_ranks(a, b, k), _ranks(m, n, n - m + 1))
                 for a, b, m, n, k, _ in groups]
        # the columns' widths
        w = [max(5, *(len(x[j]) for x in named)) for j in (0, 1)]
        out.append(f"{'rank':>{w[0]}} {'node':>{w[1]}} {'device':<14} "
                   f"{'dtype':<5} {'share':>5} {'micro×acc':>9} ac     "
                   + ''.join(f"{p[:5]:>8}" for p in parts)
                   + f"{'budget':>8}{'host/node':>10}{'tok/s':>10}"
                   f"{'MFU':>6}")
        for (ranks, nodes), (*_, lines) in zip(named, groups):
            out.append(f"{ranks:>{w[0]}} {nodes:>{w[1]}}" + lines[0])
            indent = ' ' * (w[0] + w[1] + 1)
            out.extend(indent + line for line in lines[1:])
        out.append(host_line(self.ranks))
        kept = [i for i in range(len(self.ranks))
                if not self.frees_host_memory(i)]
        if kept:  # (CPU ranks)
            who = 'every rank'
            if len(kept) < len(self.ranks):
                who = f"rank(s) {', '.join(map(self._named, kept))}"
            out.append(f"host: {who} with room for glibc's slack "
                       f"({GLIBC_SLACK:g}× the prediction): freed memory "
                       f"kept for reuse, RSS above the prediction")
        if self.step_time:
            mfu = ''
            if self.mfu:
                mfu = f", MFU {self.mfu:.0%}"
            out.append(f"predicted: step {self.step_time:.3g} s, "
                       f"{self.tokens_per_sec:,.0f} tokens/s{mfu} "
                       f"(kernels at published rates: "
                       f"{timing.said(self.ranks)}; links at "
                       f"{timing.LINK_EFFICIENCY:.0%}, NICs at "
                       f"{timing.NIC_EFFICIENCY:.0%})")
        # FSDP gathers one dtype: the faster of the ranks' own
        if len(self.dtype_steps) > 1:
            tried = ' | '.join(f"{d} {_timed(t, t)}"
                               for d, t in self.dtype_steps)
            out.append(f"dtype: {self.dtype} on every rank (FSDP gathers "
                       f"the weights in one dtype), the fastest of: "
                       + tried)
        out.append('candidates: ' + ' | '.join(
            f"{s} {_timed(t, ok)}" for s, ok, t in self.candidates))
        if self.advice and self.fits:
            out.append('note: ' + self.advice)
        elif self.advice:
            out.append('advice: ' + self.advice)
        return '\n'.join(out)

    def _row(self, i, parts):
        """Rank i's line of the table from its device column on: its
        prediction."""
        r, p = self.ranks[i], self.predicted[i]
        mb = f"{max(self.sizes[i])}×{self.accum[i]}"
        tps = self.share[i] * self.block_size / (self.step_time or 1)
        peak = timing.peak(r, self.dtypes[i])
        mfu = costs.mfu(self.config, self.share[i], self.step_time, peak)
        device, dtype = r['gpu'] or r['device'], SHORT[self.dtypes[i]]
        ac = 'no'
        if self.ac[i]:
            ac = 'yes'
        host = '-'
        if p['host']:
            host = _cell(p['host'])
        line = (f" {device:<14} {dtype:<5} {self.share[i]:>5} "
                f"{mb:>9} {ac:<3} pred"
                + ''.join(f"{_cell(p[k]):>8}" for k in parts)
                + f"{_cell(r['budget']):>8}{host:>10}")
        if self.step_time:
            line += f"{tps:>10,.0f}"
        else:
            line += f"{'-':>10}"
        if mfu:
            line += f"{mfu:>6.0%}"
        else:
            line += f"{'-':>6}"
        return line

    def _named(self, i):
        """The ranks of the table's i-th part: "3", "0-63" or "32 of
        0-63"."""
        r = self.ranks[i]
        a, b = r.get('span', (i, i))[:2]
        return _ranks(a, b, r.get('count', 1))


def _gib(n):
    """Bytes in GiB (None: 0)."""
    return (n or 0) / GiB


def _cell(x):
    """Bytes as the table's GiB: '12.3', or '-' (None)."""
    if x is None:
        return '-'
    return f"{x / GiB:.1f}"


def _timed(t, ok):
    """A predicted step time as the table says it: '0.251 s', or 'x'
    where not ok (it does not fit)."""
    if ok:
        return f"{t:.3g} s"
    return 'x'


def _measured_row(x, parts):
    """A rank's probe-step memory ({part: bytes}) as the table's line
    under its prediction."""
    return (f"{'':>41} meas"
            + ''.join(f"{_cell(x.get(k)):>8}" for k in parts)
            + f"{'':>8}{_cell(x.get('host')):>10}")


def _joins(group, a, b, k, lines):
    """Whether k ranks from a to b that print these lines join the table's
    group [first, last rank, first, last node, how many, lines] as one
    row: the group's ranks and theirs consecutive, and the lines alike."""
    first, last, _, _, count, shown = group
    return (shown == lines and last + 1 == a and b - a + 1 == k
            and last - first + 1 == count)


def _ranks(a, b, k):
    """k ranks from a to b: "3", "0-63", or "32 of 0-63" (not
    consecutive)."""
    if a == b:
        return f"{a}"
    if b - a + 1 == k:
        return f"{a}-{b}"
    return f"{k:,} of {a}-{b}"


def _host_said(x, how):
    """A node's host memory x (bytes; inf: not checked) and where the
    figure came from, as the table says them."""
    if not x < math.inf:
        return 'not checked'
    digits = 1
    if x >= 10 * GiB:
        digits = 0
    return f"{x / GiB:,.{digits}f} GiB, {how}"


def host_line(ranks):
    """The host memory each node was planned with, and where the figure
    came from.

    A rank's host_from: stated, MemAvailable, --host_mem; else given by
    the caller. A node's figure is its smallest rank's: ranks read
    MemAvailable at different moments, and the planner checks each.
    """
    least = {}
    for r in ranks:
        x = math.inf
        if r['host_mem'] is not None:
            x = r['host_mem']
        if x <= least.get(r['node'], (math.inf,))[0]:
            least[r['node']] = (x, r.get('host_from') or 'given')
    said = {n: _host_said(x, how) for n, (x, how) in sorted(least.items())}
    if len(set(said.values())) == 1:
        text = next(iter(said.values()))
        return 'host memory: ' + text.replace(' GiB,', ' GiB per node,')
    return 'host memory per node: ' + '; '.join(
        f"{n}: {text}" for n, text in said.items())


def duration(seconds):
    """A time as two units, the larger first: 50m00s under an hour, 1h50m
    under a day, then 3d04h."""
    s = max(0, round(seconds))
    units = ((86400, 3600, 'dh'), (3600, 60, 'hm'), (60, 1, 'ms'))
    for unit, small, name in units:
        if s >= unit or unit == 60:
            return f"{s // unit}{name[0]}{s % unit // small:02d}{name[1]}"
