"""
A research edit of the optimizer in model.py alone, and every path follows it (issue 50, item 4),
as tests/test_modern_block.py checks a research edit of the block. tests/optimizer_edit.py rewrites
make_optimizer to SGD with momentum for every parameter in a copy of the repository; nothing else
is edited. Against one process of that copy: DDP, FSDP2, +AC, +offload, an uneven split, ranks in
mixed dtypes, a resume at another world size, and local steps (against the formula in plain
PyTorch with the copy's optimizer as the inner one); and the planner of the copy measures the
edit: 4 bytes of state an element (the momentum), and plan.py plans it. (Elastic membership is
not run here: it restarts the same code path as a resume.)
"""
import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest
import torch

from optimizer_edit import EDIT
from trainer import (ROOT, TINY, edited_copy, latest_checkpoint, load_params, make_dataset,
                     max_rel_diff, run_train, train_losses)

# SGD takes a larger rate than AdamW's 3e-3: 3 steps move the weights well past float32's noise
COMMON = TINY + ['--batch_size=8', '--max_iters=3', '--eval_interval=100',
                 '--learning_rate=0.3', '--min_lr=0.03']
TINY_CONFIG = os.path.join(ROOT, 'configs', 'gpt_tiny.py')


@pytest.fixture(scope='module')
def work(tmp_path_factory):
    # the edited copy in work/code, the data set, and the copy's one-process run (the reference)
    work = tmp_path_factory.mktemp('optimizer_edit')
    edited_copy(work / 'code', 'model.py', *EDIT)
    make_dataset(work)
    run_train(work, *COMMON, '--out_dir=reference', '--plan=ddp', '--micro_batch_size=8',
              code=work / 'code')
    return work


def same_run(work, out, tol=1e-5, ref='reference'):
    one, got = (load_params(latest_checkpoint(work / d)) for d in (ref, out))
    assert max_rel_diff(got, one) < tol
    l_one, l_got = train_losses(work / ref), train_losses(work / out)
    assert l_one.keys() == l_got.keys()
    assert all(abs(l_one[k] - l_got[k]) <= tol * l_one[k] for k in l_one), (l_one, l_got)


def test_the_copy_trains_with_its_own_optimizer(work):
    # the checkpoint holds SGD's momentum for every parameter, nothing of AdamW's; it learns
    from hetgpt.run import checkpoint
    entries = checkpoint.Reader(latest_checkpoint(work / 'reference')).read_metadata()
    kinds = {k.split('.')[-1] for k in entries.state_dict_metadata if k.startswith('optim.state.')}
    assert kinds == {'momentum_buffer'}, kinds
    losses = train_losses(work / 'reference')
    assert losses[3] < losses[1], losses


@pytest.mark.parametrize('strategy,nproc,balance', [
    ('fsdp', 2, 'even'), ('ddp', 2, 'even'), ('fsdp+ac', 2, 'even'), ('fsdp+offload', 2, 'even'),
    ('fsdp', 3, '5,2,1')])
def test_every_strategy_and_split_follows_the_edit(work, strategy, nproc, balance):
    out = f"{strategy.replace('+', '_')}_{nproc}_{balance.replace(',', '')}"
    run_train(work, *COMMON, f'--out_dir={out}', f'--plan={strategy}', '--micro_batch_size=2',
              f'--balance={balance}', nproc=nproc, code=work / 'code')
    same_run(work, out)


def test_ranks_in_mixed_dtypes_follow_the_edit(work):
    # rank 0 computes in bfloat16, rank 1 in float32 (tests/test_dtypes.py): within bfloat16's
    # rounding of the one-process float32 run, not float32's noise
    eps = torch.finfo(torch.bfloat16).eps
    p = run_train(work, *COMMON, '--out_dir=mixed', '--plan=ddp', '--micro_batch_size=2',
                  '--balance=even', '--dtype=bfloat16,float32', nproc=2, code=work / 'code')
    assert re.search(r'^ +0 +0 cpu +bf16 ', p.stdout, re.M), p.stdout
    one, got = (load_params(latest_checkpoint(work / d)) for d in ('reference', 'mixed'))
    assert 1e-6 < max_rel_diff(got, one) < eps
    want, l_got = train_losses(work / 'reference'), train_losses(work / 'mixed')
    assert all(abs(l_got[k] - want[k]) <= eps / 8 * want[k] for k in want), (l_got, want)


