"""
The heterogeneous split (balance.py) against brute force, and micro_batches.
"""
import itertools
import random

import pytest

from hetgpt.planner import balance
from hetgpt.planner.balance import fit, micro_batches, rebalance, refit, split, split_batch, weighted


def step_time(n, c0, c1):
    return max(a + b * k for a, b, k in zip(c0, c1, n))


def brute_force(batch, c0, c1, caps):
    return min(step_time(n, c0, c1) for n in itertools.product(*[range(c + 1) for c in caps]) if sum(n) == batch)


def test_split_matches_brute_force_on_random_cases():
    rng = random.Random(0)
    for _ in range(400):
        ranks = rng.randint(1, 4)
        caps = [rng.randint(0, 7) for _ in range(ranks)]
        if sum(caps) == 0:
            continue
        batch = rng.randint(0, sum(caps))
        c0 = [rng.choice([0.0, rng.uniform(0, 3)]) for _ in range(ranks)]
        c1 = [rng.choice([1.0, rng.uniform(0.05, 4)]) for _ in range(ranks)]
        n = split_batch(batch, c0, c1, caps)
        assert sum(n) == batch and all(0 <= k <= c for k, c in zip(n, caps))
        best = brute_force(batch, c0, c1, caps)
        assert step_time(n, c0, c1) <= 1.02 * best + 1e-12
        assert step_time(n, c0, c1) == pytest.approx(best)  # the greedy is exact


def lockstep_time(n, c0, c1, caps, count):
    # FSDP: every rank runs `count` micro-batches; each micro-batch waits for the slowest rank
    pieces = [micro_batches(x, c, count) for x, c in zip(n, caps)]
    return sum(max(a + b * p[j] for a, b, p in zip(c0, c1, pieces)) for j in range(count))


