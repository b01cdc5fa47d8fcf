"""
A rank's step efficiency: the share of its kernel-rate compute (timing.py)
that a real step reaches. Where a run measured it (plan.py --measured,
hetgpt/planner/measured.py), the rank carries it; else 1.0 (the priors per
GPU generation come with issue 49's items 1-2).
"""


def step_efficiency(rank):
    """The rank's step efficiency: rank['efficiency'], else 1.0."""
    return rank.get('efficiency', 1.0)
