"""Local steps (outer_interval, hetgpt/run/local_steps.py) on two machines (torchrun agents on loopback): the
weights and losses of the formula, computed here in plain PyTorch (each node's AdamW steps on its part
of every batch, DiLoCo's outer step as torch.optim.SGD's Nesterov runs it); a resume in the middle of a
round; what is refused; and plan.py's prediction of both modes."""
import copy
import os
import re
import shutil

import pytest

from nodes import loopback, ok
from trainer import (ROOT, TINY, latest_checkpoint, load_params, make_dataset, max_rel_diff, metrics,
                     one_error_line, run_train, train_defaults, train_losses)

# 2 machines; rounds end at steps 3 and 5 (the end); checkpoints at 4 (in a round) and 5
COMMON = TINY + ['--batch_size=8', '--max_iters=5', '--eval_interval=100', '--decay_lr=False',
                 '--checkpoint_interval=4', '--outer_interval=3']
SHARES = [6, 2]  # the nodes' sequences of each step (balance 3:1)


@pytest.fixture(scope='module')
def work(tmp_path_factory):
    # 2 machines of 2 ranks each: DDP inside each, the outer step across
    root = tmp_path_factory.mktemp('outer')
    make_dataset(root)
    out = ok(loopback(root, [*COMMON, '--out_dir=local', '--balance=3,3,1,1'], nproc=2))
    assert 'shares [3, 3, 1, 1]' in out, out
    return root


def reference(root, steps, interval, shares, outer_lr=0.7, momentum=0.9):
    # Each node: the model from the same initial weights, AdamW (model.make_optimizer), its part of
    # step k's batch (the batch of step k: the seed's, corpus.Batches), the gradient of its tokens'
    # mean loss, clipped at 1. Every interval steps and at the end: the anchor's gradient is the
    # nodes' anchor - weights, weighted by their part; torch.optim.SGD(nesterov) steps it, and every
    # node takes it. Returns node 0's weights and the logged loss of each step (the whole batch's).
    import torch
    from hetgpt.data.corpus import Batches
    from model import GPT, GPTConfig, make_optimizer
    cwd = os.getcwd()
    os.chdir(root)
    try:
        data = Batches('synth', 32, 256, 1337, 'cpu')
    finally:
        os.chdir(cwd)
    config = dict(train_defaults(), learning_rate=3e-3)
    with torch.device('meta'):
        first = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=256,
                              bias=False, dropout=0.0))
    first.materialise('cpu', 1337)
    models = [copy.deepcopy(first) for _ in shares]
    opts = [make_optimizer(m, config) for m in models]
    anchor = [p.detach().clone() for p in first.parameters()]
    outer = torch.optim.SGD(anchor, lr=outer_lr, momentum=momentum, nesterov=True)
    batch, losses = sum(shares), {}
    for k in range(steps):
        offsets, start, total = data.offsets('train', k, batch), 0, 0.0
        for m, opt, n in zip(models, opts, shares):
            x, y = data.get('train', offsets[start:start + n])
            start += n
            _, loss = m(x, y, reduction='sum')
            (loss / (n * 32)).backward()
            total += loss.item()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
            for o in opt:
                o.step()
                o.zero_grad(set_to_none=True)
        losses[k + 1] = total / (batch * 32)
        if (k + 1) % interval == 0 or k + 1 == steps:
            weights = [list(m.parameters()) for m in models]
            for i, a in enumerate(anchor):
                a.grad = sum(n / batch * (a - w[i].detach()) for w, n in zip(weights, shares))
            outer.step()
            with torch.no_grad():
                for w in weights:
                    for a, p in zip(anchor, w):
                        p.copy_(a)
    return models[0].state_dict(), losses


def test_local_steps_are_the_formula(work):
    # 2 machines × 2 ranks, shares 3,3 | 1,1: each node's DDP sums its two ranks' gradients, the
    # exchange sends each half of the weights across on its own rank pair and gathers the halves
    want, losses = reference(work, 5, 3, SHARES)
    got = load_params(latest_checkpoint(work / 'local'))
    assert max_rel_diff(got, want) < 1e-5
    logged = train_losses(work / 'local')
    assert logged.keys() == losses.keys()
    assert all(abs(logged[k] - losses[k]) < 1e-5 * losses[k] for k in losses), (logged, losses)
    # the same steps without the outer step are another run: the test would see a missing one
    plain, _ = reference(work, 5, 10**9, SHARES)
    assert max_rel_diff(plain, want) > 1e-3


def test_a_resume_in_a_round_continues_it(work):
    # ckpt 4 is in the second round (3 to 5): each node's weights and AdamW state, and the outer
    # state. Resumed by 2 machines of 1 rank each (their node's DDP now one rank), the same run.
    from hetgpt.run import checkpoint
    saved = {k.split('.')[0] for k in checkpoint.Reader(str(work / 'local' / 'ckpt_00000004'))
             .read_metadata().state_dict_metadata}
    assert saved == {'model', 'optim', 'model@node1', 'optim@node1', 'outer'}, saved
    os.makedirs(work / 'resumed')
    shutil.copytree(work / 'local' / 'ckpt_00000004', work / 'resumed' / 'ckpt_00000004')
    out = ok(loopback(work, [*COMMON, '--out_dir=resumed', '--balance=3,1', '--init_from=resume']))
    assert 'at iter 4' in out, out
    got = load_params(latest_checkpoint(work / 'resumed'))
    assert max_rel_diff(got, load_params(latest_checkpoint(work / 'local'))) < 1e-5
    a, b = train_losses(work / 'resumed'), train_losses(work / 'local')
    assert abs(a[5] - b[5]) < 1e-5 * b[5], (a, b)


