"""
The plan: every decision the planner makes (hetgpt/planner/search.py), as train.py applies it (Plan), and
the table that shows it, beside the probe step's measured memory when there is one.
"""
import math
from dataclasses import dataclass, field

from hetgpt.planner import cluster, costs, timing
from hetgpt.planner.memory import GLIBC_SLACK, GiB, held
from model import GPTConfig


@dataclass
class Plan:
    # Every decision train.py applies; lists hold one item per rank, or (plan.py's identical
    # ranks, hetgpt/planner/cluster.py) per part of the split: ranks[i]['count'] ranks alike, their first
    # and last rank and node in ranks[i]['span'].
    strategy: str
    ac: list                        # per rank: activation checkpointing of each block (a +ac
                                    # rung; under DDP only on the ranks that need it)
    shard: bool
    reshard_after_forward: bool
    offload: bool
    reduce_every_micro_batch: bool  # FSDP: reduce-scatter after each micro-batch, or accumulate
    init_device: str                # where weights are first made: 'cpu' (whole) or 'meta'
    caps: list                      # per rank: the largest micro-batch (sequences) that fits
    share: list                     # per rank: sequences of the global batch
    sizes: list                     # per rank: its micro-batch sizes (FSDP: as many on every rank)
    predicted: list                 # per rank: memory.estimate() at its largest micro-batch
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
    dtype: str = 'bfloat16'         # the ranks' compute dtype, or 'mixed' (dtypes)
    dtypes: list = None             # each rank's compute dtype
    dtype_steps: list = field(default_factory=list)  # FSDP, dtype=auto: (dtype, step) tried
    candidates: list = field(default_factory=list)  # (strategy, fits, predicted step time)
    config: GPTConfig = None
    weights: list = None            # balance by these weights; None: by speed

    @property
    def accum(self):
        return [len(m) for m in self.sizes]

    def room(self, r, overhead=None):
        # Bytes rank r's probe step may peak at, as its allocator counts (a GPU's CUDA context and
        # NCCL buffers are outside it: overhead, measured, else as planned) or its host's RSS does
        # (all of the process)
        x = self.ranks[r]
        outside = x['overhead'] if overhead is None else overhead
        return x['budget'] - (outside if x['device'] == 'cuda' else 0)

    def frees_host_memory(self, r):
        # Whether rank r's freed host memory goes back to the OS at once (hardware.
        # return_freed_host_memory), so that its RSS follows its live tensors as predicted: on a
        # GPU rank (few host blocks: no cost), and on a CPU rank whose room cannot hold glibc's
        # slack beside its predicted peak. Elsewhere glibc keeps freed blocks for reuse, and a CPU
        # step runs at glibc's speed (the threshold's fresh pages: 1.31-1.36× a 4 × 256 float32
        # step, bench/RESULTS.md).
        device = self.ranks[r]['device']
        return device != 'cpu' or held(device, self.predicted[r]) * GLIBC_SLACK > self.room(r)

    def record(self, probed):
        # rank 0's plan against its probe step (probe.probe's peak): metrics.jsonl's first row
        gib = lambda n: (n or 0) / GiB
        return {'plan': self.strategy, 'ac': self.ac[0], 'micro_batch': self.caps[0],
                'pred_gib': gib(self.predicted[0]['total']),
                'pred_host_gib': gib(self.predicted[0]['host_rank']),
                'pred_tokens_per_sec': self.tokens_per_sec, 'probe_gib': gib(probed['total']),
                'probe_alloc_gib': gib(probed['alloc'] or probed['total']),
                'overhead_gib': gib(probed['overhead'])}

    def table(self, measured=None):
        g = lambda x: '-' if x is None else f"{x / GiB:.1f}"
        parts = ('params', 'grads', 'optim', 'activations', 'other', 'total')
        out = [f"plan: {self.strategy} ({'fits' if self.fits else 'does NOT fit'}), "
               f"{cluster.world(self.ranks):,} rank(s), {self.n_params:,} parameters, "
               f"{self.dtype if self.dtype != 'mixed' else 'dtype by rank'}, batch "
               f"{self.batch_size} × {self.block_size} tokens; memory in GiB"]
        rows = []  # (its ranks' span, how many, the rest of its lines)
        for i, r in enumerate(self.ranks):
            p, mb = self.predicted[i], f"{max(self.sizes[i])}×{self.accum[i]}"
            tps = self.share[i] * self.block_size / (self.step_time or 1)
            peak = timing.peak(r, self.dtypes[i])
            mfu = costs.mfu(self.config, self.share[i], self.step_time, peak)
            lines = [f" {r['gpu'] or r['device']:<14} {SHORT[self.dtypes[i]]:<5} {self.share[i]:>5} "
                     f"{mb:>9} {'yes' if self.ac[i] else 'no':<3} pred"
                     + ''.join(f"{g(p[k]):>8}" for k in parts)
                     + f"{g(r['budget']):>8}{g(p['host']) if p['host'] else '-':>10}"
                     + (f"{tps:>10,.0f}" if self.step_time else f"{'-':>10}")
                     + (f"{mfu:>6.0%}" if mfu else f"{'-':>6}")]
            if measured and i < len(measured) and measured[i]:
                lines.append(f"{'':>41} meas" + ''.join(f"{g(measured[i].get(k)):>8}" for k in parts)
                             + f"{'':>8}{g(measured[i].get('host')):>10}")
            rows.append((list(r.get('span', (i, i, r['node'], r['node']))), r.get('count', 1),
                         lines))
        # consecutive ranks that would print the same lines: one row, "0-63" (ranks alike that
        # are not consecutive, a kind in nodes of several kinds: how many, "32 of 0-63")
        groups = []
        for (a, b, m, n), k, lines in rows:
            last = groups[-1] if groups else None
            if last and last[5] == lines and last[1] + 1 == a and b - a + 1 == k and \
                    last[1] - last[0] + 1 == last[4]:
                last[1], last[3], last[4] = b, n, last[4] + k
            else:
                groups.append([a, b, m, n, k, lines])
        named = [(_ranks(a, b, k), _ranks(m, n, n - m + 1)) for a, b, m, n, k, _ in groups]
        w = [max(5, *(len(x[j]) for x in named)) for j in (0, 1)]  # the columns' widths
        out.append(f"{'rank':>{w[0]}} {'node':>{w[1]}} {'device':<14} {'dtype':<5} {'share':>5} "
                   f"{'micro×acc':>9} ac     " + ''.join(f"{p[:5]:>8}" for p in parts)
                   + f"{'budget':>8}{'host/node':>10}{'tok/s':>10}{'MFU':>6}")
        for (ranks, nodes), (*_, lines) in zip(named, groups):
            out.append(f"{ranks:>{w[0]}} {nodes:>{w[1]}}" + lines[0])
            out.extend(' ' * (w[0] + w[1] + 1) + line for line in lines[1:])
        out.append(host_line(self.ranks))
        kept = [i for i in range(len(self.ranks)) if not self.frees_host_memory(i)]
        if kept:  # (CPU ranks)
            named = lambda i: _ranks(*self.ranks[i].get('span', (i, i))[:2],
                                     self.ranks[i].get('count', 1))
            who = 'every rank' if len(kept) == len(self.ranks) else \
                f"rank(s) {', '.join(map(named, kept))}"
            out.append(f"host: {who} with room for glibc's slack ({GLIBC_SLACK:g}× the "
                       f"prediction): freed memory kept for reuse, RSS above the prediction")
        if self.step_time:
            out.append(f"predicted: step {self.step_time:.3g} s, "
                       f"{self.tokens_per_sec:,.0f} tokens/s"
                       + (f", MFU {self.mfu:.0%}" if self.mfu else '')
                       + f" (kernels at published rates: {timing.said(self.ranks)}; links "
                       f"at {timing.LINK_EFFICIENCY:.0%}, NICs at {timing.NIC_EFFICIENCY:.0%})")
        if len(self.dtype_steps) > 1:  # FSDP gathers one dtype: the faster of the ranks' own
            out.append(f"dtype: {self.dtype} on every rank (FSDP gathers the weights in one "
                       f"dtype), the fastest of: " + ' | '.join(
                           f"{d} {f'{t:.3g} s' if t else 'x'}" for d, t in self.dtype_steps))
        out.append('candidates: ' + ' | '.join(f"{s} {f'{t:.3g} s' if ok else 'x'}"
                                               for s, ok, t in self.candidates))
        if self.advice:
            out.append(('advice: ' if not self.fits else 'note: ') + self.advice)
        return '\n'.join(out)


