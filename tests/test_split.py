"""
The heterogeneous split (plan.split_batch) against brute force, and micro_batches.
"""
import itertools
import random

import pytest

from plan import micro_batches, split_batch


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
