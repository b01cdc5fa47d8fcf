"""
The step-time model: the seconds of a training step on given ranks,
predicted before any of them runs, from the devices' datasheets
(hetgpt/gpus.py) and the model's FLOPs (hetgpt/planner/costs.py): each
rank's compute (c0 seconds per micro-batch, c1 per sequence: what
hetgpt/planner/balance.py splits by), the optimizer step, and the
collectives (NCCL's rings, gloo), overlapped as DDP and FSDP2 overlap
them on a GPU (on a CPU rank they take its cores: added). The planner times each strategy with it; train.py then measures
each rank's compute (hetgpt/run/speed.py's Speed) and splits the batch
again by that.
"""
import functools
import itertools
import math
import operator
from collections import Counter
from dataclasses import replace

from hetgpt.gpus import (GPUS, HOST_BW, HOST_THREAD_BW, UNKNOWN_GPU,
                         peak_flops)
from hetgpt.knobs import flags
from hetgpt.planner.balance import (EXACT, lockstep_count,
                                    lockstep_segments, runs,
                                    split_shares, weighted_shares)
from hetgpt.planner import cluster, costs
from hetgpt.planner.efficiency import prior, step_efficiency
from hetgpt.planner.costs import counts, flops_per_sequence
from hetgpt.planner.memory import (optimizer_state, owners_of, sharded,
                                   whole_matrices)
from hetgpt.rates import GEMM_SM90

# A GPU rank's compute, kind by kind, each at a published
# micro-benchmark's rate: the ceiling, which the step efficiency fitted
# on published training runs divides (hetgpt/planner/efficiency.py); the
# probe step then measures the real one.
# Matmuls: the best BF16 rate a part reaches (TFLOP/s), Stas Bekman's
# ml-engineering, compute/accelerator/README.md, "Maximum Achievable
# Matmul FLOPS" (mamf-finder.py, torch 2.5-2.7): A100-SXM 271.2 (86.9% of
# 312), A100-PCIe 252.9, H100-SXM 794.5 ("H200 is the same"), GH200
# 828.6. At a given shape, that times the shape's rate over the best in
# OpenXLA's measured sm_90 table (hetgpt/rates.py): small dimensions run
# far below the best.
MAMF = {'A100-80GB': 271.2, 'A100-40GB': 271.2,
        'A100-PCIe-80GB': 252.9, 'A100-PCIe-40GB': 252.9,
        'H100-SXM': 794.5, 'H200': 794.5,
        'GH200': 828.6, 'GH200-144GB': 828.6}
# A part without a row: its datasheet's dense peak times 0.8, about the
# median of that table's NVIDIA rows (A100-SXM 86.9%, GH200 83.8,
# A100-PCIe 81.1, H100 80.3, B200 77.6, GB200 72.9%)
MAMF_FALLBACK = 0.8
# Attention (SDPA: torch 2.11-2.13 runs FlashAttention-2 on Ampere and
# Hopper), its FLOPs as FlashAttention counts them
# (costs.attention_flops), a fraction of dense peak (forward, backward):
# FA2 on A100 up to 73% forward and 63% backward (Dao, arXiv 2307.08691);
# on H100 FA2 reaches 35% (Shah et al., FlashAttention-3, arXiv
# 2407.08608; pytorch/benchmark#2296 measured torch's SDPA forward at
# 287-304 TFLOP/s, 29-31%, head dimension 128).
ATTENTION = {'A100-80GB': (0.73, 0.63), 'A100-40GB': (0.73, 0.63),
             'A100-PCIe-80GB': (0.73, 0.63),
             'A100-PCIe-40GB': (0.73, 0.63),
             'H100-SXM': (0.35, 0.35), 'H100-PCIe': (0.35, 0.35),
             'H200': (0.35, 0.35), 'H200-NVL': (0.35, 0.35),
             'GH200': (0.35, 0.35), 'GH200-144GB': (0.35, 0.35)}
# a part without a row: the lower, Hopper's
ATTENTION_FALLBACK = (0.35, 0.35)
# Every other kernel (norms, activations, residual adds, dropout, casts,
# the loss's softmax, embedding gathers, the optimizer): bytes moved at
# this fraction of HBM's datasheet bandwidth, what a streaming kernel
# reaches (cub's BabelStream triad: 87-88% of DRAM peak,
# NVIDIA/cccl#9881)
HBM_EFFICIENCY = 0.87
# Rows beyond which a matmul's rate is the table's edge (4 × 4096): the
# clock runs a micro-batch of at most that many tokens and scales its
# counts (costs.work's fake run then stays cheap)
ROWS = 16384