def _ranks(a, b, k):  # k ranks from a to b: "3", "0-63", or "32 of 0-63" (not consecutive)
    return f"{a}" if a == b else f"{a}-{b}" if b - a + 1 == k else f"{k:,} of {a}-{b}"


def host_line(ranks):
    # The host memory each node was planned with and where the figure came from (a rank's
    # host_from: stated, MemAvailable, --host_mem; else given by the caller). A node's figure is its
    # smallest rank's: ranks read MemAvailable at different moments, and the planner checks each.
    least = {}
    for r in ranks:
        x = r['host_mem'] if r['host_mem'] is not None else math.inf
        if x <= least.get(r['node'], (math.inf,))[0]:
            least[r['node']] = (x, r.get('host_from') or 'given')
    said = {n: f"{x / GiB:,.{0 if x >= 10 * GiB else 1}f} GiB, {how}" if x < math.inf
            else 'not checked' for n, (x, how) in sorted(least.items())}
    if len(set(said.values())) == 1:
        return 'host memory: ' + next(iter(said.values())).replace(' GiB,', ' GiB per node,')
    return 'host memory per node: ' + '; '.join(f"{n}: {text}" for n, text in said.items())


SHORT = {'bfloat16': 'bf16', 'float16': 'fp16', 'float32': 'fp32'}


def duration(seconds):
    # 50m00s under an hour, 1h50m under a day, then 3d04h: two units, the larger first
    s = max(0, round(seconds))
    for unit, small, name in ((86400, 3600, 'dh'), (3600, 60, 'hm'), (60, 1, 'ms')):
        if s >= unit or unit == 60:
            return f"{s // unit}{name[0]}{s % unit // small:02d}{name[1]}"
