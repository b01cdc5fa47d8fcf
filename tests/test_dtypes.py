"""
Ranks computing in different dtypes (issue 27): under DDP each rank keeps float32 weights and
autocasts to its own dtype (dtype=auto: its fastest; or one per rank, as here on CPU), and
float16's loss scale is one for all ranks, so that the summed gradient is still the whole batch's.
A 1-process float32 run is the reference.
"""
import os
import re
import subprocess
import sys

import pytest
import torch

from trainer import (ROOT, TINY, latest_checkpoint, load_params, max_rel_diff, reference_work,
                     one_error_line, run_train, train_losses)

COMMON = TINY + ['--batch_size=8', '--max_iters=6', '--eval_interval=100']


@pytest.fixture(scope='module')
def work(tmp_path_factory):
    return reference_work(tmp_path_factory, 'dtypes', COMMON, 8)


@pytest.mark.parametrize('dtypes', ['bfloat16,float32', 'float16,float32'])
def test_ranks_in_different_dtypes_match_one_process_in_float32(work, dtypes):
    # Each matmul's inputs rounded to the 16-bit dtype (relative error up to eps/2, eps its
    # machine epsilon: bfloat16 2^-7, float16 2^-10), summed in float32: after 6 AdamW steps the
    # weights stay within eps of float32's (as one vector, relative), the losses, averages over
    # tokens, within eps/8; and they differ from it by more than float32's own summation-order
    # noise (1e-5, tests/test_strategies.py): the rank did compute in 16 bits.
    half = dtypes.split(',')[0]
    eps = torch.finfo(getattr(torch, half)).eps
    out = dtypes.replace(',', '_')
    p = run_train(work, *COMMON, f'--out_dir={out}', '--plan=ddp', '--micro_batch_size=2',
                  '--balance=even', f'--dtype={dtypes}', nproc=2)
    short = {'bfloat16': 'bf16', 'float16': 'fp16'}[half]
    assert re.search(rf'^ +0 +0 cpu +{short} ', p.stdout, re.M), p.stdout
    assert re.search(r'^ +1 +0 cpu +fp32 ', p.stdout, re.M), p.stdout
    assert 'dtype by rank' in p.stdout
    ref = load_params(latest_checkpoint(work / 'reference'))
    diff = max_rel_diff(load_params(latest_checkpoint(work / out)), ref)
    assert 1e-5 < diff < eps, diff
    want, got = train_losses(work / 'reference'), train_losses(work / out)
    assert want.keys() == got.keys() and len(got) == 6
    assert all(abs(got[k] - want[k]) <= eps / 8 * want[k] for k in want), (got, want)


def overflow_run(strategy, dtypes, out):
    # tests/overflow_run.py on two ranks: {(rank, iter): (dtype, skipped, scale, weights digest)}
    p = subprocess.run([sys.executable, '-m', 'torch.distributed.run', '--standalone',
                        '--nproc_per_node=2', os.path.join(ROOT, 'tests', 'overflow_run.py'),
                        strategy, dtypes, str(out)], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, OMP_NUM_THREADS='1', PYTHONWARNINGS='ignore'))
    assert p.returncode == 0, p.stderr[-3000:]
    text = (out / 'rank0').read_text() + (out / 'rank1').read_text()
    rows = re.findall(r'rank (\d) it (\d) dtype (\w+) skipped (\w+) scale ([\d.]+) weights (\S+)',
                      text)
    assert len(rows) == 6, text
    return {(int(r), int(i)): (d, s == 'True', float(scale), w)
            for r, i, d, s, scale, w in rows}


@pytest.mark.parametrize('strategy, dtypes', [('ddp', 'float16,float32'), ('fsdp', 'float16'),
                                              ('ddp', 'bfloat16,float32')])
