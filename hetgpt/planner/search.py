"""
The planner: how a GPT config trains on the devices at hand, decided before
any weight is allocated.

For each strategy (DDP or FSDP2, with or without per-block activation
checkpointing and CPU offload) it finds the largest micro-batch that fits
on each rank (by hetgpt/planner/memory.py's estimate) and times the step
(hetgpt/planner/timing.py); it picks the fastest strategy that fits and
splits the global batch over unlike ranks so that they finish together
(hetgpt/planner/balance.py). train.py applies the plan and checks it with
a real probe step (hetgpt/run/probe.py).
"""
import functools
import math
from collections import Counter
from dataclasses import replace

from hetgpt.errors import die
from hetgpt.gpus import GPUS
from hetgpt.hardware import native_dtype
from hetgpt.knobs import (DTYPES, STRATEGIES, dtype_name, flags,
                          refuses_local_steps)
from hetgpt.planner import cluster, costs, timing
from hetgpt.planner.balance import lockstep_count, pieces, split, weighted
from hetgpt.planner.costs import counts
from hetgpt.planner.memory import (CPU_OVERHEAD, GPU_OVERHEAD, GiB,
                                   estimate, held)
from hetgpt.planner.plan import Plan

# Of a host's memory (a CPU rank's, a node's), what the planner fills: the
# rest is the kernel's and the page cache's, which no process counts (a
# guess)
HOST_FRACTION = 0.9


def _normalise(ranks, fraction):
    """The entries with every field the planner reads.

    ranks: entries, each of `count` identical ranks
    (hetgpt/planner/cluster.py); fraction: memory_fraction.
    """
    given = [dict(dict(gpu=None, node=0, host_mem=None), **r) for r in ranks]
    out = cluster.normalise(given)
    for r in out:
        if 'device' not in r:
            r['device'] = 'cpu'
            if r['gpu']:
                r['device'] = 'cuda'
        # (a running rank's, from torch; a planned one's, from the GPU
        # table)
        r.setdefault('dtype', native_dtype(r['device'],
                                           r['gpu'] or 'unknown'))
        assert r.get('mem') or r['gpu'] in GPUS, \
            f"rank {r}: give mem (bytes) for a CPU rank or a GPU not in GPUS"
        r['mem'] = r.get('mem') or GPUS[r['gpu']]['mem']
        if r.get('overhead') is None:
            r['overhead'] = CPU_OVERHEAD
            if r['device'] == 'cuda':
                r['overhead'] = GPU_OVERHEAD
        # What the planner may fill: a GPU's total as CUDA gives it (the
        # estimate holds its context and the allocator's pages); of a
        # host's, HOST_FRACTION. memory_fraction leaves the rest to
        # another job.
        host = HOST_FRACTION
        if r['device'] == 'cuda':
            host = 1
        r['fraction'], r['budget'] = fraction, r['mem'] * fraction * host
        r['host_budget'] = r['host_mem'] and \
            r['host_mem'] * fraction * HOST_FRACTION
    return out


def dtype_options(ranks, shard):
    """The compute dtypes (one per rank) a strategy may run.

    Each rank's r['dtype'] is its own (native, or given by the dtype
    knob). DDP keeps float32 weights on every rank and each rank autocasts
    to its own; FSDP2 gathers the weights in one dtype for all: each
    rank's own on every rank (the others emulate bfloat16 at their float32
    rate, or scale float16's loss). (Several dtypes given: make_plan tries
    no FSDP strategy.)
    """
    own = [r['dtype'] for r in ranks]
    if not shard or len(set(own)) == 1:
        return [own]
    return [[d] * len(ranks) for d in DTYPES if d in own]


def _evaluate(cfg, batch, ranks, strategy, mbs, inter_node_bw, weights=None,
              choose=True):
    """The strategy under each choice of dtypes (dtype_options): the
    fastest that fits, else the last.

    FSDP accumulates in one of two ways: reduce-scatter after every
    micro-batch (gradients stay sharded), or accumulate unsharded fp32
    gradients and reduce once per step (+4P bytes, fewer collectives).
    The second is tried when the first fits and needs several
    micro-batches.
    """
    tried = []
    shard = flags(strategy)['shard']
    for dtypes in dtype_options(ranks, shard):
        typed = [dict(r, dtype=d) for r, d in zip(ranks, dtypes)]
        args = (cfg, batch, typed, strategy, mbs, inter_node_bw)
        best = _evaluate_one(*args, False, weights, choose)
        if shard and 'step' in best and max(_counts(best)) > 1:
            second = _evaluate_one(*args, True, weights, choose)
            if 'step' in second and second['step'] < best['step']:
                best = second
        tried.append(dict(best, dtypes=dtypes))
    ok = [r for r in tried if 'step' in r]
    best = tried[-1]
    if ok:
        best = min(ok, key=lambda r: r['step'])
    best['dtype_steps'] = []
    if len(tried) > 1:
        best['dtype_steps'] = [(r['dtypes'][0], r.get('step'))
                               for r in tried]
    return best


