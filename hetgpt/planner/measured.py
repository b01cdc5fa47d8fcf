"""
plan.py --measured OUT_DIR: a plan from a run's own measured speed.

train.py's rank 0 rewrites OUT_DIR/measured.json at each log line
(hetgpt/run/speed.py's Speed.record): the model, the batch, the strategy,
the optimizer (knobs.OPTIMIZER: the fit times the step of the one the run
had), each rank's kind (its GPU or cpu), dtype, ac and threads, and per
log interval the tokens/s, each rank's micro-batches and its compute
seconds. read() takes it as untrusted input: a damaged or foreign record
is one line, exit 2.
calibrate() turns it into a step efficiency per kind (efficiency.py): the
share of the kernel-rate compute (timing.py at efficiency 1.0) that this
run reached, so that it carries over to another shape, batch or cluster
(a CPU's per thread: a lone process computes on all its cores, each of a
node's 2+ ranks under torchrun on one).

Its measured tokens/s: the median of its log intervals after the first
(warm-up). The step efficiencies: relative between kinds from each rank's
compute seconds (Speed's, where a run of 2+ ranks timed them), scaled
together so that timing.step, at the run's split, strategy and dtypes,
predicts its measured step. The rest of the step (the optimizer, the
collectives: gloo's or NCCL's) keeps its priors: a run on one rank times
no collective, and a run on one machine says nothing of another's links.
"""
import json
import math
import os
import statistics

from hetgpt.errors import die
from hetgpt.gpus import GPUS
from hetgpt.knobs import (DTYPES, MAX_BATCH, OPTIMIZER, STRATEGIES, TRAIN,
                          TRAIN_PY, defaults_of, model_defaults, rule_fault)

NAME = 'measured.json'
FORMAT = 'hetgpt-measured/2'  # /2: each rank's threads, the optimizer
MAX_BYTES = 64 * 2**20  # a record of 50 intervals of 100k ranks
MAX_RANKS = 2**17
MAX_THREADS = 2**12  # a rank's
WARM_UP = 1  # log intervals left out: compiling, caches, the allocator
ENOUGH = 3  # log intervals after those that a plan needs
HUGE = 1e9  # an efficiency at which compute takes no time


def _finite(x):
    """Whether x is a number (not a bool), finite and > 0."""
    ok = type(x) in (int, float)
    return ok and 0 < x < math.inf


def _count(x, low=0, high=MAX_BATCH):
    """Whether x is an int (not a bool) in [low, high]."""
    return type(x) is int and low <= x <= high


def _model_fault(model):
    """Why model (the record's GPTConfig fields) is not this model.py's,
    or None."""
    fields = model_defaults()
    if not isinstance(model, dict) or set(model) != set(fields):
        return "its model has other fields than model.py's GPTConfig " \
               "(another model.py's run)"
    for k, v in model.items():
        want = type(fields[k])
        if type(v) is not want and not (want is float and type(v) is int):
            return f"its model's {k} is {v!r}, not a {want.__name__}"
        if want in (int, float) and not 0 <= v < math.inf:
            return f"its model's {k} is {v!r}"
    for k in ('block_size', 'vocab_size', 'n_layer', 'n_head', 'n_embd'):
        if not _count(model[k], 1, 2**24):
            return f"its model's {k} is {model[k]!r}"
    if model['n_embd'] % model['n_head']:
        return "its model's n_embd is not divisible by n_head"
    return None


def _optimizer_fault(given):
    """Why the record's optimizer (knobs.OPTIMIZER's values) is not one
    train.py builds, or None."""
    if not isinstance(given, dict) or set(given) != set(OPTIMIZER):
        return f"its optimizer is not {', '.join(OPTIMIZER)}"
    defaults = defaults_of(TRAIN_PY)
    for k, v in given.items():
        want = type(defaults[k])
        if type(v) is not want and not (want is float and type(v) is int):
            return f"its optimizer's {k} is {v!r}, not a {want.__name__}"
        why = rule_fault(k, v, TRAIN[k])
        if why:
            return f"its optimizer's {why}"
    return None


def _rank_fault(r):
    """Why a rank's entry is unusable, or None."""
    if not isinstance(r, dict):
        return "a rank's entry is not an object"
    if r.get('kind') != 'cpu' and r.get('kind') not in GPUS:
        return f"a rank's kind {r.get('kind')!r} is not cpu nor a GPU " \
               f"plan.py knows"
    if r.get('dtype') not in DTYPES:
        return f"a rank's dtype {r.get('dtype')!r} is not one of {DTYPES}"
    if type(r.get('ac')) is not bool or not _count(r.get('node'),
                                                    0, MAX_RANKS):
        return "a rank's ac or node is missing or not what it should be"
    if not _count(r.get('threads'), 1, MAX_THREADS):
        return f"a rank's threads {r.get('threads')!r} is not a count " \
               f"of 1 to {MAX_THREADS}"
    return None


