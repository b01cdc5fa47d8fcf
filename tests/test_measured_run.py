"""Issue 49 item 3: plan.py --measured OUT_DIR plans from a run's own measured speed
(hetgpt/planner/measured.py). One fixture runs the same small model on 1 CPU rank, then on 2
(gloo, an even split), each as a user's plain command (the lone process on torch's default
threads, each of torchrun's ranks on one), each writing out_dir/measured.json at its log lines;
twice in turn, each kind's faster run kept (another job on a shared machine only slows one).
A 2-rank run's record makes plan.py predict that run's tokens/s within 10%, and the 1-rank run's
record predicts the 2-rank run's within 25% (a CPU's efficiency is per thread; gloo's collectives
take the cores: bench/RESULTS.md "plan.py --measured"). The measured tokens/s of a run: the
median of its log intervals after the first. A damaged or foreign out_dir is one line, exit 2,
before torch loads."""
import json
import os
import re

import pytest

from trainer import TINY, make_dataset, one_error_line, run_here, run_train
from hetgpt.planner import measured

# Large enough that compute, not Python or gloo's latency, is most of a step (~0.1 s on one
# core); 24 steps in 6 log intervals of 4: the first is warm-up, the median of 5
SHAPE = ['--n_layer=2', '--n_head=4', '--n_embd=128', '--block_size=64', '--vocab_size=256',
         '--batch_size=16']
RUN = TINY + SHAPE + ['--max_iters=24', '--log_interval=4', '--eval_interval=1000',
                      '--checkpoint_interval=0']
PLAN = ['configs/gpt_tiny.py', '--bias=False', '--dropout=0.0', '--dtype=float32', *SHAPE,
        '--gpus', '2xcpu', '--host_mem', '16', '--plan', 'ddp']


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
    # The 1-rank run, then the 2-rank run, twice in turn: one (and two) is the faster of its pair
    # (the other processes of a shared machine only slow a run), the slower in *_slower
    root = tmp_path_factory.mktemp('measured')
    make_dataset(root)
    for k in range(2):
        run_train(root, *RUN, f'--out_dir=one{k}', env=dict(OMP_NUM_THREADS=None))
        run_train(root, *RUN, f'--out_dir=two{k}', '--balance=even', nproc=2,
                  env=dict(OMP_NUM_THREADS=None))
    for name in ('one', 'two'):
        pair = sorted((root / f'{name}{k}' for k in range(2)),
                      key=lambda d: measured.tokens_per_sec(measured.read(str(d))))
        pair[0].rename(root / f'{name}_slower')
        pair[1].rename(root / name)
    return root


def predicted(monkeypatch, capfd, out_dir):
    # plan.py --measured out_dir, in this process: (its tokens/s, its measured line)
    p = run_here(monkeypatch, capfd, 'plan.py', *PLAN, '--measured', str(out_dir))
    assert p.returncode == 0, p.stdout + p.stderr
    said = re.search(r'^measured \(.*$', p.stdout, re.M)[0]
    tps = re.search(r'^predicted: step \S+ s, ([\d,]+) tokens/s', p.stdout, re.M)[1]
    return int(tps.replace(',', '')), said


def test_a_run_predicts_itself_within_10_percent(runs, monkeypatch, capfd):
    rec = measured.read(str(runs / 'two'))
    assert [r['kind'] for r in rec['ranks']] == ['cpu', 'cpu']
    assert all(x['compute_s'] for x in rec['intervals'])  # each rank's compute, timed
    assert rec['optimizer']['optimizer'] == 'adamw'  # (train.py's default, as the run had it)
    got, said = predicted(monkeypatch, capfd, runs / 'two')
    want = measured.tokens_per_sec(rec)
    assert abs(got / want - 1) < 0.10, (got, want)
    assert 'cpu at step efficiency' in said and 'priors' not in said, said


def test_one_rank_predicts_two_within_25_percent(runs, monkeypatch, capfd):
    one, two = (measured.read(str(runs / d)) for d in ('one', 'two'))
    # the lone process on its cores' threads (plan.py's assumption), each of torchrun's 2 ranks
    # on one
    assert one['ranks'][0]['threads'] == len(os.sched_getaffinity(0))
    assert [r['threads'] for r in two['ranks']] == [1, 1]
    got, said = predicted(monkeypatch, capfd, runs / 'one')
    want = measured.tokens_per_sec(two)
    assert abs(got / want - 1) < 0.25, (got, want)
    assert 'cpu at step efficiency' in said, said