def _evaluate_one(cfg, batch, ranks, strategy, mbs, inter_node_bw,
                  accumulate, weights=None, choose=True):
    """One strategy on these ranks: caps, host check, split, predicted
    step time, as a dict ('step' in it where it fits).

    choose: under DDP+AC each rank checkpoints only if that is faster (a
    rank that cannot hold one sequence without it; not one whose
    micro-batch without it is merely smaller). Each rank computes in its
    r['dtype']. ranks: entries of identical ranks (cluster.py): caps, ac,
    need are per entry; the split (share, runs, predicted) per part of an
    entry (timing.step's parts).
    """
    f, R = flags(strategy), cluster.world(ranks)
    per_node = cluster.per_node(ranks)
    memo = {}

    def est(r, b, micro_batches=2, s=strategy):
        """memory.estimate of rank r at micro-batch b under strategy s."""
        return estimate(cfg, s, b, R, r['dtype'], per_node[r['node']],
                        r['overhead'], r['device'], accumulate,
                        micro_batches)

    def cap(r, s):
        """The largest micro-batch of rank r under its budget with
        strategy s (totals grow with it)."""
        key = (r['device'], r['mem'], r['overhead'], r['dtype'],
               per_node[r['node']], s)
        if key in memo:
            return memo[key]
        budget, low, high = r['budget'], 0, batch
        while low < high:
            mid = (low + high + 1) // 2
            if held(r['device'], est(r, mid, s=s)) <= budget:
                low = mid
            else:
                high = mid - 1
        # one rank whose whole batch is one micro-batch holds no gradients
        # in its forward
        if R == 1 and low < batch and \
                held(r['device'], est(r, batch, 1, s)) <= budget:
            low = batch
        if mbs and low >= min(mbs, batch):
            low = min(mbs, batch)
        elif mbs:
            low = 0
        memo[key] = low
        return low

    caps = [cap(r, strategy) for r in ranks]
    # a node's host bytes: its GPU ranks' (CPU ranks: in their budget)
    host_need = cluster.per_node(
        ranks, lambda r: est(r, 0)['host_rank'] * (r['device'] == 'cuda'))
    host_ok = all(r['host_mem'] is None
                  or host_need[r['node']] <= r['host_budget']
                  for r in ranks)
    need = [(held(r['device'], est(r, max(1, mbs))), r['budget'])
            for r in ranks]
    result = dict(strategy=strategy, accumulate=accumulate, caps=caps,
                  host_need=host_need, device_ok=min(caps) > 0,
                  host_ok=host_ok, need=need)
    if not (result['device_ok'] and host_ok):
        return result
    # Time (timing.py). Under DDP+AC a rank checkpoints if its seconds per
    # sequence are fewer; one that does not runs plain DDP.
    ac = [f['ac']] * len(ranks)
    rungs = [strategy] * len(ranks)  # each entry's strategy
    if f['ac'] and not f['shard'] and choose:
        plain = [cap(r, 'ddp') for r in ranks]
        caps = list(caps)
        for i, r in enumerate(ranks):
            c, p = caps[i], plain[i]
            ac[i] = not p or (
                timing.per_sequence(cfg, r, True, f['shard'], c)
                < timing.per_sequence(cfg, r, False, f['shard'], p))
            if not ac[i]:
                caps[i], rungs[i] = p, 'ddp'
        result['caps'] = caps
    step, parts = timing.step(cfg, batch, ranks, f, caps, ac, accumulate,
                              weights, inter_node_bw)
    result.update(parts=[(i, k) for i, k, _, _ in parts],
                  runs=[rs for *_, rs in parts])
    largest = [max(n for n, k in r if k) for r in result['runs']]
    predicted = [est(ranks[i], max(b, 1), count, rungs[i])
                 for (i, _), b, count
                 in zip(result['parts'], largest, _counts(result))]
    peaks = [timing.peak(r, r['dtype']) for r in ranks]
    peak = None
    if all(peaks):
        peak = sum(p * r['count'] for p, r in zip(peaks, ranks))
    mfu = costs.mfu(cfg, batch, step, peak)
    result.update(share=[x for _, _, x, _ in parts], predicted=predicted,
                  step=step, mfu=mfu, ac=ac,
                  tokens_per_sec=batch * cfg.block_size / step)
    return result


