"""
Which rank owns each whole matrix: an optimizer whose update needs the
whole matrix (Muon's orthogonalisation) cannot step FSDP2's row shards
alone, so one rank gathers a matrix, steps it and sends the shards back,
and only that rank keeps its state. The run (hetgpt/run) and the planner
(its memory) read the same assignment. Pure Python, no torch.
"""


def owners(sizes, world):
    """The owning rank of each matrix, given their element counts.

    Largest first, each to the rank that owns the fewest elements so far
    (the lowest rank on a tie): every rank ends within one matrix of an
    even share. The same sizes give the same owners on every rank.
    """
    load = [0] * world
    owner = [0] * len(sizes)
    order = sorted(range(len(sizes)), key=lambda i: (-sizes[i], i))
    for i in order:
        r = min(range(world), key=lambda k: (load[k], k))
        owner[i] = r
        load[r] += sizes[i]
    return owner


def owned(sizes, world):
    """Elements each rank owns under owners(): a list, one per rank."""
    load = [0] * world
    for size, r in zip(sizes, owners(sizes, world)):
        load[r] += size
    return load