def _interval_fault(x, R, batch):
    """Why a log interval's entry is unusable, or None."""
    if not isinstance(x, dict) or not _count(x.get('iter'), 1, 2**62):
        return "a log interval has no iter"
    if not _finite(x.get('tokens_per_sec')):
        return f"iter {x['iter']}'s tokens/s is not a number > 0"
    sizes = x.get('sizes')
    if not isinstance(sizes, list) or len(sizes) != R or not all(
            isinstance(s, list) and s and all(_count(k, 1) for k in s)
            for s in sizes):
        return f"iter {x['iter']}'s micro-batches are not one list per rank"
    if sum(map(sum, sizes)) != batch:
        return f"iter {x['iter']}'s micro-batches do not sum to the batch"
    c = x.get('compute_s')
    if c is not None and not (isinstance(c, list) and len(c) == R
                              and all(map(_finite, c))):
        return f"iter {x['iter']}'s compute seconds are not one number " \
               f"> 0 per rank"
    return None


def fault(rec):
    """Why rec (measured.json, parsed) cannot be planned from, or None.

    Each check in order, so that the first fault is said.
    """
    if not isinstance(rec, dict) or rec.get('format') != FORMAT:
        return f"it is not a record of this hetgpt (format {FORMAT})"
    why = _model_fault(rec.get('model'))
    if why:
        return why
    ranks, rows = rec.get('ranks'), rec.get('intervals')
    if not isinstance(ranks, list) or not 1 <= len(ranks) <= MAX_RANKS:
        return "its ranks are missing"
    if not isinstance(rows, list):
        return "its log intervals are missing"
    if not _count(rec.get('batch_size'), len(ranks)):
        return "its batch_size is missing or below its ranks"
    if not _count(rec.get('block_size'), 1, rec['model']['block_size']):
        return "its block_size is missing or above its model's"
    if rec.get('strategy') not in STRATEGIES:
        return f"its strategy {rec.get('strategy')!r} is not one of " \
               f"{', '.join(STRATEGIES)}"
    if type(rec.get('accumulate')) is not bool:
        return "its accumulate is missing"
    why = _optimizer_fault(rec.get('optimizer'))
    if why:
        return why
    for r in ranks:
        why = _rank_fault(r)
        if why:
            return why
    for x in rows:
        why = _interval_fault(x, len(ranks), rec['batch_size'])
        if why:
            return why
    if len(rows) < WARM_UP + ENOUGH:
        return f"it has {len(rows)} log interval(s); a plan needs " \
               f"{WARM_UP + ENOUGH} (the first is warm-up): let the run " \
               f"log more (or lower its log_interval)"
    return None


def _no_constant(name):
    """json's hook for NaN and Infinity: refused (a damaged record)."""
    raise ValueError(f"{name} in it")


def read(out_dir):
    """The record in out_dir, checked (fault); a damaged or foreign one is
    one line and exit 2."""
    path = os.path.join(out_dir, NAME)
    what = (f"--measured {out_dir}: give the out_dir of a train.py run "
            f"(its rank 0 writes {NAME} at each log line)")
    if not os.path.isdir(out_dir):
        die(f"{what}; this is not a directory")
    if not os.path.isfile(path):
        die(f"{what}; it has no {NAME} (not a train.py out_dir, or a run "
            f"that has not logged yet)")
    try:
        if os.path.getsize(path) > MAX_BYTES:
            raise ValueError(f"over {MAX_BYTES // 2**20} MiB")
        with open(path, encoding='utf-8') as f:
            rec = json.load(f, parse_constant=_no_constant)
    except (OSError, ValueError, RecursionError) as e:
        die(f"{what}; its {NAME} cannot be read ({e}): damaged")
    why = fault(rec)
    if why:
        die(f"{what}; its {NAME} is unusable: {why}")
    return rec


def tokens_per_sec(rec):
    """The run's measured tokens/s: the median of its log intervals after
    the warm-up."""
    rows = rec['intervals'][WARM_UP:]
    return statistics.median(x['tokens_per_sec'] for x in rows)


def _ranks(rec, scale=1.0, relative=None):
    """The run's ranks as timing.py takes them, each kind at scale × its
    relative efficiency."""
    out = []
    for r in rec['ranks']:
        cpu = r['kind'] == 'cpu'
        e = scale * (relative or {}).get(r['kind'], 1.0)
        out.append(dict(device='cpu' if cpu else 'cuda',
                        gpu=None if cpu else r['kind'], node=r['node'],
                        dtype=r['dtype'], count=1, efficiency=e,
                        threads=r['threads']))
    return out