def _counts(result):
    """Micro-batches per part of an _evaluate_one result."""
    return [sum(k for _, k in r) for r in result['runs']]


def _expand(rs):
    """Runs [(size, how many)] as the list of sizes train.py iterates
    over."""
    out = []
    for n, k in rs:
        out += [n] * k
    return out


def _each(values, parts):
    """Values per entry as values per part of the split."""
    return [values[i] for i, _ in parts]


def _grow(ranks, k):
    """The same mix of devices k times over, with the nodes filled as now
    (8 per node if one).

    (The advice grows a mix of at most 4,096 ranks: one by one, in rank
    order.)
    """
    per = max(cluster.per_node(ranks).values())
    if cluster.node_count(ranks) == 1 and per < 8:
        per = 8
    placed = ('count', 'node', 'nodes', 'rank', 'stride')
    kinds = [{x: v for x, v in r.items() if x not in placed}
             for r in cluster.expand(ranks)]
    return cluster.layout([(1, r) for r in kinds] * k, per)


def _over(r, i):
    """How far rank i's memory is over its budget in result r (need /
    budget)."""
    return r['need'][i][0] / r['need'][i][1]


def _advice(cfg, batch, ranks, plan, tried, mbs, inter_node_bw, results):
    """What would make it fit, computed: (text, needs).

    More host memory (offload), more of the same GPUs, a shorter sequence.
    (The global batch never matters: accumulation reaches any batch.) The
    text says why first: the rung that comes closest on the device, and
    the host memory of the offload rungs.
    """
    why = ''
    if not any(r['device_ok'] for r in results):
        worst = [(max(range(len(ranks)), key=lambda i: _over(r, i)), r)
                 for r in results]
        i, r = min(worst, key=lambda w: _over(w[1], w[0]))
        alike = ''
        if ranks[i]['count'] > 1:
            alike = f", and {ranks[i]['count'] - 1:,} alike"
        why = (f"{r['strategy']} needs {r['need'][i][0] / GiB:,.1f} GiB "
               f"on rank {ranks[i]['rank']} "
               f"({ranks[i]['gpu'] or 'cpu'}{alike}) "
               f"at {max(1, mbs)} sequence(s) per micro-batch, "
               f"budget {r['need'][i][1] / GiB:,.1f}")
    for r in results:
        if r['device_ok'] and not r['host_ok']:
            node = max(r['host_need'], key=r['host_need'].get)
            x = next(x for x in ranks if x['node'] == node)
            where = f"node {node}"
            if x['nodes'] != 1:
                where = f"each of nodes {node}-{node + x['nodes'] - 1}"
            why += (f"{r['strategy']} fits the device but needs "
                     f"{r['host_need'][node] / GiB:,.0f} GiB of host "
                     f"memory on {where}, budget "
                     f"{x['host_budget'] / GiB:,.0f}")
            break
    ways, needs = [], {}
    for r in results:
        offload = flags(r['strategy'])['offload']
        if r['strategy'] in tried and offload and r['device_ok']:
            host = max(r['host_need'].values()) \
                / ranks[0]['fraction'] / HOST_FRACTION
            if host < needs.get('host_mem_per_node', math.inf):
                needs['host_mem_per_node'] = host
                ways.append(f"host memory >= {host / GiB:,.0f} GiB per "
                            f"node ({r['strategy']})")
    all_gpus = all(r['device'] == 'cuda' for r in ranks)
    # (more GPUs shrink only a sharded rung's states)
    if all_gpus and any(flags(s)['shard'] for s in tried):

        def fits(k):
            """Whether a rung tried fits on the mix k times over."""
            grown = _grow(ranks, k)
            return any('step' in _evaluate(cfg, batch, grown, s, mbs,
                                           inter_node_bw)
                       for s in tried)

        lo, hi = 1, 2
        while hi * cluster.world(ranks) <= 4096 and not fits(hi):
            lo, hi = hi, hi * 2
        if hi * cluster.world(ranks) <= 4096:
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if fits(mid):
                    hi = mid
                else:
                    lo = mid
            grown = _grow(ranks, hi)
            kinds = Counter()
            for r in grown:
                kinds[r['gpu'] or 'GPU'] += r['count']
            needs['gpus'] = cluster.world(grown)
            nodes = cluster.node_count(grown)
            ways.append(' + '.join(f"{c}×{g}" for g, c in kinds.items())
                        + f" ({nodes} node(s), same host memory per node)")
    for s in tried:
        # The states fit but not one micro-batch: the longest block_size
        # that would, a power of two (found by bisection: each size tried
        # is one more measurement of the net)
        r = next(r for r in results if r['strategy'] == s)
        if not r['host_ok'] or r['device_ok']:
            continue
        one = max(1, mbs) * cluster.world(ranks)
        sizes = [2**k for k in range(cfg.block_size.bit_length())
                 if 2**k < cfg.block_size]
        lo, hi = -1, len(sizes)  # sizes[lo] fits (-1: none), sizes[hi] not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            short = replace(cfg, block_size=sizes[mid])
            if _evaluate(short, one, ranks, s, mbs,
                         inter_node_bw)['device_ok']:
                lo = mid
            else:
                hi = mid
        if lo >= 0 and sizes[lo] > needs.get('block_size', 0):
            needs['block_size'] = sizes[lo]
            ways.append(f"block_size <= {sizes[lo]} ({s})")
    text = f"{why}."
    if ways:
        text += " Would fit with: " + '; or '.join(ways) + '.'
    return text, needs