def test_a_resume_at_another_world_size_follows_the_edit(work):
    # 3 steps of FSDP on 2 ranks, then 3 more on one process from that checkpoint (the momentum
    # read back at another world size): the 6 straight steps of one process
    six = COMMON + ['--max_iters=6', '--checkpoint_interval=3']
    run_train(work, *six, '--out_dir=straight', '--plan=ddp', code=work / 'code')
    run_train(work, *six, '--out_dir=moved', '--plan=fsdp', '--max_iters=3',
              '--micro_batch_size=4', '--balance=even', nproc=2, code=work / 'code')
    run_train(work, *six, '--out_dir=moved', '--plan=ddp', '--init_from=resume',
              code=work / 'code')
    same_run(work, 'moved', ref='straight')


def test_local_steps_take_the_edit_as_their_inner_optimizer(work, monkeypatch):
    # 2 machines of one rank, shares 6 | 2, a round of 3 steps (tests/test_outer.py): the copy's
    # run is the formula with the copy's make_optimizer as each node's optimizer, not model.py's
    import model
    from nodes import loopback, ok
    from test_outer import COMMON as OUTER, SHARES, reference
    ok(loopback(work, [*OUTER, '--out_dir=local', '--balance=3,1'],
                script=str(work / 'code' / 'train.py')))
    got = load_params(latest_checkpoint(work / 'local'))
    adamw, _ = reference(work, 5, 3, SHARES)
    spec = importlib.util.spec_from_file_location('sgd_model', work / 'code' / 'model.py')
    edited = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(edited)
    monkeypatch.setattr(model, 'make_optimizer', edited.make_optimizer)
    want, losses = reference(work, 5, 3, SHARES)
    assert max_rel_diff(got, want) < 1e-5
    assert max_rel_diff(got, adamw) > 1e-3  # (model.py's AdamW would be another run)
    logged = train_losses(work / 'local')
    assert all(abs(logged[k] - losses[k]) < 1e-5 * losses[k] for k in losses), (logged, losses)


def run_code(work, *args):
    return subprocess.run([sys.executable, *args], cwd=work, capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, OMP_NUM_THREADS='1'))


MEASURE = """
import json, math, model
from hetgpt.planner import costs, memory
cfg = model.GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=256, bias=False)
with __import__('torch').device('meta'):
    shapes = [tuple(p.shape) for p in model.GPT(cfg).parameters()]
print(json.dumps(dict(
    per=sorted(set(sum(costs.optimizer_state_bytes(cfg), ()))),
    alone=not any(sum(costs.optimizer_whole(cfg), ())),
    ddp=memory.estimate(cfg, 'ddp', 1, 2)['optim'],
    fsdp=memory.estimate(cfg, 'fsdp', 1, 2)['optim'],
    elements=sum(math.prod(s) for s in shapes),
    shards=sum(math.ceil(s[0] / 2) * math.prod(s[1:]) for s in shapes))))
"""


def test_the_planner_of_the_copy_measures_the_edit(work):
    # SGD's momentum: 4 bytes an element (AdamW's 8 in model.py), each rank its shards' under
    # FSDP2 (an elementwise optimizer updates a shard as it updates the whole)
    p = run_code(work / 'code', '-c', MEASURE)
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.splitlines()[-1])
    assert got['per'] == [4] and got['alone'], got
    assert got['ddp'] == 4 * got['elements'] and got['fsdp'] == 4 * got['shards'], got
    p = run_code(work, 'code/plan.py', TINY_CONFIG, '--gpus=2xcpu', '--host_mem=16',
                 '--plan=fsdp')
    assert p.returncode == 0 and 'fsdp' in p.stdout, p.stdout + p.stderr
