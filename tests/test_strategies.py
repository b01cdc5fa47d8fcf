"""Every memory strategy and every split of the batch computes the same training run (float32, CPU)."""
import re

import pytest

from trainer import (TINY, latest_checkpoint, load_params, max_rel_diff, plan_rows, reference_work, run_train,
                     train_losses)

COMMON = TINY + ['--batch_size=8', '--max_iters=3', '--eval_interval=100']


@pytest.fixture(scope='module')
def work(tmp_path_factory):
    return reference_work(tmp_path_factory, 'strategies', COMMON, 8)


def same_run(work, out_dir, tol):
    ref, got = load_params(latest_checkpoint(work / 'reference')), load_params(latest_checkpoint(work / out_dir))
    assert max_rel_diff(got, ref) < tol
    l_ref, l_got = train_losses(work / 'reference'), train_losses(work / out_dir)
    assert l_ref.keys() == l_got.keys()
    assert all(abs(l_ref[k] - l_got[k]) <= tol * abs(l_ref[k]) for k in l_ref)


@pytest.mark.parametrize('strategy', ['ddp', 'ddp+ac', 'fsdp', 'fsdp+ac', 'fsdp+offload'])
def test_strategy_on_two_ranks_matches_one_process(work, strategy):
    out = 'two_' + strategy.replace('+', '_')
    run_train(work, *COMMON, f'--out_dir={out}', f'--plan={strategy}', '--micro_batch_size=2', '--balance=even',
              nproc=2)
    same_run(work, out, 1e-5)


@pytest.mark.parametrize('strategy', ['ddp', 'fsdp'])
@pytest.mark.parametrize('weights', ['5,2,1', '1,1,6'])
def test_uneven_split_on_three_ranks_matches_one_process(work, strategy, weights):
    # DDP: micro-batches of at most 2, so ranks run 3, 1, 1 (or 1, 1, 3) micro-batches; FSDP: all ranks
    # run the same number, of different sizes.
    out = f"split_{strategy}_{weights.replace(',', '')}"
    p = run_train(work, *COMMON, f'--out_dir={out}', f'--plan={strategy}', '--micro_batch_size=2',
                  f'--balance={weights}', nproc=3)
    assert f"shares [{weights.replace(',', ', ')}]" in p.stdout
    same_run(work, out, 1e-5)


def test_host_collectives_find_a_backend_on_the_cuda_process_group(work):
    # train.py's default group for CUDA, with gloo where NCCL would be and serving only CUDA tensors
    # as NCCL does: the host-side collectives (flags, counts, the peak FLOPS, the offloaded
    # gradients' norm under fsdp+offload) must find its CPU backend, and the run is the same run.
    run_train(work, *COMMON, '--out_dir=cuda_group', '--plan=fsdp+offload', '--micro_batch_size=2',
              '--balance=even', nproc=2, faults=True, env={'HETGPT_TEST_CUDA_GROUP': '1'})
    same_run(work, 'cuda_group', 1e-5)
    # the group of before (NCCL alone) has no backend for host tensors: the same run stops (here at
    # the first object collective, whose buffer goes to the CUDA device this host lacks; on a GPU
    # host at the first host tensor)
    p = run_train(work, *COMMON, '--out_dir=nccl_only', check=False, faults=True,
                  env={'HETGPT_TEST_CUDA_GROUP': 'nccl'})
    assert p.returncode != 0
    assert any(m in p.stderr for m in ('No backend type associated with device type cpu',
                                       'not compiled with CUDA', 'Found no NVIDIA driver'))  # CUDA build, no GPU


def test_checkpoint_from_fsdp_on_two_ranks_resumes_under_ddp_on_one(work):
    common = TINY + ['--batch_size=8', '--max_iters=6', '--eval_interval=100', '--checkpoint_interval=3']
    run_train(work, *common, '--out_dir=straight', '--plan=ddp')
    run_train(work, *common, '--out_dir=moved', '--plan=fsdp', '--max_iters=3', '--micro_batch_size=4',
              '--balance=even', nproc=2)
    run_train(work, *common, '--out_dir=moved', '--plan=ddp', '--init_from=resume')
    assert max_rel_diff(load_params(latest_checkpoint(work / 'moved')),
                        load_params(latest_checkpoint(work / 'straight'))) < 1e-5
    a, b = train_losses(work / 'straight'), train_losses(work / 'moved')
    assert a.keys() == b.keys() and all(abs(a[k] - b[k]) <= 1e-5 * a[k] for k in a)


@pytest.mark.parametrize('strategy', ['ddp', 'fsdp'])
def test_meta_init_materialises_each_rank_and_keeps_embeddings_tied(work, strategy):
    # init_device=meta: no rank ever holds a full CPU copy; each initialises what it keeps.
    import torch
    import torch.distributed.checkpoint as dcp
    out = f'meta_{strategy}'
    run_train(work, *TINY, '--batch_size=8', '--max_iters=20', '--eval_interval=100', '--log_interval=10',
              f'--out_dir={out}', f'--plan={strategy}', '--init_device=meta', '--balance=even', nproc=2)
    losses = train_losses(work / out)
    assert losses[20] < losses[10]
    sd = {'lm_head.weight': torch.zeros(256, 32), 'transformer.wte.weight': torch.ones(256, 32)}
    dcp.load({'model': sd}, checkpoint_id=latest_checkpoint(work / out))  # read into two separate tensors
    assert torch.equal(sd['lm_head.weight'], sd['transformer.wte.weight'])
    assert 0.01 < sd['lm_head.weight'].std() < 0.05  # initialised (std 0.02), not left empty


@pytest.mark.parametrize('strategy,micro_batch', [('ddp', 2), ('fsdp', 3)])
def test_the_split_in_the_plan_table_is_the_split_the_first_step_runs(work, strategy, micro_batch):
    # Rank 1 is made slower (0.05 s more per sequence in its forward): balance=auto measures both
    # ranks and gives rank 0 more. Under FSDP the fast rank waits for the slow one in every
    # all-gather; its time without those waits is what is fitted (micro-batches of at most 3:
    # even is 2 of 2 per rank, and the 2 micro-batches hold up to 6). What the table prints for
    # each rank (share, largest micro-batch × count) is what that rank reports having run in the
    # first step, and the run (a refit after step 2) is the one-process run.
    p = run_train(work, *COMMON, f'--out_dir=table_{strategy}', f'--plan={strategy}',
                  f'--micro_batch_size={micro_batch}', '--rebalance_interval=2',
                  '--balance=auto', nproc=2, faults=True,
                  env={'HETGPT_TEST_SLOW_RANK': '1:0.05'})
    table = {rank: row[:3] for rank, row in plan_rows(p.stdout).items()}
    first_step = p.stdout[p.stdout.index('iter 1: loss'):p.stdout.index('iter 2: loss')]
    ran = {int(m[1]): [int(x) for x in m[3].split('+')] for m in re.finditer(
        r'rank (\d+): (\d+) seq in ([\d+]+)', first_step)}
    assert sorted(table) == sorted(ran) == [0, 1], p.stdout
    assert table[0][0] > table[1][0], p.stdout  # the faster rank has the larger share
    for r in (0, 1):
        assert table[r] == (sum(ran[r]), max(ran[r]), len(ran[r])), p.stdout
    # (the refit every 2 steps runs: a move, if any, keeps the whole batch)
    for before, after in re.findall(r'rebalanced \[(.*?)\] -> \[(.*?)\]', p.stdout):
        assert sum(map(int, before.split(','))) == sum(map(int, after.split(','))) == 8
    same_run(work, f'table_{strategy}', 1e-5)