def test_local_steps_refuse_a_sharded_plan(tmp_path):
    make_dataset(tmp_path)
    p = run_train(tmp_path, *COMMON, '--out_dir=out', '--plan=fsdp', check=False)
    line = one_error_line(p)
    assert 'outer_interval=3' in line and 'plan ddp or ddp+ac' in line, line
    assert not os.path.exists(tmp_path / 'out' / 'metrics.jsonl')


def test_plan_auto_gives_local_steps_a_whole_model(tmp_path):
    # plan=auto with local steps on two ranks of one machine, where every step's plan shards the
    # model (6.4M parameters on two CPU ranks: fsdp-noreshard, faster by the planner's timing, as
    # train.py would plan them: its optimizer step halved; at 0.8M DDP is faster): local steps
    # train a whole one. (Where only a sharded plan fits, the one line says outer_interval=0
    # does: test_plan.py's LOCAL_PLANS.)
    from hetgpt import hardware
    from hetgpt.planner import search
    from model import GPTConfig
    shape = dict(n_layer=2, n_head=2, n_embd=512, block_size=32, vocab_size=256)
    ranks = [hardware.this_rank('cpu', r, 2) for r in range(2)]
    every = search.make_plan(GPTConfig(**shape, bias=False, dropout=0.0), 8, ranks, dtype='float32')
    assert every.fits and every.shard, every.strategy  # (the case)
    make_dataset(tmp_path)
    run_train(tmp_path, *TINY, *[f'--{k}={v}' for k, v in shape.items()], '--batch_size=8',
              '--max_iters=2', '--eval_interval=100', '--outer_interval=2', '--out_dir=out', nproc=2)
    assert metrics(tmp_path / 'out')[0]['plan'] in ('ddp', 'ddp+ac')


def test_local_steps_split_the_batch_as_planned_not_as_timed(tmp_path):
    # balance=auto (the default) with local steps: each node's part of a step is what it trains on,
    # so a split by measured speed would make a run follow its timing. Two runs of two machines, in
    # the second rank 1's forward slower (tests/fixture_run.py): the same losses at every step.
    make_dataset(tmp_path)
    train, fixture = os.path.join(ROOT, 'train.py'), os.path.join(ROOT, 'tests', 'fixture_run.py')
    args = [*TINY, '--batch_size=8', '--max_iters=4', '--eval_interval=100', '--outer_interval=2']
    for out, env in (('plain', None), ('slow', {'HETGPT_TEST_SLOW_RANK': '1:0.02'})):
        ok(loopback(tmp_path, [train, *args, f'--out_dir={out}'], script=fixture, env=env))
    a, b = train_losses(tmp_path / 'plain'), train_losses(tmp_path / 'slow')
    assert len(a) == 4 and a == b, (a, b)


def test_plan_says_when_local_steps_are_faster(capsys):
    # gpt_tiny (7,248,640 parameters) on 2 CPU machines: at 100 Mbit/s every step's all-reduce of the
    # float32 gradients (2 × 1/2 × 4 bytes each way, a ring of 2) takes seconds; local steps carry
    # the weights once per round
    import plan
    from hetgpt.planner.timing import NIC_EFFICIENCY
    said = {}
    for gbit in (0.1, 1.0):
        assert plan.main(['configs/gpt_tiny.py', '--gpus', '2xcpu', '--host_mem', '16', '--nodes',
                          '2', '--link_gbit', str(gbit), '--plan', 'ddp']) == 0
        out = capsys.readouterr().out
        m = re.search(r'local steps, outer_interval=(\d+).*: step ([\d.]+) s \(a node alone '
                      r'([\d.]+) s \+ exchange ([\d.]+) s / \1\), ([\d.]+)× every step\'s '
                      r'tokens/s \(step ([\d.]+) s', out)
        assert m, out
        H, local, alone, exchange, gain, every = int(m[1]), *map(float, m.groups()[1:])
        assert abs(local - (alone + exchange / H)) < 0.01 * local
        assert abs(gain - every / local) < 0.01 * gain + 0.01
        link = 4 * 7_248_640 / (gbit * 1e9 / 8 * NIC_EFFICIENCY)  # the ring's bytes each way
        assert link < exchange < 1.25 * link, (exchange, link)
        assert link < every < alone + 1.25 * link, (every, alone, link)
        said[gbit] = gain, 'local steps are faster' in out
    # faster at both (DDP's last bucket, the embedding's 25.8 MB, is never hidden), by less the
    # faster the link; one machine alone says nothing
    assert said[0.1][0] > 3 and said[0.1][1], said
    assert 1 < said[1.0][0] < said[0.1][0] / 2 and said[1.0][1], said
    # a round of one step exchanges the weights every step: no faster, and plan.py says so
    assert plan.main(['configs/gpt_tiny.py', '--gpus', '2xcpu', '--host_mem', '16', '--nodes', '2',
                      '--link_gbit', '0.1', '--plan', 'ddp', '--outer_interval=1']) == 0
    out = capsys.readouterr().out
    assert 'local steps, outer_interval=1: ' in out and 'every step is as fast or faster' in out, out
    assert plan.main(['configs/gpt_tiny.py', '--gpus', '2xcpu', '--host_mem', '16']) == 0
    assert 'local steps' not in capsys.readouterr().out
