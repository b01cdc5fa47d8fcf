"""
How a global batch is split over unlike ranks, and re-split as they are measured.

Rank r runs a micro-batch of n sequences in c0_r + c1_r·n seconds (c0: per micro-batch, c1: per
sequence), and holds at most caps_r sequences in one. Under DDP each rank runs its own number of
micro-batches and the step waits for the slowest rank. FSDP2 all-gathers the weights in every
forward, so there all ranks run the same number of micro-batches (lockstep) and each micro-batch
waits for its slowest rank. The planner splits with predicted speeds (clock.py); train.py re-splits
with measured ones, through the same functions.
"""
import bisect
import heapq
import itertools
import math
import struct

import numpy as np

# Batches of up to EXACT sequences are split by the searches that place one sequence at a time
# (their results are the ones tests/test_split.py and tests/test_plan.py pin); their time grows with
# the batch, about as its square in lockstep (4096 sequences over 4 unlike GPUs: 5 s). A larger
# batch (up to plan.MAX_BATCH) is split in closed form, in time that does not grow with it: the
# same greedy split computed at once (split_batch), and under lockstep every micro-batch split alike
# (_split_lockstep).
EXACT = 2048


def split_batch(batch, c0, c1, caps, count=None, counts=None):
    # Whole sequences n_i, sum n_i = batch, 0 <= n_i <= caps_i, minimising max_i c0_i + c1_i·n_i.
    # Greedy: each next sequence goes to the rank that would finish it earliest. It is optimal:
    # rank i's finishing times c0_i + c1_i·k (k = 1, 2, ...) increase with k, a split takes a
    # prefix of each rank's list, so its maximum is at least the batch-th smallest of all these
    # values; the greedy takes exactly the batch smallest. count=K > 1: FSDP's lockstep, below.
    # counts: how many identical ranks each entry stands for (hetgpt/planner/cluster.py); the result is
    # then each entry's ranks as [(share, how many)] in rank order (identical ranks may get
    # different shares: ties go to the lower rank), computed in time that does not grow with the
    # counts. Without counts: one share per rank.
    m = [1] * len(caps) if counts is None else list(counts)
    if not len(c0) == len(c1) == len(caps) == len(m):
        raise ValueError(f"split_batch: c0, c1, caps and counts differ in length "
                         f"({len(c0)}, {len(c1)}, {len(caps)}, {len(m)})")
    if min(c1, default=0) < 0 or batch < 0:
        raise ValueError("split_batch: the batch and each rank's c1 must be >= 0")
    held = sum(c * k for c, k in zip(caps, m))
    if count and count > 1:
        parts = _split_lockstep(batch, c0, c1, caps, count, m)
    elif held < batch:
        raise ValueError(f"cannot split {batch} sequences over {sum(m)} ranks: their caps "
                         f"{_caps(caps, m)} hold only {held}; lower batch_size, or allow more "
                         f"micro-batches or sequences per rank")
    elif batch > EXACT and all(map(math.isfinite, [*c0, *c1])):
        parts = _split_at_once(batch, c0, c1, caps, m)
    else:
        parts = _greedy(batch, c0, c1, caps, m)
    return parts if counts is not None else [p[0][0] for p in parts]


def _caps(caps, m):  # the caps, as an error names them
    return list(caps) if set(m) <= {1} else ', '.join(f"{k} × {c}" for c, k in zip(caps, m))


def _runs(pairs):  # [(share, how many)] without empty runs, equal neighbours joined
    out = []
    for x, k in pairs:
        if k and out and out[-1][0] == x:
            out[-1] = (x, out[-1][1] + k)
        elif k:
            out.append((x, k))
    return out


def _greedy(batch, c0, c1, caps, m):
    # The greedy with a heap, a level at a time: an entry's ranks take their k-th sequence
    # together (the same time; a tie goes to the lower rank, the entry's first ranks first).
    # Where a rank's next times are equal (c1 = 0, or floats too close to differ) the per-rank
    # heap gives them all to one rank before the next: so do its first ranks here.
    n, last = [0] * len(caps), None
    heap = [(c0[i] + c1[i], i) for i in range(len(caps)) if caps[i] > 0]
    heapq.heapify(heap)
    rest = batch
    while rest:
        t, i = heapq.heappop(heap)
        flat = caps[i] - n[i] if c1[i] == 0 else 1  # the levels at time t
        while flat < caps[i] - n[i] and c0[i] + c1[i] * (n[i] + flat + 1) == t:
            flat += 1
        if rest < m[i] * flat:  # the last sequences: the entry's first ranks take them
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