def _relative(rec, cfg, sizes, shard):
    """Each kind's efficiency relative to the others, from each rank's
    compute seconds: {kind: median over its ranks of predicted (at 1.0) /
    measured (the median of the intervals that timed it)}; None for one
    kind, or where no interval timed the ranks (one rank; CUDA before its
    first timed step)."""
    from hetgpt.planner import timing
    rows = [x for x in rec['intervals'][WARM_UP:] if x['compute_s']]
    if len({r['kind'] for r in rec['ranks']}) == 1 or not rows:
        return None
    found = {}
    for i, r in enumerate(_ranks(rec)):
        c0, c1 = timing.compute(cfg, r, rec['ranks'][i]['ac'], shard,
                                max(sizes[i]))
        predicted = sum(c0 + c1 * s for s in sizes[i])
        measured = statistics.median(x['compute_s'][i] for x in rows)
        found.setdefault(rec['ranks'][i]['kind'], []).append(
            predicted / measured)
    return {k: statistics.median(v) for k, v in found.items()}


def calibrate(rec):
    """({kind: step efficiency}, how, in words) of the run in rec.

    The efficiencies at which timing.step, at the run's last split,
    strategy, dtypes, ac and optimizer, predicts its measured step
    (tokens_per_sec). Where even compute at no time leaves the priors'
    rest of the step above the measured one, the efficiencies come from
    compute alone. (The planner's optimizer is the record's while it
    fits, then what it was.)
    """
    from hetgpt.planner import costs
    before = dict(costs.GIVEN)
    costs.set_train_knobs(rec['optimizer'])
    try:
        return _fit(rec)
    finally:
        costs.set_train_knobs(before)


def _fit(rec):
    """calibrate's fit, under the record's optimizer."""
    from hetgpt.knobs import flags
    from hetgpt.planner import timing
    from model import GPTConfig
    cfg = GPTConfig(**rec['model'])
    f = flags(rec['strategy'])
    sizes = rec['intervals'][-1]['sizes']
    relative = _relative(rec, cfg, sizes, f['shard'])
    measured = rec['batch_size'] * rec['block_size'] / tokens_per_sec(rec)
    step = lambda scale: timing.step(
        cfg, rec['batch_size'], _ranks(rec, scale, relative), f,
        [max(s) for s in sizes], [r['ac'] for r in rec['ranks']],
        rec['accumulate'], weights=[sum(s) for s in sizes])[0]
    rest = step(HUGE)
    scale = 1.0
    how = 'the step fitted'
    if rest < measured:
        # (the step falls as the scale grows: bisected in log space)
        low, high = math.log(1 / HUGE), math.log(HUGE)
        for _ in range(60):
            mid = (low + high) / 2
            if step(math.exp(mid)) > measured:
                low = mid
            else:
                high = mid
        scale = math.exp((low + high) / 2)
    elif relative is None:
        scale = step(1.0) / measured
        how = "the whole step over the priors' (their rest is slower)"
    else:
        how = "compute alone (the priors' rest is slower than the step)"
    kinds = {r['kind'] for r in rec['ranks']}
    return {k: scale * (relative or {}).get(k, 1.0) for k in kinds}, how


def apply(rec, ranks, out_dir):
    """(ranks, line): the ranks of the kinds the run had at its measured
    efficiency (a CPU's rate the run's, not --cpu_gflops), the others at
    their priors, and one line that says which are which."""
    found, how = calibrate(rec)
    kinds = dict.fromkeys(r['gpu'] or 'cpu' for r in ranks)
    out = []
    for r in ranks:
        kind = r['gpu'] or 'cpu'
        if kind in found and kind == 'cpu':
            r = dict(r, efficiency=found[kind], flops=None)
        elif kind in found:
            r = dict(r, efficiency=found[kind])
        out.append(r)
    rows = rec['intervals']
    said = [f"{k} at step efficiency {found[k]:.3g}" for k in kinds
            if k in found]
    priors = [k for k in kinds if k not in found]
    line = (f"measured ({out_dir}, iters {rows[WARM_UP]['iter']}-"
            f"{rows[-1]['iter']}: {tokens_per_sec(rec):,.0f} tokens/s, the "
            f"median of {len(rows) - WARM_UP} log intervals; {how}): "
            f"{', '.join(said) or 'none of these kinds'}")
    if priors:
        line += f"; priors: {', '.join(priors)}"
    if not said:
        line += f" (the run had {', '.join(sorted(found))})"
    return out, line