# Guesses that a probe step replaces; each is what the dry run assumes.
# NCCL bus bandwidth / link's nominal (nccl-tests: ~230 of 300 GB/s,
# NVLink)
LINK_EFFICIENCY = 0.7
# NCCL bus bandwidth / NIC line rate: 46-48 of 50 GB/s per NDR 400 Gb/s
# NIC (NVIDIA on nccl-tests#290 and #267)
NIC_EFFICIENCY = 0.93
# one NCCL collective's start-up: a 4-byte all-reduce over 2 nodes of 8
# GPUs takes 47 us (nccl#1244); it bounds what small messages cost
COLLECTIVE_S = 50e-6
# pinned copies / PCIe nominal (A100 H2D 25 of 31.5, H100 35-53 of 63
# GB/s)
PCIE_EFFICIENCY = 0.7
# bytes/s per node of the CPU's optimizer step where nothing says (a
# guess)
HOST_ADAM_BW = 100e9
# seconds per layer per micro-batch (forward + backward kernel launches)
LAUNCH_S = 1e-4
# seconds per FSDP group per micro-batch: hooks, copy-in/copy-out
FSDP_GROUP_S = 2e-4
# FLOP/s of a CPU rank's thread when not measured (float32), a round
# figure: 512x512 matmuls on one thread of this machine's AMD EPYC (AVX-512) ran at
# 86-90 GFLOP/s, two threads at 183 (bench/RESULTS.md, "plan.py
# --measured"); a rank computes on its threads (cpu_flops)
CPU_FLOPS = 1e11
# gloo over loopback, bytes/s as a ring counts them: an all-reduce of
# 29.1 MB between 2 processes of this machine took 31 ms
# (bench/gloo_collectives.py, bench/RESULTS.md "plan.py --measured")
CPU_COMM_BW = 0.94e9
DDP_BUCKET = 25 * 2**20  # bytes per all-reduce: DDP's default bucket_cap_mb
# its first bucket's (torch.distributed._DEFAULT_FIRST_BUCKET_BYTES)
DDP_FIRST_BUCKET = 2**20
# Local steps' outer step on the host, bytes per parameter (float32): the
# change (anchor and weight read, the change written: 12), weighted (8),
# into and out of the exchange buffer (16), the momentum (read it and the
# change, write it: 12), the anchor (read the change, momentum and
# anchor, write a sum and the anchor: 20), the weight set (8)
HOST_BYTES = 76


def _dev(rank):
    """The datasheet row of a rank's GPU (UNKNOWN_GPU's if none)."""
    return GPUS.get(rank.get('gpu')) or UNKNOWN_GPU


def peak(rank, dtype):
    """A rank's peak FLOP/s in dtype; None for a CPU rank."""
    if rank['device'] == 'cuda':
        return peak_flops(rank['gpu'], dtype)
    return None


def _peak(gpu, dtype):
    """A GPU's peak FLOP/s in dtype (UNKNOWN_GPU's bf16 if not known)."""
    return peak_flops(gpu, dtype) or UNKNOWN_GPU['bf16'] * 1e12


def _log_interp(grid, x):
    """(index, weight of the next) of x in an ascending grid.

    In log space, clamped to the grid's ends.
    """
    x = min(max(x, grid[0]), grid[-1])
    i = max(j for j in range(len(grid)) if grid[j] <= x)
    if i == len(grid) - 1:
        return i - 1, 1.0
    return i, math.log(x / grid[i]) / math.log(grid[i + 1] / grid[i])


def shape_rate(b, m, n, k):
    """The share of the best rate that (b×) m×k @ k×n reaches.

    The sm_90 table's TFLOP/s at the shape, interpolated (log-linear in
    each of rows b·m, n and k) and clamped to its edges, over the
    table's best. An n or k beyond the table is more products of the
    table's largest as a batch: n/4096 column blocks, or k/4096 slices
    summed (split-K, as cuBLAS runs a long inner dimension), more rows.
    """
    dims, table = GEMM_SM90['dims'], GEMM_SM90['tflops']
    rows = b * m * max(1, n / dims[-1]) * max(1, k / dims[-1])
    picks = [_log_interp(GEMM_SM90['rows'], rows),
             _log_interp(dims, n), _log_interp(dims, k)]
    out = 0.0
    for corner in range(8):
        w, at = 1.0, []
        for axis, (i, t) in enumerate(picks):
            up = corner >> axis & 1
            if up:
                w *= t
            else:
                w *= 1 - t
            at.append(i + up)
        if w:
            out += w * table[at[0]][at[1]][at[2]]
    return out / GEMM_SM90['best']