def _key(x):  # a double as an int, in the same order (bisection over the doubles themselves)
    i = struct.unpack('<q', struct.pack('<d', x))[0]
    return i if i >= 0 else -(i & 0x7FFFFFFFFFFFFFFF)


def _double(i):
    return struct.unpack('<d', struct.pack('<q', i if i >= 0 else -i | -2**63))[0]


def _split_at_once(batch, c0, c1, caps, m):
    # split_batch's greedy without its steps: it takes the batch smallest of the finishing times
    # c0_i + c1_i·k (k = 1..caps_i, non-decreasing in k), ties to the lower rank first (the heap's
    # order). So find the batch-th smallest, V, by bisection over the doubles; each rank takes its
    # times below V, and the times equal to V go to the ranks in order. (Exactly the greedy's
    # split: the same float expressions, compared, never approximated.) An entry of m_i ranks
    # counts m_i times.
    c0, c1 = np.asarray(c0, dtype=float), np.asarray(c1, dtype=float)
    cap = np.maximum(np.asarray(caps, dtype=float), 0.0)
    many = np.asarray(m, dtype=float)
    time = lambda k: c0 + c1 * k

    def upto(T):  # per rank: how many of its times are <= T
        good = lambda k: (k <= 0) | ((k <= cap) & (time(k) <= T))
        with np.errstate(all='ignore'):  # a first guess, then exact steps (galloping, bisection)
            k = np.where(c1 > 0, np.floor((T - c0) / c1), np.where(c0 <= T, cap, 0.0))
        lo = np.clip(np.nan_to_num(k, nan=0.0, posinf=cap.max(), neginf=0.0), 0.0, cap)
        hi, step = lo + 1, 1.0
        while (bad := ~good(lo)).any():
            hi, lo = np.where(bad, lo, hi), np.where(bad, np.maximum(lo - step, 0), lo)
            step *= 2
        step = 1.0
        while (more := good(hi)).any():
            lo, hi = np.where(more, hi, lo), np.where(more, np.minimum(hi + step, cap + 1), hi)
            step *= 2
        while (wide := hi - lo > 1).any():
            mid = np.floor((lo + hi) / 2)
            g = good(mid)
            lo, hi = np.where(wide & g, mid, lo), np.where(wide & ~g, mid, hi)
        return lo

    some = cap > 0
    lo, hi = _key(float(time(1.0)[some].min())) - 1, _key(float(time(cap)[some].max()))
    while hi - lo > 1:  # upto(lo) sums below the batch, upto(hi) to at least it
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if (upto(_double(mid)) * many).sum() >= batch else (mid, hi)
    below = upto(_double(hi - 1))
    at, rest = upto(_double(hi)) - below, batch - int((below * many).sum())
    parts = []
    for b, a, k in zip(below.astype(int).tolist(), at.astype(int).tolist(), m):
        take = min(rest, a * k)  # the entry's first ranks take a each, then one the rest
        full, r = divmod(take, a) if a else (0, 0)
        parts.append(_runs([(b + a, full), (b + r, int(r > 0)), (b, k - full - int(r > 0))]))
        rest -= take
    return parts


def _first_above(a, b):
    # (entry, position) of the first rank whose share in b is above its share in a (each a list
    # of entries' [(share, how many)])
    for i, (x, y) in enumerate(zip(a, b)):
        ends = lambda runs: list(itertools.accumulate(k for _, k in runs))
        ex, ey = ends(x), ends(y)
        for p in sorted({0, *ex[:-1], *ey[:-1]}):
            if y[bisect.bisect_right(ey, p)][0] > x[bisect.bisect_right(ex, p)][0]:
                return i, p


def _add(runs, p, extra):  # runs with the rank at position p given `extra` more
    out, at = [], 0
    for x, k in runs:
        if at <= p < at + k:
            out += [(x, p - at), (x + extra, 1), (x, at + k - p - 1)]
        else:
            out.append((x, k))
        at += k
    return _runs(out)


