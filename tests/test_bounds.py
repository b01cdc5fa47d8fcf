"""
Issue 23 (item 3): planning takes bounded time whatever the global batch, and every knob has an
upper bound where a larger value can only be a slip. A hang shows here as a subprocess timeout.
Issue 36 (item 4): and whatever the count of identical GPUs (hetgpt/planner/cluster.py).
"""
import heapq
import json
import tracemalloc
from collections import Counter
import os
import random
import subprocess
import sys

import pytest

import trainer
from trainer import ROOT, TINY, run_train, train_defaults, train_rules
from hetgpt import knobs
from hetgpt.planner import balance, search, timing
from hetgpt.planner.cluster import expand
import plan
from test_plan import load

PLAN = [sys.executable, os.path.join(ROOT, 'plan.py')]
BOUNDED = {'gradient_accumulation_steps', 'batch_size', 'micro_batch_size', 'max_iters', 'n_layer',
           'n_head', 'n_embd', 'block_size', 'vocab_size', 'eval_iters', 'eval_interval',
           'log_interval', 'keep_last', 'warmup_iters', 'lr_decay_iters', 'checkpoint_interval',
           'rebalance_interval', 'stall_timeout', 'max_bad_steps', 'seed'}


def one_error_line(p, knob):
    line = trainer.one_error_line(p)  # exit 2, one line, no traceback
    assert knob in line, line
    return line


def nanogpt_config(tmp_path, steps='10**9'):
    path = tmp_path / 'huge_accumulation.py'
    path.write_text(f"batch_size = 12\ngradient_accumulation_steps = {steps}\n")
    return str(path)


@pytest.mark.parametrize('steps,says', [('10**9', 'must be in [0, 16777216]'),  # the knob
                                        ('10**7', '120,000,000 sequences')])  # × batch_size 12
