"""
How a global batch is split over unlike ranks, and re-split as they are
measured.

Rank r runs a micro-batch of n sequences in c0_r + c1_r·n seconds (c0: per
micro-batch, c1: per sequence), and holds at most caps_r sequences in one.
Under DDP each rank runs its own number of micro-batches and the step
waits for the slowest rank. FSDP2 all-gathers the weights in every
forward, so there all ranks run the same number of micro-batches
(lockstep) and each micro-batch waits for its slowest rank. The planner
splits with predicted speeds (timing.py); train.py re-splits with measured
ones, through the same functions.
"""
import bisect
import heapq
import itertools
import math
import struct

import numpy as np

# Batches of up to EXACT sequences are split by the searches that place one
# sequence at a time (their results are the ones tests/test_split.py and
# tests/test_plan.py pin); their time grows with the batch, about as its
# square in lockstep (4096 sequences over 4 unlike GPUs: 5 s). A larger
# batch (up to knobs.MAX_BATCH) is split in closed form, in time that does
# not grow with it: the same greedy split computed at once (split_batch),
# and under lockstep every micro-batch split alike (_split_lockstep).
EXACT = 2048


def split_batch(batch, c0, c1, caps, count=None, counts=None):
    """Whole sequences n_i, sum n_i = batch, 0 <= n_i <= caps_i, minimising
    max_i c0_i + c1_i·n_i.

    Greedy: each next sequence goes to the rank that would finish it
    earliest. It is optimal: rank i's finishing times c0_i + c1_i·k
    (k = 1, 2, ...) increase with k, a split takes a prefix of each rank's
    list, so its maximum is at least the batch-th smallest of all these
    values; the greedy takes exactly the batch smallest. count=K > 1:
    FSDP's lockstep, below.

    counts: how many identical ranks each entry stands for
    (hetgpt/planner/cluster.py); the result is then each entry's ranks as
    [(share, how many)] in rank order (identical ranks may get different
    shares: ties go to the lower rank), computed in time that does not
    grow with the counts. Without counts: one share per rank.
    """
    m = [1] * len(caps)
    if counts is not None:
        m = list(counts)
    if not len(c0) == len(c1) == len(caps) == len(m):
        raise ValueError(f"split_batch: c0, c1, caps and counts differ in "
                         f"length ({len(c0)}, {len(c1)}, {len(caps)}, "
                         f"{len(m)})")
    if min(c1, default=0) < 0 or batch < 0:
        raise ValueError("split_batch: the batch and each rank's c1 must "
                         "be >= 0")
    held = sum(c * k for c, k in zip(caps, m))
    if count and count > 1:
        parts = _split_lockstep(batch, c0, c1, caps, count, m)
    elif held < batch:
        raise ValueError(f"cannot split {batch} sequences over {sum(m)} "
                         f"ranks: their caps {_caps(caps, m)} hold only "
                         f"{held}; lower batch_size, or allow more "
                         f"micro-batches or sequences per rank")
    elif batch > EXACT and all(map(math.isfinite, [*c0, *c1])):
        parts = _split_at_once(batch, c0, c1, caps, m)
    else:
        parts = _greedy(batch, c0, c1, caps, m)
    if counts is not None:
        return parts
    return [p[0][0] for p in parts]


def _caps(caps, m):
    """The caps, as an error names them (m: the entries' counts)."""
    if set(m) <= {1}:
        return list(caps)
    return ', '.join(f"{k} × {c}" for c, k in zip(caps, m))


def _runs(pairs):
    """[(share, how many)] without empty runs, equal neighbours joined."""
    out = []
    for x, k in pairs:
        if k and out and out[-1][0] == x:
            out[-1] = (x, out[-1][1] + k)
        elif k:
            out.append((x, k))
    return out


