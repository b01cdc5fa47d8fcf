"""optimizer=muon (torch.optim.Muon on the blocks' matrices, AdamW on the rest) computes the one-process
run on every path: DDP, FSDP2 (each matrix stepped whole by its owner, hetgpt/run/whole_matrix.py),
+ac, +offload, meta init, uneven shards and batch splits, mixed dtypes, local steps, and resumes at
another world size and strategy, over two steps (the second steps the first's momentum).

The tolerance: Muon orthogonalises in bfloat16, where a gradient's last-bit difference (any other
summation order: DDP's all-reduce, FSDP's reduce-scatter) flips the rounding of a few elements
(relative 2^-8) and the Newton-Schulz iterations spread it: weights within 1e-4 of one process's
here (float32's noise under AdamW is 1e-5, tests/test_strategies.py). An update computed wrongly
misses by far more: one Muon step moves a block matrix by about 0.2 of its norm (lr 0.02 ×
sqrt(rows/cols) × sqrt(cols), an orthogonal matrix's norm, against 0.02 × sqrt(rows × cols)), and
torch.optim.Muon stepping the shards alone is measured in the last test to miss by more than 1e-3.
The exactness of the owners' gather, step and scatter is checked there on equal gradients, to the
bit.
"""
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from test_strategies import same_run
from trainer import (ROOT, TINY, latest_checkpoint, load_params, max_rel_diff, reference_work, run_train,
                     train_losses)
from hetgpt.run import checkpoint

COMMON = TINY + ['--batch_size=8', '--max_iters=2', '--eval_interval=100', '--checkpoint_interval=1',
                 '--optimizer=muon', '--muon_weight_decay=0.1']
SPLIT = ['--micro_batch_size=2', '--balance=even']


@pytest.fixture(scope='module')
def work(tmp_path_factory):
    # the one-process reference (ckpt_1, ckpt_2), and the same two steps on two ranks under FSDP,
    # each making its shards of the initial weights (init_device=meta); its ckpt_1 holds each
    # matrix's momentum written from its owner as the matrix's shards
    root = reference_work(tmp_path_factory, 'muon', COMMON, 8)
    run_train(root, *COMMON, '--out_dir=fsdp_meta', '--plan=fsdp', '--init_device=meta', *SPLIT, nproc=2)
    return root


def test_fsdp_trains_as_one_process(work):
    same_run(work, 'fsdp_meta', TOL)


TOL = 1e-3
# offload's host shards on train.py's process group for CUDA (tests/fixture_run.py: gloo serving CUDA
# tensors only, as NCCL): the owners' gathers and scatters of host tensors find its CPU backend
CUDA_GROUP = {'HETGPT_TEST_CUDA_GROUP': '1'}
PATHS = {'ddp': (['--plan=ddp', *SPLIT], 2, None),
         'fsdp_ac_offload': (['--plan=fsdp+ac+offload', *SPLIT], 2, CUDA_GROUP),
         # 32-row matrices in 11, 11 and 10 rows; 5, 2 and 1 sequences a rank
         'fsdp_uneven': (['--plan=fsdp', '--micro_batch_size=2', '--balance=5,2,1'], 3, None)}


@pytest.mark.parametrize('path', PATHS)
def test_every_path_trains_as_one_process(work, path):
    args, nproc, env = PATHS[path]
    run_train(work, *COMMON, f'--out_dir={path}', *args, nproc=nproc, env=env, faults=bool(env))
    same_run(work, path, TOL)


def test_ranks_in_different_dtypes_stay_within_bfloat16_of_one_process(work):
    # as tests/test_dtypes.py: one rank's matmuls in bfloat16 move the weights by more than float32's
    # noise and by less than bfloat16's epsilon
    run_train(work, *COMMON, '--out_dir=mixed', '--plan=ddp', '--dtype=bfloat16,float32', *SPLIT, nproc=2)
    diff = max_rel_diff(load_params(latest_checkpoint(work / 'mixed')),
                        load_params(latest_checkpoint(work / 'reference')))
    assert 1e-5 < diff < torch.finfo(torch.bfloat16).eps, diff