def test_plan_answers_a_huge_accumulation_in_one_line(tmp_path, steps, says):
    p = subprocess.run(PLAN + ['configs/gpt_tiny.py', nanogpt_config(tmp_path, steps)], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert says in one_error_line(p, 'gradient_accumulation_steps') and not p.stdout


def test_train_refuses_a_billion_accumulation_steps_before_any_work(tmp_path):
    p = run_train(tmp_path, *TINY, nanogpt_config(tmp_path), '--out_dir=never', check=False,
                  timeout=60)
    one_error_line(p, 'gradient_accumulation_steps')
    assert 'planning' not in p.stdout and not (tmp_path / 'never').exists()


LARGEST = f"""
import json, runpy, sys
import plan
from hetgpt.planner import search
from hetgpt import knobs
from model import config_from
out = []
for name, gpus, host in {[('gpt_tiny', '2xcpu', 16),
                          ('gpt_1p3b', '1xA100-80GB,1xV100-32GB,2xT4', None),
                          ('gpt_175b', '1xH200', None)]}:
    d = runpy.run_path(f'configs/{{name}}.py')
    cfg = config_from({{k: v for k, v in d.items() if not k.startswith('_')}})
    p = search.make_plan(cfg, knobs.MAX_BATCH, plan._cluster(gpus, None, host))
    per = lambda xs: [x for x, r in zip(xs, p.ranks) for _ in range(r['count'])]  # (rank by rank)
    out.append(dict(name=name, fits=p.fits, shard=p.shard, share=per(p.share), cap=per(p.caps),
                    total=sum(map(sum, per(p.sizes))), sums=list(map(sum, per(p.sizes))),
                    largest=[max(m) for m in per(p.sizes)], counts=per(p.accum)))
print(json.dumps(out))
"""


def test_the_largest_batch_allowed_plans_and_its_micro_batches_sum_to_it():
    # 2**24 sequences: one and several ranks, DDP and FSDP's lockstep, micro-batches of one
    # sequence (175B on one H200: 16.8M of them)
    p = subprocess.run([sys.executable, '-c', LARGEST], cwd=ROOT, capture_output=True, text=True,
                       timeout=60, env=dict(os.environ, PYTHONPATH=ROOT))
    assert p.returncode == 0, p.stderr[-3000:]
    for r in json.loads(p.stdout.splitlines()[-1]):
        assert r['fits'] and r['total'] == knobs.MAX_BATCH == sum(r['share']), r['name']
        assert r['sums'] == r['share'] and all(b <= c for b, c in zip(r['largest'], r['cap']))
        if r['shard']:
            assert len(set(r['counts'])) == 1, r  # lockstep: as many on every rank
    assert [r['shard'] for r in json.loads(p.stdout.splitlines()[-1])] == [False, True, True]


def test_plan_takes_the_largest_batch_and_refuses_one_more(tmp_path):
    ok = subprocess.run(PLAN + ['configs/gpt_tiny.py', '--gradient_accumulation_steps=1048576'],
                        cwd=ROOT, capture_output=True, text=True, timeout=60)  # 16 × 2**20 = 2**24
    assert ok.returncode == 0 and 'batch 16777216 × 128 tokens' in ok.stdout, ok.stderr[-2000:]
    over = subprocess.run(PLAN + ['configs/gpt_tiny.py', '--gradient_accumulation_steps=1048577'],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    one_error_line(over, 'gradient_accumulation_steps')


def test_the_175b_dry_run_completes_at_its_batch_and_at_the_largest():
    for extra in ([], ['--batch_size=16777216']):
        p = subprocess.run(PLAN + ['configs/gpt_175b.py', *extra], cwd=ROOT, capture_output=True,
                           text=True, timeout=60)
        assert p.returncode == 0 and 'plan: fsdp+ac+offload (fits)' in p.stdout, p.stderr[-2000:]


# -----------------------------------------------------------------------------
# The knob tables
def test_plan_and_train_check_the_shape_and_batch_from_one_table(capsys):
    rules = train_rules()
    assert {k: rules[k] for k in knobs.SHAPE} == knobs.SHAPE
    for arg in ('--n_layer=100001', '--vocab_size=16777217', '--batch_size=16777217'):
        with pytest.raises(SystemExit) as e:
            plan.main(['configs/gpt_tiny.py', arg])
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and len(err) == 1 and arg[2:].split('=')[0] in err[0], err


def test_upper_bounds_refuse_one_past_them_and_no_real_run(capsys):
    rules, defaults = train_rules(), train_defaults()
    bounded = {k for k, r in rules.items() if r[:1] in '[(' and type(defaults[k]) is int}
    assert BOUNDED <= bounded, BOUNDED - bounded
    for key in sorted(bounded):
        high = int(float(rules[key].split(',')[1].strip(' ])')))
        assert knobs.configure(defaults, [f'--{key}={high}'], rules=rules)[key] == high
        with pytest.raises(SystemExit) as e:
            knobs.configure(defaults, [f'--{key}={high + 1}'], rules=rules)
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and len(err) == 1 and f'{key}={high + 1}' in err[0], err
    # real runs pass: 175B, a 1M-token batch of 1M-token sequences, a 1M vocabulary, 10M steps
    real = ['configs/gpt_175b.py', '--vocab_size=1048576', '--block_size=1048576',
            '--max_iters=10000000', '--lr_decay_iters=10000000', '--warmup_iters=100000',
            '--eval_interval=1000000', '--checkpoint_interval=1000000', '--stall_timeout=86400']
    config = knobs.configure(defaults, real, rules=rules)
    assert knobs.batch_of(config['batch_size']) == (1472, 0)
    assert knobs.batch_of(16, 65536) == (2**20, 16)  # nanoGPT's: 1M sequences


# -----------------------------------------------------------------------------
# The splits above balance.EXACT are computed at once: the same as the greedy's, one at a time
def greedy(batch, c0, c1, caps):
    n, heap = [0] * len(caps), [(c0[i] + c1[i], i) for i in range(len(caps)) if caps[i] > 0]
    heapq.heapify(heap)
    for _ in range(batch):
        _, i = heapq.heappop(heap)
        n[i] += 1
        if n[i] < caps[i]:
            heapq.heappush(heap, (c0[i] + c1[i] * (n[i] + 1), i))
    return n


def test_the_split_at_once_is_the_greedy_split_and_lockstep_holds_the_batch():
    rng = random.Random(23)
    for _ in range(150):  # ties included: equal speeds, c1 = 0, thirds
        R = rng.randint(1, 6)
        c0 = [rng.choice([0.0, 0.1, 1.0, rng.random()]) for _ in range(R)]
        c1 = [rng.choice([0.0, 1 / 3, 0.5, 1.0, rng.random()]) for _ in range(R)]
        caps = [rng.choice([0, 1, 7, 3000, rng.randint(1, 9000)]) for _ in range(R)]
        if sum(caps) <= balance.EXACT:
            continue
        batch = rng.randint(balance.EXACT + 1, sum(caps))
        assert balance.split_batch(batch, c0, c1, caps) == greedy(batch, c0, c1, caps)
    c0, c1, caps = [1e-3] * 3, [0.01, 0.05, 0.02], [8, 2, 1]
    for count, batch in ((300, 3299), (1000, 4097), (2**18, 2**21 + 5)):
        n = balance.split_batch(batch, c0, c1, caps, count=count)
        assert sum(n) == batch and all(x <= count * c for x, c in zip(n, caps)), n
        sizes = balance.pieces(n, caps, count)
        each = [[a + b * max(m, 1) for m in ms] for a, b, ms in zip(c0, c1, sizes)]
        assert balance.step_time(sizes, c0, c1, True) == \
            pytest.approx(sum(map(max, zip(*each))), rel=1e-9)
        assert balance.step_time(sizes, c0, c1, False) == \
            pytest.approx(max(map(sum, each)), rel=1e-9)


# -----------------------------------------------------------------------------
# Identical ranks as one entry (issue 36): what plan.py lays out, against the same ranks one by one
# (one entry per rank: train.py's path, whose plans on these clusters were those of the planner
# before grouping, f1497e5). Each case a way ranks group or the split runs.
GROUPED = [  # --gpus, --nodes, --host_mem (GiB), batch, plan
    ('4xA100-80GB,4xV100-32GB,4xA100-80GB,4xV100-32GB', 2, None, 528, 'auto'),  # interleaved kinds
    ('3xA100-80GB,9xV100-32GB,5xH100-SXM', 3, 256, 528, 'fsdp+offload'),  # nodes across kinds,
    ('3xA100-80GB,9xV100-32GB,5xH100-SXM', 3, None, 528, 'ddp'),  # a smaller last node, hosts
    ('20xH100-SXM', None, None, 530, 'auto'),  # ranks alike with 27 and 26 sequences
    ('12xA100-80GB,4xV100-32GB', None, None, 5000, 'fsdp'),  # above balance.EXACT: lockstep,
    ('12xA100-80GB,4xV100-32GB', None, None, 5000, 'ddp'),  # and the split at once
    ('2xRTX2080Ti', None, 16, 64, 'auto')]  # does not fit: the advice grows the mix


def test_a_plan_of_identical_ranks_as_one_entry_is_the_plan_rank_by_rank():
    cfg, _ = load('gpt_1p3b')
    for gpus, nodes, host, batch, strategy in GROUPED:
        entries = plan._cluster(gpus, nodes, host)
        ranks = expand(entries)
        assert len(entries) < len(ranks), gpus  # (grouped)
        grouped, reference = (search.make_plan(cfg, batch, x, plan=strategy)
                              for x in (entries, ranks))
        decided = lambda p: (p.fits, p.strategy, p.step_time, p.tokens_per_sec, p.mfu,
                             p.init_device, p.candidates, p.dtype, p.dtype_steps, p.needs)
        assert decided(grouped) == decided(reference), gpus
        # each rank's share, micro-batches and memory, as a multiset per kind of GPU
        per_rank = lambda p: sorted(
            (r['gpu'], p.share[i], p.caps[i], p.sizes[i], p.ac[i], p.dtypes[i],
             p.predicted[i]['total'], p.predicted[i]['host'])
            for i, r in enumerate(p.ranks) for _ in range(r['count']))
        assert per_rank(grouped) == per_rank(reference), gpus
    assert [decided(p)[:2] for p in (grouped, reference)] == [(False, 'fsdp+ac+offload')] * 2


def test_planning_does_not_grow_with_the_count_of_identical_ranks(monkeypatch):
    # An H100 and two A100s, once and 2**22 times over (12,582,912 GPUs), at the largest batch:
    # the same calls to the estimator and the clock, as many lines of table, and no more memory
    # (a list of one item per rank would be 100 MB; the 3 ranks' micro-batch lists are longer)
    cfg, _ = load('gpt_1p3b')
    calls = Counter()
    for module, name in ((search, 'estimate'), (timing, 'compute')):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, real=real, name=name, **k:
                            calls.update([name]) or real(*a, **k))
    seen = []
    for times in (1, 2**22):
        ranks = plan._cluster(f'{times}xH100-SXM,{2 * times}xA100-80GB', None, None)
        search.make_plan(cfg, knobs.MAX_BATCH, ranks, plan='ddp')  # (the model measured once)
        calls.clear()
        tracemalloc.start()
        p = search.make_plan(cfg, knobs.MAX_BATCH, ranks, plan='ddp')
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert p.fits and sum(x * r['count'] for x, r in zip(p.share, p.ranks)) == knobs.MAX_BATCH
        # (less the split's parts, each estimated once at its share and a line of the table: an
        # entry whose ranks' shares are one sequence apart is two parts, as the 2 A100s of
        # 4,032,388 and 4,032,387 are once over)
        calls['estimate'] -= len(p.share)
        seen.append((dict(calls), len(p.table().splitlines()) - len(p.share), peak))
    (calls_1, lines_1, peak_1), (calls_n, lines_n, peak_n) = seen
    assert calls_1 == calls_n and calls_1['estimate'] > 0 and calls_1['compute'] > 0
    assert lines_1 == lines_n and peak_n < peak_1 + 2**20, (peak_1, peak_n)


def test_plan_answers_any_count_of_gpus(capsys):
    # 2**24 H100s at the largest batch: a plan of one row, a torchrun line for all their nodes; a
    # GPU more, a billion, a count of 41 digits: one line naming the bound
    tiny = os.path.join(ROOT, 'configs', 'gpt_tiny.py')
    assert plan.main([tiny, '--gpus=16777216xH100-SXM', '--batch_size=16777216']) == 0
    out = capsys.readouterr().out
    assert [line.split()[:3] for line in out.splitlines() if ' pred ' in line] == \
        [['0-16777215', '0-2097151', 'H100-SXM']], out
    assert 'nodes 0-2097151: torchrun --nnodes=2097152 --node_rank=NODE --nproc_per_node=8 ' in out
    for count in ('16777217', '1000000000', '1' + '0' * 40):
        with pytest.raises(SystemExit) as e:
            plan.main([tiny, f'--gpus={count}xH100-SXM', '--batch_size=16777216'])
        out, err = capsys.readouterr()
        assert e.value.code == 2 and not out and err.count('\n') == 1, err
        assert 'at most 16,777,216 ranks' in err, err