def matmul_seconds(gpu, dtype, b, m, n, k):
    """Seconds of one (b×) m×k @ k×n on this GPU in this dtype.

    Its part's best (MAMF, else the fallback) in the dtype's tensor-core
    rate, at the shape's share of the best (shape_rate).
    """
    if gpu in MAMF:
        best = MAMF[gpu] * 1e12 * _peak(gpu, dtype) \
            / _peak(gpu, 'bfloat16')
    else:
        best = MAMF_FALLBACK * _peak(gpu, dtype)
    return 2 * b * m * n * k / (best * shape_rate(b, m, n, k))


def attention_seconds(gpu, dtype, batch, heads, q, kv, head_dim, causal,
                      backward):
    """Seconds of one attention kernel on this GPU in this dtype."""
    forward, back = ATTENTION.get(gpu, ATTENTION_FALLBACK)
    flops = costs.attention_flops(batch, heads, q, kv, head_dim, causal,
                                  backward)
    share = forward
    if backward:
        share = back
    return flops / (share * _peak(gpu, dtype))


def memory_seconds(gpu, nbytes):
    """Seconds to move nbytes through this GPU's HBM."""
    hbm = _dev(dict(gpu=gpu))['hbm']
    return nbytes / (hbm * 1e9 * HBM_EFFICIENCY)


def said(ranks):
    """How the plan timed each kind of GPU in it, in one line.

    Each kind: a published row, or the stated fallback; and the step
    efficiency its compute runs at (its generation's prior, or measured).
    """
    out = []
    gpus = {r['gpu']: r for r in ranks if r['device'] == 'cuda'}
    for gpu, r in gpus.items():
        if gpu in MAMF:
            mm = f"matmuls {MAMF[gpu]:g} TFLOP/s at best"
        else:
            mm = f"matmuls at {MAMF_FALLBACK:.0%} of peak (no MAMF row)"
        att = ATTENTION.get(gpu)
        if att:
            att = f"attention {att[0]:.0%}/{att[1]:.0%}"
        else:
            share = ATTENTION_FALLBACK[0]
            att = f"attention at {share:.0%} of peak (no row)"
        e, gen = prior(gpu)
        how = f"{gen or 'fallback'} prior"
        if r.get('efficiency'):
            e, how = r['efficiency'], 'measured'
        out.append(f"{gpu or 'GPU'} {mm}, {att}, "
                   f"step efficiency {e:.2f} ({how})")
    if not out:
        r = ranks[0]
        flops = cpu_flops(r) * step_efficiency(r)
        threads = ''
        if not r.get('flops'):
            threads = f" ({r.get('threads', 1)} thread(s) a rank)"
        return f"CPU at {flops:.3g} FLOP/s{threads}"
    hbm = f"memory at {HBM_EFFICIENCY:.0%} of HBM"
    return '; '.join(out + [hbm])


def launches(cfg, shard):
    """c0: a micro-batch's seconds whatever its size.

    Kernel launches (LAUNCH_S a layer); under FSDP (shard), its hooks
    too (FSDP_GROUP_S a group).
    """
    hooks = 0.0
    if shard:
        hooks = (cfg.n_layer + 1) * FSDP_GROUP_S
    return cfg.n_layer * LAUNCH_S + hooks