def test_an_overflow_on_one_rank_skips_the_step_on_every_rank(strategy, dtypes, tmp_path):
    # Step 1 overflows on one rank only (DDP: rank 1's loss; FSDP: one element of rank 0's
    # gradient shard). Every rank skips it (weights as after step 0) and, when any rank computes
    # in float16, halves the one loss scale (GradScaler's 2^16 at the start, backoff 0.5);
    # the ranks' weights agree after every step.
    got = overflow_run(strategy, dtypes, tmp_path)
    given = dtypes.split(',') * (2 // len(dtypes.split(',')))
    scale = 2.0**16 if 'float16' in given else 1.0
    for it, skipped, scale_after in ((0, False, scale), (1, True, scale / 2 if scale > 1 else 1),
                                     (2, False, scale / 2 if scale > 1 else 1)):
        for rank in (0, 1):
            d, s, sc, _ = got[rank, it]
            assert (d, s, sc) == (given[rank], skipped, scale_after), (rank, it, got[rank, it])
        assert got[0, it][3] == got[1, it][3]
    assert got[0, 1][3] == got[0, 0][3] != got[0, 2][3]


def test_dtypes_per_rank_are_refused_where_they_cannot_run(work):
    # one dtype per rank: as many as there are ranks; under FSDP one dtype for all (it gathers
    # the weights in one dtype)
    p = run_train(work, *COMMON, '--out_dir=bad_count', '--dtype=bfloat16,float32', check=False)
    line = one_error_line(p)
    assert 'dtype=bfloat16,float32' in line and 'one per rank (1)' in line, line
    p = run_train(work, *COMMON, '--out_dir=bad_fsdp', '--dtype=bfloat16,float32', '--plan=fsdp',
                  '--balance=even', nproc=2, check=False)
    assert p.returncode != 0 and 'FSDP gathers the weights in one dtype' in p.stderr, p.stderr
    assert 'Traceback' not in ''.join(line for line in p.stderr.splitlines()
                                      if line.startswith('[rank'))
    for out in ('bad_count', 'bad_fsdp'):
        assert not (work / out / 'metrics.jsonl').exists()


def test_float16_s_loss_scale_is_saved_and_resumed(work):
    # A float16 run's checkpoint keeps its loss scale, and a resumed run starts from it rather
    # than searching again from 2^16 (each overflow a lost batch). A value there that is not a
    # positive finite float (hetgpt.json is untrusted) resumes from the default start.
    import json
    import shutil
    common = COMMON + ['--dtype=float16', '--checkpoint_interval=3', '--plan=ddp']
    run_train(work, *common, '--out_dir=fp16', '--max_iters=3')
    meta = work / 'fp16' / 'ckpt_00000003' / 'hetgpt.json'
    saved = json.loads(meta.read_text())
    assert saved['loss_scale'] == 2.0**16  # (3 steps: no overflow, no growth before 2000)
    for written, expected in ((512.0, 512.0), ('x', 2.0**16), (-1.0, 2.0**16), (None, 2.0**16)):
        m = json.loads(meta.read_text())
        m['loss_scale'] = written
        meta.write_text(json.dumps(m))
        out = f'fp16_{written}'
        shutil.copytree(work / 'fp16', work / out)
        run_train(work, *common, f'--out_dir={out}', '--max_iters=6', '--init_from=resume')
        got = json.loads((work / out / 'ckpt_00000006' / 'hetgpt.json').read_text())
        assert got['loss_scale'] == expected, (written, got['loss_scale'])


def test_the_loss_scale_s_search_does_not_stop_a_float16_run(tmp_path):
    # max_bad_steps in a row stop a run; under float16's loss scale (2^16 at the start, halved at
    # each overflow) the 16 halvings down to 1 come first
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
    from hetgpt.run import optim
    for enabled, allowed in ((False, 3), (True, 3 + 16)):
        steps = optim.BadSteps('cpu', 3, str(tmp_path), ShardedGradScaler('cpu', enabled=enabled))
        said = []
        for _ in range(allowed - 1):
            steps.add(torch.tensor(True))
        steps.report(allowed - 1, allowed - 1, said.append)  # not stopped
        assert said and 'not finite' in said[0]
        steps.add(torch.tensor(True))
        with pytest.raises(SystemExit):
            steps.report(allowed, 1, said.append)