def _greedy(batch, c0, c1, caps, m):
    """split_batch's greedy with a heap, a level at a time.

    An entry's ranks take their k-th sequence together (the same time; a
    tie goes to the lower rank, the entry's first ranks first). Where a
    rank's next times are equal (c1 = 0, or floats too close to differ)
    the per-rank heap gives them all to one rank before the next: so do
    its first ranks here.
    """
    n, last = [0] * len(caps), None
    heap = [(c0[i] + c1[i], i) for i in range(len(caps)) if caps[i] > 0]
    heapq.heapify(heap)
    rest = batch
    while rest:
        t, i = heapq.heappop(heap)
        flat = 1  # the levels at time t
        if c1[i] == 0:
            flat = caps[i] - n[i]
        while flat < caps[i] - n[i] and \
                c0[i] + c1[i] * (n[i] + flat + 1) == t:
            flat += 1
        if rest < m[i] * flat:
            # the last sequences: the entry's first ranks take them
            full, r = divmod(rest, flat)
            last = (i, _runs([(n[i] + flat, full), (n[i] + r, int(r > 0)),
                              (n[i], m[i] - full - int(r > 0))]))
            break
        n[i], rest = n[i] + flat, rest - m[i] * flat
        if n[i] < caps[i]:
            heapq.heappush(heap, (c0[i] + c1[i] * (n[i] + 1), i))
    parts = [[(x, k)] for x, k in zip(n, m)]
    if last:
        parts[last[0]] = last[1]
    return parts


def _key(x):
    """A double as an int, in the same order (bisection over the doubles
    themselves)."""
    i = struct.unpack('<q', struct.pack('<d', x))[0]
    if i >= 0:
        return i
    return -(i & 0x7FFFFFFFFFFFFFFF)


def _double(i):
    """The double of a _key."""
    bits = i
    if i < 0:
        bits = -i | -2**63
    return struct.unpack('<d', struct.pack('<q', bits))[0]


def _within(k, T, c0, c1, cap):
    """Per rank: whether its k-th finishing time is <= T (k <= 0: always;
    k above its cap: never)."""
    return (k <= 0) | ((k <= cap) & (c0 + c1 * k <= T))


def _upto(T, c0, c1, cap):
    """Per rank: how many of its finishing times are <= T.

    A first guess, then exact steps (galloping, bisection).
    """
    with np.errstate(all='ignore'):
        k = np.where(c1 > 0, np.floor((T - c0) / c1),
                     np.where(c0 <= T, cap, 0.0))
    k = np.nan_to_num(k, nan=0.0, posinf=cap.max(), neginf=0.0)
    lo = np.clip(k, 0.0, cap)
    hi, step = lo + 1, 1.0
    while (bad := ~_within(lo, T, c0, c1, cap)).any():
        hi, lo = (np.where(bad, lo, hi),
                  np.where(bad, np.maximum(lo - step, 0), lo))
        step *= 2
    step = 1.0
    while (more := _within(hi, T, c0, c1, cap)).any():
        lo, hi = (np.where(more, hi, lo),
                  np.where(more, np.minimum(hi + step, cap + 1), hi))
        step *= 2
    while (wide := hi - lo > 1).any():
        mid = np.floor((lo + hi) / 2)
        g = _within(mid, T, c0, c1, cap)
        lo, hi = np.where(wide & g, mid, lo), np.where(wide & ~g, mid, hi)
    return lo


def _split_at_once(batch, c0, c1, caps, m):
    """split_batch's greedy without its steps.

    It takes the batch smallest of the finishing times c0_i + c1_i·k
    (k = 1..caps_i, non-decreasing in k), ties to the lower rank first
    (the heap's order). So find the batch-th smallest, V, by bisection
    over the doubles; each rank takes its times below V, and the times
    equal to V go to the ranks in order. (Exactly the greedy's split: the
    same float expressions, compared, never approximated.) An entry of
    m_i ranks counts m_i times.
    """
    c0, c1 = np.asarray(c0, dtype=float), np.asarray(c1, dtype=float)
    cap = np.maximum(np.asarray(caps, dtype=float), 0.0)
    many = np.asarray(m, dtype=float)
    some = cap > 0
    lo = _key(float((c0 + c1 * 1.0)[some].min())) - 1
    hi = _key(float((c0 + c1 * cap)[some].max()))
    # _upto(lo) sums below the batch, _upto(hi) to at least it
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if (_upto(_double(mid), c0, c1, cap) * many).sum() >= batch:
            hi = mid
        else:
            lo = mid
    below = _upto(_double(hi - 1), c0, c1, cap)
    at = _upto(_double(hi), c0, c1, cap) - below
    rest = batch - int((below * many).sum())
    parts = []
    for b, a, k in zip(below.astype(int).tolist(),
                       at.astype(int).tolist(), m):
        # the entry's first ranks take a each, then one the rest
        take = min(rest, a * k)
        full, r = 0, 0
        if a:
            full, r = divmod(take, a)
        parts.append(_runs([(b + a, full), (b + r, int(r > 0)),
                            (b, k - full - int(r > 0))]))
        rest -= take
    return parts