def _split_lockstep(batch, c0, c1, caps, count, m):
    # FSDP: every rank runs `count` micro-batches, and each micro-batch waits for the slowest rank.
    # caps and c0 are per micro-batch; rank i's pieces are micro_batches(n_i, caps_i, count), so
    # one more sequence for rank i adds one to its micro-batch number n_i mod count. Two greedy
    # fills, the better kept, then single moves between ranks while they help (up to 16 ranks).
    # Not provably optimal: tests/test_split.py compares it with brute force. Entries of m_i
    # identical ranks: their ranks as runs [(share, how many)], in rank order.
    held = sum(c * k for c, k in zip(caps, m))
    if count * held < batch:
        raise ValueError(f"cannot split {batch} sequences over {sum(m)} ranks in {count} "
                         f"micro-batches: their caps {_caps(caps, m)} per micro-batch hold only "
                         f"{count * held}")
    E, R = len(caps), sum(m)
    if batch > EXACT:
        # Every micro-batch split alike: the fastest split of batch // count sequences in one
        # micro-batch, and the batch % count left over (< count) each one more sequence in a
        # micro-batch of the rank the greedy gives the next sequence to (its cap allows it).
        per = split_batch(batch // count, c0, c1, caps, counts=m)
        n = [[(count * x, k) for x, k in p] for p in per]
        if batch % count:
            i, p = _first_above(per, split_batch(batch // count + 1, c0, c1, caps, counts=m))
            n[i] = _add(n[i], p, batch % count)
        return n

    # Below, the runs of all entries in rank order: [entry, share, how many] (one per rank
    # when every entry is one rank, as the planner's reference)
    def times(n):  # each micro-batch's time: its slowest rank
        out = [-math.inf] * count
        for i, x, _ in n:
            for j, piece in enumerate(micro_batches(x, caps[i], count)):
                out[j] = max(out[j], c0[i] + c1[i] * piece)
        return out

    def fill(n):  # the remaining sequences one by one, each where it lengthens the step least
        n, slot = [list(x) for x in n], times(n)
        grow = lambda i, x: max(slot[x % count], c0[i] + c1[i] * (x // count + 1)) \
            - slot[x % count]
        for _ in range(batch - sum(x * k for _, x, k in n)):
            j = min((j for j, (i, x, _) in enumerate(n) if x < count * caps[i]),
                    key=lambda j: (grow(*n[j][:2]), c1[n[j][0]], j))
            i, x, k = n[j]
            slot[x % count] += grow(i, x)
            n[j:j + 1] = [[i, x + 1, 1]] + ([[i, x, k - 1]] if k > 1 else [])  # its first rank
            for at in (j, j - 1):  # (joined to a neighbour of the same entry and share)
                if 0 <= at < len(n) - 1 and n[at][:2] == n[at + 1][:2]:
                    n[at][2] += n.pop(at + 1)[2]
        return n

    # (a) from nothing; (b) floor(batch/count) split as one micro-batch, count times over
    start = split_batch(batch // count, c0, c1, caps, counts=m)
    n = min(fill([[i, 0, m[i]] for i in range(E)]),
            fill([[i, count * x, k] for i in range(E) for x, k in start[i]]),
            key=lambda n: sum(times(n)))
    if R <= 16:  # single moves, rank by rank
        who = [i for i, _, k in n for _ in range(k)]
        flat = [x for _, x, k in n for _ in range(k)]
        rank = lambda n: [[who[r], x, 1] for r, x in enumerate(n)]
        improved = True
        while improved:
            improved = False
            for a, b in ((a, b) for a in range(R) for b in range(R) if a != b):
                moved = list(flat)
                moved[a], moved[b] = moved[a] - 1, moved[b] + 1
                if moved[a] >= 0 and moved[b] <= count * caps[who[b]] and \
                        sum(times(rank(moved))) < sum(times(rank(flat))) - 1e-12:
                    flat, improved = moved, True
        n = rank(flat)
    return [_runs([(x, k) for j, x, k in n if j == i]) for i in range(E)]


def micro_batches(n, cap, count=None):
    # A rank's n sequences as near-equal micro-batches of at most cap: ceil(n/cap) of them, or
    # exactly count (FSDP: every rank runs the same count; pieces may be empty).
    if count is None:
        count = math.ceil(n / cap) if n else 0
    if n > count * cap:
        raise ValueError(f"{n} sequences do not fit in {count} micro-batches of at most {cap}")
    q, r = divmod(n, count) if count else (0, 0)
    return [q + 1] * r + [q] * (count - r)


def pieces(shares, caps, count=None):
    # Each rank's micro-batch sizes. DDP: a share in ceil(n/cap) near-equal micro-batches (an empty
    # share runs one empty micro-batch: the rank still joins the gradient reduction). Lockstep:
    # `count` micro-batches on every rank (by default the fewest that hold every share).
    if count is None:
        return [micro_batches(n, c) or [0] for n, c in zip(shares, caps)]
    return [micro_batches(n, c, count) for n, c in zip(shares, caps)]


def lockstep_count(shares, caps):
    return max(max(math.ceil(n / c), 1) for n, c in zip(shares, caps))


def split(batch, caps, c0, c1, fixed=None, count=None):
    # The fastest split: (shares, each rank's micro-batch sizes). DDP (count None): a share runs in
    # micro-batches of at most the rank's cap, so a sequence costs c1 + c0/cap, and `fixed` seconds
    # per rank come on top (the optimizer step). Lockstep: `count` micro-batches on every rank.
    shares = split_shares(batch, caps, c0, c1, fixed, count)
    return shares, pieces(shares, caps, count)


def split_shares(batch, caps, c0, c1, fixed=None, count=None, counts=None):
    # split's shares alone (the planner times a split from them and runs(), not lists; for
    # entries of identical ranks, counts: split_batch)
    if count is None:
        per_sequence = [b + a / m for a, b, m in zip(c0, c1, caps)]
        return split_batch(batch, fixed or [0.0] * len(caps), per_sequence, [batch] * len(caps),
                           counts=counts)
    return split_batch(batch, c0, c1, caps, count, counts)


def weighted(batch, caps, weights, lockstep):
    # balance=even or balance=w1,w2,...: shares proportional to the weights, in whole sequences
    shares = weighted_shares(batch, weights)
    return shares, pieces(shares, caps, lockstep_count(shares, caps) if lockstep else None)


def weighted_shares(batch, weights, counts=None):
    return split_batch(batch, [0.0] * len(weights), [1 / w for w in weights],
                       [batch] * len(weights), counts=counts)


def runs(n, cap, count=None):
    # One rank's pieces() without the list: [(size, how many)], at most two runs, larger first
    if count is None:
        count = math.ceil(n / cap) if n else 0
        if not count:
            return [(0, 1)]  # (an empty share runs one empty micro-batch)
    q, r = divmod(n, count)
    return [(q + 1, r), (q, count - r)] if r else [(q, count)]


def _runs_of(ms):  # a list of micro-batch sizes as [(size, how many)]
    return [(n, len(list(g))) for n, g in itertools.groupby(ms)]


def lockstep_segments(runs_per_rank, c0, c1):
    # Lockstep's micro-batches as [(how many, seconds)] in order, each as long as its slowest rank's
    # piece (an empty piece costs one sequence). The time changes only where some rank's run
    # starts: a sweep over those places, O(runs · log ranks) whatever the count.
    starts, end = {}, 0  # micro-batch -> [(rank, seconds)] of the runs starting there
    for i, (rs, a, b) in enumerate(zip(runs_per_rank, c0, c1)):
        at = 0
        for n, k in rs:
            if k:
                starts.setdefault(at, []).append((i, a + b * max(n, 1)))
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
    # Compute seconds of a step: DDP ranks run their micro-batches on their own; in lockstep each
    # micro-batch waits for its slowest rank. (An empty micro-batch costs as much as one sequence.)
    if sum(map(len, sizes)) > EXACT:  # by runs of equal sizes (pieces makes at most 2 per rank)
        rs = [_runs_of(ms) for ms in sizes]
        if lockstep:
            return sum(k * t for k, t in lockstep_segments(rs, c0, c1))
        return max(sum(k * (a + b * max(n, 1)) for n, k in r) for a, b, r in zip(c0, c1, rs))
    t = [[a + b * max(n, 1) for n in ms] for a, b, ms in zip(c0, c1, sizes)]
    return sum(map(max, zip(*t))) if lockstep else max(map(sum, t))


def fit(sizes, times):
    # (c0, c1) of a rank from its times at two micro-batch sizes; one size (or a time that did not
    # grow): all of it per sequence.
    (b1, b2), (t1, t2) = sizes, times
    c1 = (t2 - t1) / (b2 - b1) if b2 > b1 and t2 > t1 else t2 / b2
    return max(0.0, t2 - c1 * b2), c1


def refit(sizes, c0, c1, times):
    # Each rank's c1 from its measured compute seconds of a step (its c0 kept): what the rank did
    # minus its micro-batches' fixed cost, per sequence. A rank without sequences keeps its c1.
    return [max(t - a * len(ms), 0.05 * t) / sum(ms) if sum(ms) else b
            for t, a, b, ms in zip(times, c0, c1, sizes)]


def rebalance(sizes, caps, c0, c1, times, lockstep, gain=0.03):
    # Each rank's c1 refitted to its measured compute seconds of a step (times: not the waits in
    # collectives), then the fastest split of the same batch (under lockstep in as many
    # micro-batches), if it is predicted more than `gain` faster: noise in the speeds must not make
    # the split wander. Returns (sizes, c1).
    c1 = refit(sizes, c0, c1, times)
    batch, count = sum(map(sum, sizes)), len(sizes[0]) if lockstep else None
    shares, new = split(batch, caps, c0, c1, count=count)
    if step_time(new, c0, c1, lockstep) < (1 - gain) * step_time(sizes, c0, c1, lockstep):
        return new, c1
    return sizes, c1