@functools.lru_cache(maxsize=None)
def _kernels(cfg, gpu, dtype, shard, ac, micro):
    """Seconds of a GPU's kernels in one micro-batch, by kind.

    {matmuls, attention, memory: the rest, by bytes} for a micro-batch
    of `micro` sequences: run (costs.work) at up to ROWS tokens and
    grown to micro (_grown; the bytes affine in the micro-batch beyond).
    """
    strategy = 'ddp'
    if shard:
        strategy = 'fsdp'
    s = cfg.block_size
    ran = min(micro, max(1, math.ceil(ROWS / s)))
    # (run at a token count no weight or loss chunk has: _grown finds it)
    n = counts(cfg)
    taken = {d for x in n['block_shapes'] + n['root_shapes'] for d in x}
    taken |= set(costs.network.LOSS_CHUNK['cuda'])
    while ran < micro and ran * s in taken:
        ran += 1
    w = costs.work(cfg, ran, strategy, dtype, ac)
    mm = sum(c * _grown(key[:4], ran, micro, s, gpu, dtype)
             for key, c in w['matmuls'].items())
    att = sum(c * attention_seconds(gpu, dtype, *key[:7])
              for key, c in w['attention'].items())
    nbytes = w['bytes']
    if micro > ran:
        # affine beyond: the weights' casts and gradients once, the rest
        # per sequence
        other = ran // 2 or 2
        at = costs.work(cfg, other, strategy, dtype, ac)['bytes']
        nbytes += (nbytes - at) / (ran - other) * (micro - ran)
    return dict(matmuls=mm, attention=att * micro / ran,
                memory=memory_seconds(gpu, nbytes))


def _grown(shape, ran, micro, block_size, gpu, dtype):
    """Seconds of a matmul recorded at `ran` sequences, run at `micro`.

    Its rows or its inner dimension (the weights' gradients) that are
    ran's tokens grow to micro's; any other (the loss's chunks, a
    batched product) runs micro / ran times as often.
    """
    b, m, n, k = shape
    tokens, more = ran * block_size, micro / ran
    if m == tokens or k == tokens:
        if m == tokens:
            m = micro * block_size
        if k == tokens:
            k = micro * block_size
        return matmul_seconds(gpu, dtype, b, m, n, k)
    return more * matmul_seconds(gpu, dtype, b, m, n, k)


def cpu_flops(rank):
    """A CPU rank's FLOP/s (or the host's, for a GPU rank's offloaded
    work): as stated (plan.py --cpu_gflops), else CPU_FLOPS × its
    threads (rank['threads']: torch's intra-op threads, 1 where not
    said)."""
    return rank.get('flops') or CPU_FLOPS * rank.get('threads', 1)


def compute(cfg, rank, ac, shard, micro):
    """(c0, c1) of a rank at micro-batches of `micro` sequences.

    A micro-batch takes c0 + c1 × its size (balance.py splits by them).
    A GPU: its kernels by kind (_kernels), c1 their seconds per sequence
    at this size; a CPU: its FLOPs at cpu_flops. Both over the rank's
    step efficiency (efficiency.step_efficiency: kernel rates are the
    ceiling).
    """
    eff = step_efficiency(rank)
    c0 = launches(cfg, shard) / eff
    if rank['device'] == 'cpu':
        flops = cpu_flops(rank)
        return c0, flops_per_sequence(cfg, ac) / flops / eff
    gpu = None
    if rank['gpu'] in GPUS:
        gpu = rank['gpu']
    micro = max(micro, 1)
    kernels = _kernels(cfg, gpu, rank['dtype'], shard, ac, micro)
    return c0, sum(kernels.values()) / micro / eff


def per_sequence(cfg, rank, ac, shard, micro):
    """Seconds per sequence at this micro-batch."""
    c0, c1 = compute(cfg, rank, ac, shard, micro)
    return c1 + c0 / max(micro, 1)


def _link(r, kinds):
    """GB/s of a GPU rank's link inside its node.

    NVLink (p2p) where its node holds one kind of GPU; PCIe (host)
    between unlike GPUs in one node. kinds: node -> the kinds in it.
    """
    if len(kinds[r['node']]) == 1:
        return _dev(r)['p2p']
    return _dev(r)['host']


def bandwidth(ranks, inter_node_bw):
    """NCCL's bus bandwidth (nccl-tests' busbw) for these ranks, bytes/s.

    An all-gather or a reduce-scatter of S bytes over N ranks takes
    (N-1)/N S / busbw, an all-reduce twice that. Inside a node: the
    GPUs' link (NVLink; PCIe between unlike GPUs in one node), the
    slowest node's bounding the ring. Between nodes NCCL runs its rings
    (channels) through all of a node's NICs at once, so a node's
    boundary carries the sum of its NICs: each GPU's share 'net' (or
    inter_node_bw), summed over the node's GPUs, the slowest node
    bounding (NVIDIA on nccl-tests#267: all-to-all alone is held to one
    NIC). NCCL's trees (all-reduce across many nodes) reach the same
    busbw: they save latency only. gloo for CPU ranks: loopback's rate
    in a node; between nodes, their link's (inter_node_bw per rank,
    summed over a node's ranks as NICs are) where given.
    """
    if any(r['device'] == 'cpu' for r in ranks):
        if cluster.node_count(ranks) == 1 or not inter_node_bw:
            return CPU_COMM_BW
        fewest = min(cluster.per_node(ranks).values())
        return min(CPU_COMM_BW, NIC_EFFICIENCY * inter_node_bw * fewest)
    kinds = {}  # node -> the kinds of GPU in it
    for r in ranks:
        kinds.setdefault(r['node'], set()).add(r['gpu'])
    slowest = min(_link(r, kinds) for r in ranks)
    intra = LINK_EFFICIENCY * slowest * 1e9
    nics = cluster.per_node(
        ranks, lambda r: inter_node_bw or _dev(r)['net'] * 1e9)
    if cluster.node_count(ranks) == 1:
        return intra
    return min(intra, NIC_EFFICIENCY * min(nics.values()))