def test_kinds_the_run_had_are_measured_and_the_others_priors(runs, monkeypatch, capfd):
    plan = [a if a != '2xcpu' else '2xcpu,1xH100-SXM' for a in PLAN]
    p = run_here(monkeypatch, capfd, 'plan.py', *plan, '--measured', str(runs / 'one'))
    said = re.search(r'^measured \(.*$', p.stdout, re.M)[0]
    assert re.search(r'cpu at step efficiency [\d.]+.*; priors: H100-SXM$', said), said


# -----------------------------------------------------------------------------
# Damaged and foreign records
GOOD = {'format': measured.FORMAT,
        'model': dict(block_size=64, vocab_size=256, n_layer=2, n_head=4, n_embd=128,
                      dropout=0.0, bias=False, init_std=0.02),
        'batch_size': 16, 'block_size': 64, 'strategy': 'ddp', 'accumulate': True,
        'optimizer': dict(optimizer='adamw', muon_lr=0.02, muon_momentum=0.95,
                          muon_weight_decay=0.0),
        'ranks': [dict(kind='cpu', dtype='float32', ac=False, node=0, threads=2)] * 2,
        'intervals': [dict(iter=4 * i, tokens_per_sec=9000.0 + i, sizes=[[8], [8]],
                           compute_s=[0.05, 0.06]) for i in range(1, 6)]}


def edit(path, value):
    # GOOD with the item at path (a tuple of keys) set to value, or removed (value DROP)
    rec = json.loads(json.dumps(GOOD))
    *above, key = path
    inner = rec
    for k in above:
        inner = inner[k]
    if value is DROP:
        del inner[key]
    else:
        inner[key] = value
    return json.dumps(rec)