def make_plan(cfg, batch_size, ranks, plan='auto', micro_batch_size=0,
              memory_fraction=1.0, dtype='auto', inter_node_bw=None,
              weights=None, init_device='auto', outer_interval=0,
              knobs=None):
    """The plan (a Plan) of a config on these ranks.

    ranks: one dict per rank: device 'cuda'|'cpu', gpu (GPUS key or None),
    mem (device bytes the rank may use; a CPU rank: its share of host
    memory), host_mem (its node's host bytes, None = not checked), node,
    overhead (bytes outside PyTorch's allocator; None = default); or one
    per kind of identical ranks, with their count and nodes
    (hetgpt/planner/cluster.py: plan.py's). Every candidate that fits is
    timed; the fastest wins (ties: lower rung). weights: split the batch
    in proportion to them (balance=even or w1,w2,...) instead of by speed.
    dtype: train.py's knob: auto (each rank's own, r['dtype'] or
    native_dtype; one under FSDP, the fastest), one dtype for all, or one
    per rank (DDP only). outer_interval > 0: local steps, which run only
    the strategies knobs.refuses_local_steps accepts (plan=auto tries
    only those; where none fits, the advice says whether
    outer_interval=0 does). knobs: train.py's knobs that build the
    optimizer (costs.set_train_knobs: optimizer=muon); None: train.py's
    defaults, whatever an earlier plan was made for.
    """
    costs.set_train_knobs(knobs or {})
    ranks = _normalise(ranks, memory_fraction)
    given = dtype_name(dtype).split(',')
    assert plan == 'auto' or plan in STRATEGIES, \
        f"plan={plan!r}: choose auto or one of {', '.join(STRATEGIES)}"
    assert set(given) <= {'auto', *DTYPES}, \
        f"dtype={dtype!r}: auto or some of {DTYPES}"
    R = cluster.world(ranks)
    if given != ['auto'] and len(given) not in (1, R) \
            or 'auto' in given[1:]:
        like = ','.join(['bfloat16'] * min(R, 8))
        if R > 8:
            like += ',...'
        die(f"dtype={dtype}: give auto, one dtype, or one per rank ({R}), "
            f"like " + like)
    if given != ['auto']:
        assert len(given) == 1 or R == len(ranks), \
            "a dtype per rank: one entry per rank"
        ranks = [dict(r, dtype=given[i % len(given)])
                 for i, r in enumerate(ranks)]
    tried = (plan,)
    if plan == 'auto':
        tried = STRATEGIES
    # what rules FSDP out: plan=auto leaves it untried, a plan that names
    # it is refused
    no_shard = []
    if len(set(given)) > 1:
        no_shard.append(f" with dtype={dtype}: FSDP gathers the weights in "
                        f"one dtype for all ranks; use plan=ddp or "
                        f"plan=ddp+ac, or one dtype")
    if no_shard and flags(tried[0])['shard'] and plan != 'auto':
        die(f"plan={plan}{no_shard[0]}")
    tried = tuple(s for s in tried
                  if not (no_shard and flags(s)['shard']))
    if outer_interval and plan != 'auto' and refuses_local_steps(plan):
        die(f"plan={plan} with outer_interval={outer_interval}: "
            f"{refuses_local_steps(plan)}: give one, or outer_interval=0")
    tried = tuple(s for s in tried
                  if not (outer_interval and refuses_local_steps(s)))
    evaluate = functools.partial(_evaluate, cfg, batch_size, ranks,
                                 mbs=micro_batch_size,
                                 inter_node_bw=inter_node_bw,
                                 weights=weights, choose=plan == 'auto')
    results = [evaluate(strategy=s) for s in tried]
    feasible = [r for r in results if 'step' in r]
    advice, needs = '', {}
    if feasible:
        best = min(feasible, key=lambda r: r['step'])
        offload = flags(best['strategy'])['offload']
        if any(r['host_mem'] is None for r in ranks) and offload:
            advice = "host memory not given: not checked"
    else:
        advice, needs = _advice(cfg, batch_size, ranks, plan, tried,
                                micro_batch_size, inter_node_bw, results)
        if plan != 'auto':
            auto = make_plan(cfg, batch_size, ranks, 'auto',
                             micro_batch_size, memory_fraction, dtype,
                             inter_node_bw, outer_interval=outer_interval,
                             knobs=knobs)
            if auto.fits:
                advice += f" plan=auto fits ({auto.strategy})."
                needs['plan'] = auto.strategy
        if outer_interval:
            alone = make_plan(cfg, batch_size, ranks, 'auto',
                              micro_batch_size, memory_fraction, dtype,
                              inter_node_bw, knobs=knobs)
            if alone.fits:
                advice += (f" outer_interval=0 fits ({alone.strategy}):"
                           f" local steps need a whole model on every"
                           f" rank.")
                needs['outer_interval'] = 0
        # the last rung tried, shown at one sequence per rank
        best = dict(results[-1])
        per_node = cluster.per_node(ranks)
        predicted = [estimate(cfg, best['strategy'], 1, R, d,
                              per_node[r['node']], r['overhead'],
                              r['device'])
                     for r, d in zip(ranks, best['dtypes'])]
        best.update(share=[0] * len(ranks), runs=[[(1, 1)]] * len(ranks),
                    step=0.0, mfu=None, tokens_per_sec=0.0,
                    ac=[flags(best['strategy'])['ac']] * len(ranks),
                    parts=[(i, r['count']) for i, r in enumerate(ranks)],
                    predicted=predicted)
    # Where the weights are first made: 'cpu', the whole model on the host
    # (the same weights under every strategy), when each node holds a
    # float32 copy per rank in half its memory; else 'meta', each rank
    # making only its own shard after wrapping.
    per_node, total = cluster.per_node(ranks), counts(cfg)['total']
    if init_device == 'auto':
        init_device = 'meta'
        if all(r['host_mem'] is None
               or 4 * total * per_node[r['node']] < r['host_mem'] / 2
               for r in ranks):
            init_device = 'cpu'
    # The plan's lists hold one item per part of the split (an entry, or
    # the first ranks of an entry that get one sequence more): one per
    # rank when train.py plans its ranks.
    f, parts, taken = flags(best['strategy']), best['parts'], Counter()
    shown = []
    for i, k in parts:
        where = cluster.span(ranks[i], taken[i], k)
        shown.append(dict(ranks[i], count=k, span=where))
        taken[i] += k
    dtypes = best['dtypes']
    dtype = 'mixed'
    if len(set(dtypes)) == 1:
        dtype = dtypes[0]
    return Plan(strategy=best['strategy'],
                **{**f, 'ac': _each(best['ac'], parts)},
                init_device=init_device,
                reduce_every_micro_batch=f['shard']
                and not best['accumulate'],
                caps=_each(best['caps'], parts), share=best['share'],
                sizes=[_expand(r) for r in best['runs']],
                predicted=best['predicted'], step_time=best['step'],
                tokens_per_sec=best['tokens_per_sec'], mfu=best['mfu'],
                fits=bool(feasible), advice=advice, needs=needs,
                ranks=shown, batch_size=batch_size,
                block_size=cfg.block_size, n_params=total,
                weights=weights, dtype=dtype,
                dtypes=_each(dtypes, parts),
                dtype_steps=best['dtype_steps'],
                candidates=[(r['strategy'], 'step' in r, r.get('step'))
                            for r in results],
                config=cfg)


def resplit(p, caps, c0=None, c1=None):
    """The plan p's split again, after the probe step: this is the split
    the first step runs.

    For the micro-batch caps it left and, by speed, for each rank's
    measured c0, c1 (balance.py).
    """
    if p.weights or c0 is None:
        # by weights, or no speeds to go by: the planned shares
        share = p.share
        if p.weights:
            share = weighted(p.batch_size, caps, p.weights, p.shard)[0]
        count = None
        if p.shard:
            count = lockstep_count(share, caps)
        sizes = pieces(share, caps, count)
    else:
        count = max(len(p.sizes[0]), math.ceil(p.batch_size / sum(caps)))
        if not p.shard:
            count = None
        share, sizes = split(p.batch_size, caps, c0, c1, count=count)
    return replace(p, caps=caps, share=share, sizes=sizes)