def _ends(runs):
    """Where each of runs [(share, how many)] ends, counted in ranks."""
    return list(itertools.accumulate(k for _, k in runs))


def _first_above(a, b):
    """(entry, position) of the first rank whose share in b is above its
    share in a (each a list of entries' [(share, how many)])."""
    for i, (x, y) in enumerate(zip(a, b)):
        ex, ey = _ends(x), _ends(y)
        for p in sorted({0, *ex[:-1], *ey[:-1]}):
            if y[bisect.bisect_right(ey, p)][0] > \
                    x[bisect.bisect_right(ex, p)][0]:
                return i, p


def _add(runs, p, extra):
    """runs with the rank at position p given `extra` more."""
    out, at = [], 0
    for x, k in runs:
        if at <= p < at + k:
            out += [(x, p - at), (x + extra, 1), (x, at + k - p - 1)]
        else:
            out.append((x, k))
        at += k
    return _runs(out)


def _times(n, caps, c0, c1, count):
    """Each micro-batch's time, its slowest rank's, of the runs n
    ([entry, share, how many] in rank order) in `count` micro-batches."""
    out = [-math.inf] * count
    for i, x, _ in n:
        for j, piece in enumerate(micro_batches(x, caps[i], count)):
            out[j] = max(out[j], c0[i] + c1[i] * piece)
    return out


