"""
The step efficiency: how far a real PyTorch step falls below the sum of
its kernels at their micro-benchmark rates (hetgpt/planner/timing.py's
clock, the ceiling). One number per GPU generation, fitted on published
end-to-end PyTorch runs (bench/published.py) and checked on runs it
never saw (leave one source out: bench/RESULTS.md). It divides a
GPU rank's compute (its kernels and launches, timing.compute), not its
collectives, PCIe copies or host optimizer step, which keep their own
rates. A rank that carries 'efficiency' (measured from the user's own
run: plan.py --measured) uses that instead; a CPU rank's rate model is
its own (1.0).
"""
import math

from hetgpt.gpus import GPUS

# Fitted by fit() on bench/published.py's rows (tests/test_efficiency.py
# recomputes it; do not tune by hand): per generation, the geometric mean
# over its sources of each source's geometric mean over its rows of the
# compute efficiency that makes the row's prediction its published
# tokens/s. Sources:
# - Hopper: MosaicML llm-foundry's MPT table (H100 rows), PyTorch's
#   torchtitan Llama 3.1 8B (benchmarks/llama3_h100_202412_torchtitan.md);
# - Ampere: MosaicML's MPT table (A100 rows), TinyLlama (arXiv 2401.02385,
#   lit-gpt + FSDP on A100-40GB);
# - Volta: NVIDIA's Megatron-LM 1.2B on one V100 (arXiv 1909.08053),
#   Microsoft's ZeRO-Offload 10B on one V100 (arXiv 2101.06840).
STEP_EFFICIENCY = {'Hopper': 0.6667, 'Ampere': 0.7505, 'Volta': 0.4611}
# A generation without published rows (Ada, Turing, an unknown GPU): the
# geometric mean over every source, each weighted once
FALLBACK = 0.6133


def _gmean(xs):
    """The geometric mean of positive numbers."""
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def fit(rows):
    """({generation: efficiency}, fallback) from calibration rows.

    rows: (generation, source, efficiency of the row). A source's rows
    in a generation: their geometric mean; a generation: the geometric
    mean of its sources' (each source weighted once, however many rows
    it has); the fallback: the geometric mean over every (generation,
    source) pair.
    """
    by = {}
    for gen, source, e in rows:
        by.setdefault(gen, {}).setdefault(source, []).append(e)
    per = {g: {s: _gmean(es) for s, es in x.items()}
           for g, x in by.items()}
    table = {g: _gmean(list(x.values())) for g, x in per.items()}
    every = [e for x in per.values() for e in x.values()]
    return table, _gmean(every)


def prior(gpu, table=None, fallback=None):
    """(efficiency, generation or None) of a GPU kind with no measure.

    From the stored table (or the given one): its generation's, else
    the fallback.
    """
    if table is None:
        table, fallback = STEP_EFFICIENCY, FALLBACK
    gen = GPUS.get(gpu, {}).get('generation')
    if gen in table:
        return table[gen], gen
    return fallback, None


def step_efficiency(rank):
    """The factor dividing a rank's compute seconds.

    rank['efficiency'] where the rank carries one (measured); 1.0 for a
    CPU rank; else its GPU generation's prior (prior).
    """
    if rank.get('efficiency'):
        return rank['efficiency']
    if rank['device'] != 'cuda':
        return 1.0
    return prior(rank.get('gpu'))[0]