DROP = object()
GOOD_TEXT = json.dumps(GOOD)
DAMAGES = {  # case -> (measured.json's text, or None: none; what the line names)
    'no record (an out_dir of something else)': (None, 'has no measured.json'),
    'empty': ('', 'cannot be read'),
    'truncated': (GOOD_TEXT[:len(GOOD_TEXT) // 2], 'cannot be read'),
    'garbage': ('\x00\x7f\ufffd garbage', 'cannot be read'),
    'nested past the parser': ('[' * 100_000, 'cannot be read'),
    'NaN tokens/s': (edit(('intervals', 1, 'tokens_per_sec'), float('nan')),
                     'cannot be read'),
    'Infinity compute': (edit(('intervals', 2, 'compute_s'), [float('inf'), 1.0]),
                         'cannot be read'),
    'not an object': ('[1, 2]', 'not a record of this hetgpt'),
    'another format (foreign)': (edit(('format',), 'other-tool/1'), 'not a record of this'),
    'another model.py (foreign)': (edit(('model', 'n_kv_head'), 1), "another model.py's run"),
    'no ranks': (edit(('ranks',), DROP), 'ranks are missing'),
    'no intervals': (edit(('intervals',), DROP), 'intervals are missing'),
    'a bool batch': (edit(('batch_size',), True), 'batch_size'),
    'unknown GPU': (edit(('ranks', 0), dict(kind='Z80', dtype='float32', ac=False, node=0,
                                            threads=1)),
                    "'Z80'"),
    'unknown dtype': (edit(('ranks', 1, 'dtype'), 'int8'), "'int8'"),
    'no threads': (edit(('ranks', 1, 'threads'), DROP), "threads None"),
    'threads a bool': (edit(('ranks', 0, 'threads'), True), "threads True"),
    'threads 0': (edit(('ranks', 0, 'threads'), 0), "threads 0"),
    'unknown strategy': (edit(('strategy',), 'zero3'), "'zero3'"),
    'no optimizer': (edit(('optimizer',), DROP), 'its optimizer is not'),
    'an optimizer knob missing': (edit(('optimizer', 'muon_lr'), DROP), 'its optimizer is not'),
    'unknown optimizer': (edit(('optimizer', 'optimizer'), 'lion'), "optimizer='lion'"),
    'muon_lr a string': (edit(('optimizer', 'muon_lr'), '0.02'), "muon_lr is '0.02'"),
    'muon_momentum 1': (edit(('optimizer', 'muon_momentum'), 1.0), 'muon_momentum=1.0'),
    'negative tokens/s': (edit(('intervals', 0, 'tokens_per_sec'), -5), 'tokens/s'),
    'split not the batch': (edit(('intervals', 3, 'sizes'), [[8], [9]]), 'sum to the batch'),
    'compute of one rank': (edit(('intervals', 3, 'compute_s'), [0.1]), 'compute seconds'),
    'too few intervals': (json.dumps(dict(GOOD, intervals=GOOD['intervals'][:3])),
                          'let the run log more'),
}


def test_the_good_record_is_usable():
    assert measured.fault(json.loads(GOOD_TEXT)) is None


@pytest.mark.parametrize('case', list(DAMAGES))
def test_a_damaged_or_foreign_out_dir_is_one_line(case, tmp_path, monkeypatch, capfd):
    text, names = DAMAGES[case]
    out = tmp_path / 'out'
    out.mkdir()
    (out / 'metrics.jsonl').write_text('{"iter": 0}\n')
    if text is not None:
        (out / 'measured.json').write_text(text)
    p = run_here(monkeypatch, capfd, 'plan.py', *PLAN, '--measured', str(out))
    line = one_error_line(p)
    assert '--measured' in line and names in line, line


def test_a_file_or_a_missing_folder_is_one_line(tmp_path, monkeypatch, capfd):
    (tmp_path / 'f').write_text(GOOD_TEXT)
    for where in (tmp_path / 'f', tmp_path / 'missing', ''):
        p = run_here(monkeypatch, capfd, 'plan.py', *PLAN, '--measured', str(where))
        assert 'not a directory' in one_error_line(p)


def test_help_says_it(monkeypatch, capfd):
    p = run_here(monkeypatch, capfd, 'plan.py', '--help')
    assert re.search(r'--measured OUT_DIR\s+a train\.py run', p.stdout), p.stdout


def test_kinds_are_relative_as_their_compute_and_together_fit_the_step():
    # A record of a CPU rank and an A100 (no run: the numbers are a record's): each kind's
    # efficiency is its predicted compute (at 1.0) over its measured, times one scale, at which
    # the planner predicts the record's measured step
    from hetgpt.knobs import flags
    from hetgpt.planner import timing
    from model import GPTConfig
    rec = json.loads(GOOD_TEXT)
    rec['ranks'][1] = dict(kind='A100-80GB', dtype='bfloat16', ac=False, node=0, threads=1)
    found, how = measured.calibrate(rec)
    cfg = GPTConfig(**rec['model'])
    ratio = []
    for r, meas in zip(rec['ranks'], (0.05, 0.06)):
        rank = dict(device='cpu' if r['kind'] == 'cpu' else 'cuda', gpu=r['kind'],
                    dtype=r['dtype'], node=0, efficiency=1.0, threads=r['threads'])
        c0, c1 = timing.compute(cfg, rank, False, False, 8)
        ratio.append((c0 + 8 * c1) / meas)
    assert found['A100-80GB'] / found['cpu'] == pytest.approx(ratio[1] / ratio[0], rel=1e-9)
    ranks = [dict(device=d, gpu=g, dtype=t, node=0, count=1, efficiency=found[g or 'cpu'],
                  threads=k)
             for d, g, t, k in (('cpu', None, 'float32', 2), ('cuda', 'A100-80GB', 'bfloat16', 1))]
    step = timing.step(cfg, 16, ranks, flags('ddp'), [8, 8], [False, False], True,
                       weights=[8, 8])[0]
    assert step == pytest.approx(16 * 64 / measured.tokens_per_sec(rec), rel=1e-6)
    assert how == 'the step fitted'


def test_the_fit_times_the_optimizer_the_run_had():
    # A Muon run's record: the planner's step, with Muon's optimizer step (its Newton-Schulz
    # matmuls) at the fitted efficiency, is the measured step; an AdamW record of the same speeds
    # fits another efficiency. The planner's own optimizer is as it was after each fit.
    from hetgpt.knobs import flags
    from hetgpt.planner import costs, timing
    from model import GPTConfig
    muon = json.loads(GOOD_TEXT)
    muon['optimizer']['optimizer'] = 'muon'
    before = dict(costs.GIVEN)
    found, _ = measured.calibrate(muon)
    assert costs.GIVEN == before
    adamw, _ = measured.calibrate(json.loads(GOOD_TEXT))
    assert found['cpu'] != adamw['cpu'], (found, adamw)
    cfg = GPTConfig(**muon['model'])
    ranks = [dict(device='cpu', gpu=None, dtype='float32', node=0, count=1, threads=2,
                  efficiency=found['cpu'])] * 2
    costs.set_train_knobs(muon['optimizer'])
    try:
        step = timing.step(cfg, 16, ranks, flags('ddp'), [8, 8], [False, False], True,
                           weights=[8, 8])[0]
    finally:
        costs.set_train_knobs(before)
    assert step == pytest.approx(16 * 64 / measured.tokens_per_sec(muon), rel=1e-6)