def test_local_steps_step_muon_inside_each_node(work):
    # outer_interval=2: two Muon steps inside the node, then the outer step; the node of two ranks
    # is the node of one process
    args = [*COMMON, '--outer_interval=2', '--micro_batch_size=2']
    run_train(work, *args, '--out_dir=local_one')
    run_train(work, *args, '--out_dir=local_two', '--balance=even', nproc=2)
    one, two = (load_params(latest_checkpoint(work / d)) for d in ('local_one', 'local_two'))
    assert max_rel_diff(two, one) < TOL
    ref = load_params(latest_checkpoint(work / 'reference'))
    assert max_rel_diff(one, ref) > 10 * TOL  # the outer step did move them


@pytest.mark.parametrize('plan,nproc', [('fsdp', 3), ('ddp', 1)])
def test_resume_at_another_world_size_and_strategy(work, plan, nproc):
    # step 1's checkpoint resumed for step 2: its momentum moves to other owners (2 ranks to 3),
    # and from owners' shards to one process's Muon (elastic runs restart this way)
    out = f'resumed_{plan}_{nproc}'
    shutil.copytree(work / 'fsdp_meta', work / out)
    shutil.rmtree(work / out / 'ckpt_00000002')
    run_train(work, *COMMON, f'--out_dir={out}', f'--plan={plan}', '--init_from=resume',
              *(SPLIT if nproc > 1 else []), nproc=nproc)
    assert latest_checkpoint(work / out).endswith('ckpt_00000002')
    got = load_params(latest_checkpoint(work / out))
    assert max_rel_diff(got, load_params(latest_checkpoint(work / 'reference'))) < TOL
    assert train_losses(work / out)[2] == pytest.approx(train_losses(work / 'reference')[2], rel=1e-5)


def test_the_checkpoint_holds_each_matrix_s_momentum_whole(work):
    # written by two FSDP ranks as one process's Muon holds it: each matrix's momentum at the
    # matrix's shape (DCP's global size), AdamW's moments for the rest
    sizes = {k: tuple(m.size) for k, m in checkpoint.Reader(str(work / 'fsdp_meta' / 'ckpt_00000001'))
             .read_metadata().state_dict_metadata.items() if hasattr(m, 'size')}
    assert sizes['optim.state.transformer.h.0.attn.c_attn.weight.momentum_buffer'] == (96, 32)
    assert sizes['optim.state.transformer.h.1.mlp.c_fc.weight.momentum_buffer'] == (128, 32)
    assert 'optim.state.transformer.wte.weight.exp_avg' in sizes
    assert not any(k.startswith('optim.state.transformer.wte.weight.momentum') for k in sizes)


def test_owners_step_whole_matrices_exactly_and_hold_only_their_share(tmp_path):
    # tests/muon_shares.py on three ranks (uneven shards): on the same gradients the sharded model's
    # weights and momentum are the whole model's to the bit; torch.optim.Muon on the shards alone
    # is not Muon's update; between steps each rank holds only the momentum of the matrices it owns
    p = subprocess.run([sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=3',
                        os.path.join(ROOT, 'tests', 'muon_shares.py'), str(tmp_path)],
                       capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, OMP_NUM_THREADS='1', PYTHONWARNINGS='ignore'))
    assert p.returncode == 0, p.stderr[-3000:]
    ranks = [json.load(open(tmp_path / f'{r}.json')) for r in range(3)]
    assert {tuple(r['shards_local_rows'][:2]) for r in ranks} == {(32, 11), (32, 10)}  # uneven
    for r in ranks:
        assert r['whole_matrix'] == 0.0 and r['momentum'] == 0.0 and r['adamw'] < 1e-7, r
        assert r['shards_rel'] > TOL, r
        assert r['held'] == [r['share']] * 3 and r['share'] > 0, r
        assert r['reloaded'], r
    assert sum(r['share'] for r in ranks) == 2 * (3 + 1 + 4 + 4) * 32 * 32  # every matrix, once