def host_bw(ranks):
    """Bytes/s per node of the optimizer's step on its host CPU: {node:}.

    For offload and a CPU rank's step: what its GPU ranks measured at
    start-up, each its own step, all at once (hardware.this_rank),
    summed; in a dry run, its ranks' threads (one each under torchrun)
    or its reference system's memory, the lesser (gpus.HOST_BW); else
    HOST_ADAM_BW.
    """
    bw = cluster.per_node(ranks, lambda r: r.get('host_bw') or 0)
    nodes = cluster.per_node(ranks)
    for r in ranks:
        if bw[r['node']]:
            continue
        known = None
        if r['device'] == 'cuda':
            known = HOST_BW.get(r['gpu'])
        if known:
            threads = nodes[r['node']] * HOST_THREAD_BW
            bw[r['node']] = min(threads, known) * 1e9
        else:
            bw[r['node']] = HOST_ADAM_BW
    return bw


def last_bucket(n, R, ring, bw):
    """Seconds of DDP's last bucket's all-reduce.

    It holds the first parameters, the embedding among them, whose
    gradient is complete only when the backward ends, so no compute
    hides it. Buckets fill from the last parameters: one of
    DDP_FIRST_BUCKET bytes, then DDP_BUCKET each, the last the rest; a
    tensor is never split, so the last holds at least the embedding (the
    largest tensor outside the blocks: gpt_tiny's 25.8 MB, over a
    bucket, alone in the last).
    """
    rest = 4 * n['total'] - DDP_FIRST_BUCKET
    if rest > 0:
        last = rest - DDP_BUCKET * ((rest - 1) // DDP_BUCKET)
    else:
        last = 4 * n['total']
    largest = max(math.prod(s) for s in n['root_shapes'])
    last = max(last, 4 * largest)
    if R > 1:
        return 2 * ring * last / bw + COLLECTIVE_S
    return 0.0


def all_reduce(n, R, ring, bw):
    """Seconds of DDP's all-reduce of the fp32 grads.

    On a ring (2(N-1)/N of them), in buckets of 25 MiB (DDP's
    bucket_cap_mb), a collective each.
    """
    buckets = 0
    if R > 1:
        buckets = math.ceil(4 * n['total'] / DDP_BUCKET)
    return 2 * ring * 4 * n['total'] / bw + buckets * COLLECTIVE_S


def _comm(f, n, R, ring, bw, cb, ranks, per_node, accumulate, mine):
    """FSDP2's seconds per micro-batch of (gathers, reduce, host add).

    An all-gather of 16-bit weights (forward, and again for backward
    when resharded) and a reduce-scatter of fp32 grads, each (N-1)/N of
    the model; under offload the fp32 shards cross PCIe to the device
    before each all-gather and the grads back (one rank too: no ring,
    the same copies). Offloaded and reduced after each micro-batch,
    every micro-batch but the first adds its gradients to the host's:
    FSDP2 then copies them back synchronously (its add on the host needs
    them) and adds on the CPU (read 2, write 1 fp32 per parameter): not
    overlapped. Each of the model's FSDP groups (a block each, and the
    root) starts its own collectives.
    """
    gathers = 1
    if f['reshard_after_forward']:
        gathers = 2
    pcie = min(_dev(r)['host'] for r in ranks) * 1e9 * PCIE_EFFICIENCY
    start = 0.0
    if R > 1:
        start = COLLECTIVE_S * (n['layers'] + 1)
    gather = gathers * (ring * cb * n['total'] / bw + start)
    reduce = ring * 4 * n['total'] / bw + start
    if f['offload']:
        gather += gathers * 4 * mine / pcie
        reduce += 4 * mine / pcie
    host_add = 0.0
    if f['offload'] and not accumulate:
        host = host_bw(ranks)
        add = max(12 * mine * k / host[node]
                  for node, k in per_node.items())
        host_add = 4 * mine / pcie + add
    return gather, reduce, host_add


@functools.lru_cache(maxsize=None)
def _matmuls_seconds(items, device, gpu, flops, offload):
    """Seconds of these matmuls ((b, m, n, k, dtype), count) on a rank.

    A GPU's (gpu: its GPUS key, or None): each at its shape's rate in
    its dtype (matmul_seconds); the host's under offload, or a CPU
    rank's: at flops (its cpu_flops).
    """
    total = 0.0
    for (b, m, n, k, dtype), count in items:
        if offload or device == 'cpu':
            total += count * 2 * b * m * n * k / flops
        else:
            total += count * matmul_seconds(gpu, dtype, b, m, n, k)
    return total


def optimizer_matmul_seconds(cfg, ranks, f):
    """Each entry's seconds of its optimizer step's matmuls: a list.

    Counted from the optimizer as built (costs.optimizer_matmuls: Muon's
    Newton-Schulz iterations), on the rank that runs them: under DDP
    every rank steps every matrix; under FSDP2 (f['shard']) a matrix
    whose update needs it whole is stepped by its owner
    (hetgpt/owners.py, as memory.optimizer_state keeps its state), any
    other by each rank on its shard (a 1/N share). An entry of several
    ranks: its busiest.
    """
    n, R = counts(cfg), cluster.world(ranks)
    done = costs.optimizer_matmuls(replace(cfg, n_layer=1))
    done = dict(block=done[0], root=done[1])
    whole = dict(block=(), root=())
    share, mats = 1.0, []
    if f['shard']:
        whole = dict(zip(('block', 'root'), costs.optimizer_whole(cfg)))
        share, mats = 1 / R, whole_matrices(cfg)
    # what every rank steps: all of it (DDP), its shards' share (FSDP2)
    every = []
    for part, times in (('block', n['layers']), ('root', 1)):
        stepped = itertools.zip_longest(done[part], whole[part])
        every += [(times * share, items)
                  for items, w in stepped if not w]
    owner = owners_of(tuple(size for size, _, _ in mats), R)
    seconds, first = [], 0
    for r in ranks:
        gpu = None
        if r.get('gpu') in GPUS:
            gpu = r['gpu']
        on = (r['device'], gpu, cpu_flops(r), f['offload'])
        # the seconds of the matrices each of the entry's ranks owns
        load = Counter()
        for (_, part, i), k in zip(mats, owner):
            if first <= k < first + r.get('count', 1):
                load[k] += _matmuls_seconds(done[part][i], *on)
        own = sum(w * _matmuls_seconds(items, *on) for w, items in every)
        seconds.append(own + max(load.values(), default=0.0))
        first += r.get('count', 1)
    return seconds


def whole_exchange(cfg, R, ring, bw):
    """Seconds of a whole-matrix optimizer's exchange under FSDP2.

    hetgpt/run/whole_matrix.py, one matrix at a time: its weight's and
    gradient's rows gathered to its owner and the new weight's rows
    sent back (float32: 12 bytes an element, (N-1)/N of them through
    the owner's link), three collectives. 0 for an elementwise one.
    """
    mats = whole_matrices(cfg)
    if R == 1 or not mats:
        return 0.0
    elements = sum(size for size, _, _ in mats)
    return 12 * elements * ring / bw + 3 * len(mats) * COLLECTIVE_S


def _parts(shares):
    """The split's parts, [(entry, ranks, share)], from its shares."""
    return [(i, k, x) for i, p in enumerate(shares) for x, k in p]


def step(cfg, batch, ranks, f, caps, ac, accumulate, weights=None,
         inter_node_bw=None):
    """(seconds, parts) of a step of strategy f on these ranks.

    f: knobs.flags. At the ranks' micro-batch caps, each rank computing
    in its r['dtype'] and checkpointing its blocks or not (ac): the
    batch split by speed (balance.py; by weights if given), each rank's
    micro-batches as runs of equal sizes (balance.runs: at most two),
    timed in closed form. ranks: entries of identical ranks
    (hetgpt/planner/cluster.py), caps and ac one per entry; the split
    may give an entry's ranks two shares or three, so parts is [(entry,
    how many ranks, share, runs)] in rank order.
    """
    R, n = cluster.world(ranks), counts(cfg)
    m = [r.get('count', 1) for r in ranks]
    per_node = cluster.per_node(ranks)
    # Compute: each rank's kernels at its micro-batch cap, plus launches
    # per micro-batch.
    c0, c1 = zip(*(compute(cfg, r, a, f['shard'], cap)
                   for r, a, cap in zip(ranks, ac, caps)))
    c0, c1 = list(c0), list(c1)
    if f['shard']:
        mine = sharded(n['block_shapes'], R) * cfg.n_layer \
            + sharded(n['root_shapes'], R)
    else:
        mine = n['total']
    # Optimizer step: memory bound (fused AdamW), on the device; on the
    # host under offload (or for CPU ranks), where the ranks of a node
    # share its memory bandwidth. It streams p, g and its state in, p
    # and the state out; clipping reads g. And its matmuls (Muon's
    # Newton-Schulz), counted: optimizer_matmul_seconds.
    step_bytes = 16 * mine + 2 * optimizer_state(cfg, R, f['shard'])
    host = host_bw(ranks)
    opt = []
    matmuls = optimizer_matmul_seconds(cfg, ranks, f)
    for r, mm in zip(ranks, matmuls):
        if f['offload'] or r['device'] == 'cpu':
            per_byte = per_node[r['node']] / host[r['node']]
        else:
            per_byte = 1 / (_dev(r)['hbm'] * 1e9 * HBM_EFFICIENCY)
        opt.append(step_bytes * per_byte + mm)
    bw, ring = bandwidth(ranks, inter_node_bw), (R - 1) / R
    if f['shard']:
        opt = [t + whole_exchange(cfg, R, ring, bw) for t in opt]
    cb = 2  # (FSDP's gathers: one dtype)
    if ranks[0]['dtype'] == 'float32':
        cb = 4
    # Collectives beside compute: a GPU's overlap (NCCL's kernels on
    # their own stream); a CPU rank's add (gloo's threads take the cores
    # its compute runs on: bench/RESULTS.md, "plan.py --measured")
    cpu = any(r['device'] == 'cpu' for r in ranks)
    beside = max
    if cpu:
        beside = operator.add
    if not f['shard']:
        # DDP: each rank alone, then the all-reduce of the fp32 grads
        # (all_reduce), overlapped with the backward (2/3) of the
        # slowest rank's last micro-batch, all but its last bucket
        # (CPU ranks: not overlapped).
        if weights:
            shares = weighted_shares(batch, weights, m)
        else:
            shares = split_shares(batch, caps, c0, c1, fixed=opt,
                                  counts=m)
        split = _parts(shares)
        rs = [runs(x, caps[i]) for i, _, x in split]
        busy = []
        for (i, _, _), r in zip(split, rs):
            t = sum(k * (c0[i] + c1[i] * max(s, 1)) for s, k in r)
            busy.append(t + opt[i])
        slow = max(range(len(split)), key=busy.__getitem__)
        i = split[slow][0]
        last = c0[i] + c1[i] * max(rs[slow][-1][0], 1)
        exposed = max(last_bucket(n, R, ring, bw),
                      all_reduce(n, R, ring, bw) - 2 / 3 * last)
        if cpu:
            exposed = all_reduce(n, R, ring, bw)
        parts = [(*p, r) for p, r in zip(split, rs)]
        return busy[slow] + exposed, parts
    gather, reduce, host_add = _comm(f, n, R, ring, bw, cb, ranks,
                                     per_node, accumulate, mine)
    # FSDP: the same count K of micro-batches on every rank; each waits
    # for the slowest rank's piece, and prefetching overlaps the
    # collectives with compute. K is tried from the fewest up while the
    # caps still bind the split: every K for a batch of up to
    # balance.EXACT sequences; above, one by one up to 8, then by
    # quarters (a bounded number of tries, where a large batch would try
    # every count while a rank is full).
    # each micro-batch's collectives (accumulating, only the last one
    # reduces: below)
    comm = gather
    if not accumulate:
        comm = gather + reduce
    best = None
    K = math.ceil(batch / sum(c * k for c, k in zip(caps, m)))
    while K <= batch:
        if weights:
            shares = weighted_shares(batch, weights, m)
        else:
            shares = split_shares(batch, caps, c0, c1, count=K,
                                  counts=m)
        split = _parts(shares)
        if weights:
            K = lockstep_count([x for *_, x in split],
                               [caps[i] for i, *_ in split])
        rs = [runs(x, caps[i], K) for i, _, x in split]
        segments = lockstep_segments(rs, [c0[i] for i, *_ in split],
                                     [c1[i] for i, *_ in split])
        t = sum(k * beside(comm, c) for k, c in segments)
        if accumulate:  # (the last micro-batch reduces)
            end = segments[-1][1]
            t += beside(gather + reduce, end) - beside(gather, end)
        t += host_add * (K - 1)
        if best is None or t + max(opt) < best[0]:
            parts = [(*p, r) for p, r in zip(split, rs)]
            best = (t + max(opt), parts)
        if weights or all(x < K * caps[i] for i, _, x in split):
            break  # no rank is full: more micro-batches only cost
        if batch <= EXACT:
            K += 1
        else:
            K += max(1, K // 4)
    seconds, split = best
    # the root group (tied embeddings) is gathered before anything can
    # run and reduced after everything has: its collectives are exposed
    if R > 1:
        seconds += ring * (cb + 4) * n['root'] / bw
    return seconds, split


# -----------------------------------------------------------------------------
# The time of a step with local steps, for the planner (plan.py): each
# node's step alone, and once per round the exchange over the link.
def local_step_times(plan, interval, inter_node_bw=None):
    """(every step, local steps, exchange) seconds of a plan.

    For a plan made by search.make_plan with inter_node_bw (as bandwidth
    reads it): every step, the plan's own step; with local steps of
    interval H, the slowest node's step alone (its part of the batch
    over its ranks, as the plan splits it) + the exchange / H. The
    exchange: a ring of the N nodes carries 2(N-1)/N of 4 bytes per
    parameter each way over each node's link, through gloo on the host,
    at the link's rate (bandwidth) at most gloo's (CPU_COMM_BW); the
    node's ranks gather the pieces at its own links' rate; GPU ranks
    copy the weights to and from the host; the host's update
    (HOST_BYTES) at a thread's rate (gpus.HOST_THREAD_BW).
    The plan's ranks are parts of entries of identical ranks
    (hetgpt/planner/cluster.py; one rank each when train.py plans): a
    node of a group of nodes alike holds each entry's count / nodes
    ranks, timed at the largest share of the entry's parts.
    """
    cfg, ranks, f = plan.config, plan.ranks, flags(plan.strategy)
    n = counts(cfg)['total']
    # an entry (its node group, its first rank) -> its parts' indices
    parts = {}
    for k, r in enumerate(ranks):
        parts.setdefault((r['node'], r['rank']), []).append(k)
    entries = [dict(ranks[ks[0]], count=sum(ranks[k]['count'] for k in ks))
               for ks in parts.values()]
    alone, inside = 0.0, 0.0
    for node in {r['node'] for r in ranks}:
        mine, batch, caps, ac, weights = [], 0, [], [], []
        for (at, _), ks in parts.items():
            if at != node:
                continue
            count = sum(ranks[k]['count'] for k in ks)
            width = count // ranks[ks[0]]['nodes']
            k = max(ks, key=lambda k: plan.share[k])
            mine.append(dict(ranks[k], count=width, nodes=1))
            batch += width * plan.share[k]
            caps.append(plan.caps[k])
            ac.append(plan.ac[k])
            if plan.weights:
                weights.append(plan.weights[k])
        if batch:
            given = None
            if plan.weights:
                given = weights
            accumulate = not plan.reduce_every_micro_batch
            t = step(cfg, batch, mine, f, caps, ac, accumulate,
                     given)[0]
            alone = max(alone, t)
        L = sum(r['count'] for r in mine)
        inside = max(inside, (L - 1) / L * 4 * n / bandwidth(mine, None))
    N = cluster.node_count(entries)
    link = min(bandwidth(entries, inter_node_bw), CPU_COMM_BW)
    across = 0.0
    if N > 1:
        across = 2 * (N - 1) / N * 4 * n / link
    gpu = [r for r in ranks if r['device'] == 'cuda']
    pcie = [_dev(r)['host'] * 1e9 * PCIE_EFFICIENCY for r in gpu]
    copies = max((8 * n / p for p in pcie), default=0.0)
    update = HOST_BYTES * n / (HOST_THREAD_BW * 1e9)
    exchange = across + inside + copies + update
    return plan.step_time, alone + exchange / max(1, interval), exchange