def test_lockstep_split_matches_brute_force_at_the_fewest_micro_batches():
    # count = ceil(batch / sum(caps)), as the planner starts from: caps are per micro-batch
    rng = random.Random(1)
    for _ in range(300):
        ranks = rng.randint(1, 3)
        caps = [rng.randint(1, 4) for _ in range(ranks)]
        batch = rng.randint(1, 3 * sum(caps))
        count = -(-batch // sum(caps))
        c0 = [rng.uniform(0, 1) for _ in range(ranks)]
        c1 = [rng.uniform(0.1, 5) for _ in range(ranks)]
        n = split_batch(batch, c0, c1, caps, count=count)
        assert sum(n) == batch and all(max(micro_batches(x, c, count)) <= c for x, c in zip(n, caps))
        best = min(lockstep_time(m, c0, c1, caps, count) for m in
                   itertools.product(*[range(count * c + 1) for c in caps]) if sum(m) == batch)
        assert lockstep_time(n, c0, c1, caps, count) <= 1.02 * best + 1e-12
    with pytest.raises(ValueError, match=r"in 2 micro-batches: their caps \[1, 2\] per micro-batch hold only 6"):
        split_batch(7, [0, 0], [1, 1], [1, 2], count=2)


def test_even_split_and_speed_ratio():
    assert split_batch(10, [0] * 3, [1] * 3, [10] * 3) == [4, 3, 3]
    assert split_batch(8, [0, 0], [1, 3], [8, 8]) == [6, 2]   # 3× faster rank takes 3× the sequences
    assert split_batch(8, [0, 0], [1, 3], [4, 8]) == [4, 4]   # unless its cap stops it


def test_infeasible_split_is_a_clear_error():
    with pytest.raises(ValueError, match=r"cannot split 10 sequences over 2 ranks: their caps \[3, 4\] hold only 7"):
        split_batch(10, [0, 0], [1, 1], [3, 4])


@pytest.mark.parametrize('n,cap', [(0, 4), (1, 4), (7, 3), (12, 4), (13, 5)])
def test_micro_batches(n, cap):
    m = micro_batches(n, cap)
    assert sum(m) == n and all(0 < x <= cap for x in m) and len(m) == -(-n // cap)
    assert max(m, default=0) - min(m, default=0) <= 1
    for count in range(-(-n // cap) or 1, 9):
        m = micro_batches(n, cap, count)
        assert len(m) == count and sum(m) == n and all(0 <= x <= cap for x in m) and max(m) - min(m) <= 1
    with pytest.raises(ValueError):
        micro_batches(n + 1, cap, (n + 1) // cap - 1 if (n + 1) // cap > 1 else 0)


def test_split_under_ddp_and_lockstep():
    # DDP: a share runs in micro-batches of at most the cap, each costing c0 more: per sequence
    # c1 + c0/cap. Lockstep: the given number of micro-batches on every rank, within the caps.
    shares, sizes = split(12, [2, 4], [0.0, 0.0], [1.0, 1.0])
    assert shares == [6, 6] and sizes == [[2, 2, 2], [3, 3]]
    shares, sizes = split(12, [2, 4], [1.0, 1.0], [1.0, 1.0])  # c0 makes small micro-batches dear
    assert sum(shares) == 12 and shares[1] > shares[0]
    shares, sizes = split(12, [2, 4], [0.0, 0.0], [1.0, 1.0], count=3)
    assert shares == [6, 6] and [len(m) for m in sizes] == [3, 3] and max(sizes[0]) <= 2
    assert split(3, [4, 4], [0.0, 0.0], [1.0, 9.0])[1] == [[3], [0]]  # an empty share: one empty piece


def test_weighted_split_is_in_proportion():
    assert weighted(8, [2, 2], [3, 1], lockstep=False) == ([6, 2], [[2, 2, 2], [2]])
    assert weighted(8, [2, 2], [3, 1], lockstep=True) == ([6, 2], [[2, 2, 2], [1, 1, 0]])


def test_fit_and_refit_recover_the_speeds():
    c0, c1 = 0.3, 0.2
    assert fit((2, 4), (c0 + 2 * c1, c0 + 4 * c1)) == pytest.approx((c0, c1))
    # a step of two micro-batches of 3 on a rank whose c1 became 0.5: refit finds it; a rank with
    # nothing to do keeps its c1
    sizes = [[3, 3], [0]]
    times = [2 * 0.3 + 6 * 0.5, 0.1]
    assert refit(sizes, [0.3, 0.1], [0.2, 0.7], times) == pytest.approx([0.5, 0.7])


def test_rebalance_moves_only_for_a_clear_gain():
    sizes, c0 = [[2, 2], [2, 2]], [0.0, 0.0]
    # rank 1 measured twice as slow (4 s for its 4 sequences): rank 0 gets more, clearly faster
    new, c1 = rebalance(sizes, [4, 4], c0, [1.0, 1.0], [4.0, 8.0], lockstep=False)
    assert c1 == pytest.approx([1.0, 2.0])
    assert sum(new[0]) > sum(new[1]) and balance.step_time(new, c0, c1, False) == 6.0
    # 2% apart: within the noise the split stays
    assert rebalance(sizes, [4, 4], c0, [1.0, 1.0], [4.0, 4.08], lockstep=False)[0] == sizes
    # lockstep keeps the number of micro-batches
    new, c1 = rebalance(sizes, [4, 4], c0, [1.0, 1.0], [4.0, 8.0], lockstep=True)
    assert [len(m) for m in new] == [2, 2] and sum(map(sum, new)) == 8
    assert balance.step_time(new, c0, c1, True) < balance.step_time(sizes, c0, c1, True)


def test_an_entry_of_identical_ranks_splits_as_its_ranks_one_by_one():
    # split_batch(counts=...): an entry standing for k identical ranks gets, as runs of shares in
    # rank order, exactly what the same ranks given one by one get: the greedy, the split at once
    # above balance.EXACT, lockstep (its fill, and above EXACT every micro-batch alike); ties (equal
    # speeds, c1 = 0) included
    rng = random.Random(36)
    seen = set()
    for _ in range(700):
        E = rng.randint(1, 4)
        k = [rng.choice([1, 2, 3, 5, 8]) for _ in range(E)]
        c0 = [rng.choice([0.0, 0.1, 1.0, rng.random()]) for _ in range(E)]
        c1 = [rng.choice([0.0, 1 / 3, 0.5, 1.0, rng.random()]) for _ in range(E)]
        large = rng.random() < 0.3
        caps = [rng.randint(300, 3000) if large else rng.choice([1, 3, 7, rng.randint(1, 40)])
                for _ in range(E)]
        count = rng.choice([None, None, 2, 3, 5])
        batch = rng.randint(0, (count or 1) * sum(c * n for c, n in zip(caps, k)))
        one_by_one = lambda xs: [x for x, n in zip(xs, k) for _ in range(n)]
        expected = split_batch(batch, one_by_one(c0), one_by_one(c1), one_by_one(caps), count)
        runs = split_batch(batch, c0, c1, caps, count, counts=k)
        assert [x for entry in runs for x, n in entry for _ in range(n)] == expected
        assert all(sum(n for _, n in entry) == m for entry, m in zip(runs, k))
        seen.add((batch > balance.EXACT, count is not None, max(k) > 1))
    assert len(seen) == 8  # every path, with entries of several ranks and without