def _lengthens(slot, i, x, c0, c1, count):
    """How much a sequence more for a rank of entry i with x sequences
    lengthens its micro-batch (slot: each micro-batch's time)."""
    return max(slot[x % count], c0[i] + c1[i] * (x // count + 1)) \
        - slot[x % count]


def _fill(n, batch, caps, c0, c1, count):
    """The runs n ([entry, share, how many]) given the rest of the batch
    one sequence at a time, each where it lengthens the step least."""
    n, slot = [list(x) for x in n], _times(n, caps, c0, c1, count)
    for _ in range(batch - sum(x * k for _, x, k in n)):
        room = [j for j, (i, x, _) in enumerate(n) if x < count * caps[i]]
        j = min(room, key=lambda j: (
            _lengthens(slot, *n[j][:2], c0, c1, count), c1[n[j][0]], j))
        i, x, k = n[j]
        slot[x % count] += _lengthens(slot, i, x, c0, c1, count)
        rest = []  # (the run's first rank takes it)
        if k > 1:
            rest = [[i, x, k - 1]]
        n[j:j + 1] = [[i, x + 1, 1]] + rest
        # (joined to a neighbour of the same entry and share)
        for at in (j, j - 1):
            if 0 <= at < len(n) - 1 and n[at][:2] == n[at + 1][:2]:
                n[at][2] += n.pop(at + 1)[2]
    return n


def _one_each(who, shares):
    """Ranks' shares as runs [entry, share, 1] (who: each rank's
    entry)."""
    return [[who[r], x, 1] for r, x in enumerate(shares)]


def _split_lockstep(batch, c0, c1, caps, count, m):
    """FSDP's split: every rank runs `count` micro-batches, and each
    micro-batch waits for the slowest rank.

    caps and c0 are per micro-batch; rank i's pieces are
    micro_batches(n_i, caps_i, count), so one more sequence for rank i
    adds one to its micro-batch number n_i mod count. Two greedy fills,
    the better kept, then single moves between ranks while they help (up
    to 16 ranks). Not provably optimal: tests/test_split.py compares it
    with brute force. Entries of m_i identical ranks: their ranks as runs
    [(share, how many)], in rank order.
    """
    held = sum(c * k for c, k in zip(caps, m))
    if count * held < batch:
        raise ValueError(f"cannot split {batch} sequences over {sum(m)} "
                         f"ranks in {count} micro-batches: their caps "
                         f"{_caps(caps, m)} per micro-batch hold only "
                         f"{count * held}")
    E, R = len(caps), sum(m)
    if batch > EXACT:
        # Every micro-batch split alike: the fastest split of
        # batch // count sequences in one micro-batch, and the
        # batch % count left over (< count) each one more sequence in a
        # micro-batch of the rank the greedy gives the next sequence to
        # (its cap allows it).
        per = split_batch(batch // count, c0, c1, caps, counts=m)
        n = [[(count * x, k) for x, k in p] for p in per]
        if batch % count:
            more = split_batch(batch // count + 1, c0, c1, caps, counts=m)
            i, p = _first_above(per, more)
            n[i] = _add(n[i], p, batch % count)
        return n

    # Below, the runs of all entries in rank order: [entry, share, how
    # many] (one per rank when every entry is one rank, as the planner's
    # reference). (a) from nothing; (b) floor(batch/count) split as one
    # micro-batch, count times over.
    start = split_batch(batch // count, c0, c1, caps, counts=m)
    empty = [[i, 0, m[i]] for i in range(E)]
    even = [[i, count * x, k] for i in range(E) for x, k in start[i]]
    n = min(_fill(empty, batch, caps, c0, c1, count),
            _fill(even, batch, caps, c0, c1, count),
            key=lambda n: sum(_times(n, caps, c0, c1, count)))
    if R <= 16:  # single moves, rank by rank
        who = [i for i, _, k in n for _ in range(k)]
        flat = [x for _, x, k in n for _ in range(k)]
        improved = True
        while improved:
            improved = False
            for a in range(R):
                for b in range(R):
                    if a == b:
                        continue
                    moved = list(flat)
                    moved[a], moved[b] = moved[a] - 1, moved[b] + 1
                    if moved[a] < 0 or moved[b] > count * caps[who[b]]:
                        continue
                    now = _times(_one_each(who, flat), caps, c0, c1, count)
                    then = _times(_one_each(who, moved), caps, c0, c1,
                                  count)
                    if sum(then) < sum(now) - 1e-12:
                        flat, improved = moved, True
        n = _one_each(who, flat)
    return [_runs([(x, k) for j, x, k in n if j == i]) for i in range(E)]


def micro_batches(n, cap, count=None):
    """A rank's n sequences as near-equal micro-batches of at most cap:
    ceil(n/cap) of them, or exactly count (FSDP: every rank runs the same
    count; pieces may be empty)."""
    if count is None:
        count = 0
        if n:
            count = math.ceil(n / cap)
    if n > count * cap:
        raise ValueError(f"{n} sequences do not fit in {count} "
                         f"micro-batches of at most {cap}")
    q, r = 0, 0
    if count:
        q, r = divmod(n, count)
    return [q + 1] * r + [q] * (count - r)


def pieces(shares, caps, count=None):
    """Each rank's micro-batch sizes.

    DDP: a share in ceil(n/cap) near-equal micro-batches (an empty share
    runs one empty micro-batch: the rank still joins the gradient
    reduction). Lockstep: `count` micro-batches on every rank (by default
    the fewest that hold every share).
    """
    if count is None:
        return [micro_batches(n, c) or [0] for n, c in zip(shares, caps)]
    return [micro_batches(n, c, count) for n, c in zip(shares, caps)]


def lockstep_count(shares, caps):
    """The fewest micro-batches, one at least, that hold every rank's
    share in lockstep."""
    return max(max(math.ceil(n / c), 1) for n, c in zip(shares, caps))


def split(batch, caps, c0, c1, fixed=None, count=None):
    """The fastest split: (shares, each rank's micro-batch sizes).

    DDP (count None): a share runs in micro-batches of at most the rank's
    cap, so a sequence costs c1 + c0/cap, and `fixed` seconds per rank
    come on top (the optimizer step). Lockstep: `count` micro-batches on
    every rank.
    """
    shares = split_shares(batch, caps, c0, c1, fixed, count)
    return shares, pieces(shares, caps, count)


def split_shares(batch, caps, c0, c1, fixed=None, count=None, counts=None):
    """split's shares alone.

    The planner times a split from them and runs(), not lists; for
    entries of identical ranks, counts: split_batch.
    """
    if count is None:
        per_sequence = [b + a / m for a, b, m in zip(c0, c1, caps)]
        return split_batch(batch, fixed or [0.0] * len(caps),
                           per_sequence, [batch] * len(caps),
                           counts=counts)
    return split_batch(batch, c0, c1, caps, count, counts)


def weighted(batch, caps, weights, lockstep):
    """balance=even or balance=w1,w2,...: (shares proportional to the
    weights, in whole sequences; each rank's micro-batch sizes)."""
    shares = weighted_shares(batch, weights)
    count = None
    if lockstep:
        count = lockstep_count(shares, caps)
    return shares, pieces(shares, caps, count)


def weighted_shares(batch, weights, counts=None):
    """weighted's shares alone (counts: as split_batch's)."""
    return split_batch(batch, [0.0] * len(weights),
                       [1 / w for w in weights], [batch] * len(weights),
                       counts=counts)


def runs(n, cap, count=None):
    """One rank's pieces() without the list: [(size, how many)], at most
    two runs, larger first."""
    if count is None:
        count = 0
        if n:
            count = math.ceil(n / cap)
        if not count:
            return [(0, 1)]  # (an empty share runs one empty micro-batch)
    q, r = divmod(n, count)
    if r:
        return [(q + 1, r), (q, count - r)]
    return [(q, count)]


def _runs_of(ms):
    """A list of micro-batch sizes as [(size, how many)]."""
    return [(n, len(list(g))) for n, g in itertools.groupby(ms)]


def lockstep_segments(runs_per_rank, c0, c1):
    """Lockstep's micro-batches as [(how many, seconds)] in order.

    Each is as long as its slowest rank's piece (an empty piece costs one
    sequence). The time changes only where some rank's run starts: a sweep
    over those places, O(runs · log ranks) whatever the count.
    """
    # micro-batch -> [(rank, seconds)] of the runs starting there
    starts, end = {}, 0
    for i, (rs, a, b) in enumerate(zip(runs_per_rank, c0, c1)):
        at = 0
        for n, k in rs:
            if k:
                t = a + b * max(n, 1)
                starts.setdefault(at, []).append((i, t))
                at += k
        end = max(end, at)
    now, heap, out = {}, [], []
    cuts = sorted(starts) + [end]
    for s, e in zip(cuts, cuts[1:]):
        for i, t in starts[s]:
            now[i] = t
            heapq.heappush(heap, (-t, i))
        while -heap[0][0] != now[heap[0][1]]:  # a rank's earlier run
            heapq.heappop(heap)
        out.append((e - s, -heap[0][0]))
    return out


def step_time(sizes, c0, c1, lockstep):
    """Compute seconds of a step.

    DDP ranks run their micro-batches on their own; in lockstep each
    micro-batch waits for its slowest rank. (An empty micro-batch costs as
    much as one sequence.)
    """
    if sum(map(len, sizes)) > EXACT:
        # by runs of equal sizes (pieces makes at most 2 per rank)
        rs = [_runs_of(ms) for ms in sizes]
        if lockstep:
            return sum(k * t for k, t in lockstep_segments(rs, c0, c1))
        return max(sum(k * (a + b * max(n, 1)) for n, k in r)
                   for a, b, r in zip(c0, c1, rs))
    t = [[a + b * max(n, 1) for n in ms] for a, b, ms in zip(c0, c1, sizes)]
    if lockstep:
        return sum(map(max, zip(*t)))
    return max(map(sum, t))


def fit(sizes, times):
    """(c0, c1) of a rank from its times at two micro-batch sizes.

    One size (or a time that did not grow): all of it per sequence.
    """
    (b1, b2), (t1, t2) = sizes, times
    if b2 > b1 and t2 > t1:
        c1 = (t2 - t1) / (b2 - b1)
    else:
        c1 = t2 / b2
    return max(0.0, t2 - c1 * b2), c1


def refit(sizes, c0, c1, times):
    """Each rank's c1 from its measured compute seconds of a step (its c0
    kept).

    What the rank did minus its micro-batches' fixed cost, per sequence.
    A rank without sequences keeps its c1.
    """
    out = []
    for t, a, b, ms in zip(times, c0, c1, sizes):
        if sum(ms):
            b = max(t - a * len(ms), 0.05 * t) / sum(ms)
        out.append(b)
    return out


def rebalance(sizes, caps, c0, c1, times, lockstep, gain=0.03):
    """A re-split by measured speed: (sizes, c1).

    Each rank's c1 refitted to its measured compute seconds of a step
    (times: not the waits in collectives), then the fastest split of the
    same batch (under lockstep in as many micro-batches), if it is
    predicted more than `gain` faster: noise in the speeds must not make
    the split wander.
    """
    c1 = refit(sizes, c0, c1, times)
    batch, count = sum(map(sum, sizes)), None
    if lockstep:
        count = len(sizes[0])
    _, new = split(batch, caps, c0, c1, count=count)
    before = step_time(sizes, c0, c1, lockstep)
    if step_time(new, c0, c1, lockstep) < (1 - gain) * before:
        return new, c1
    return sizes, c1
