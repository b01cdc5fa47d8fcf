"""
A research edit of model.py alone, and every path follows it. tests/modern_block.py turns GPT-2's
block into a modern one (RMSNorm named norm_*, rotary positions from a buffer, SwiGLU,
grouped-query attention with a new GPTConfig field n_kv_head, no biases) in a copy of the
repository; nothing else is edited. Against one process of that copy: the initial weights and
buffers made shard by shard (init_device=meta) under FSDP and CPU offload, the losses under DDP and
FSDP, resume, the KV cache; and the planner, the knob checks and the export on the new model.
"""
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

from modern_block import EDITS, angles, count
from trainer import (ROOT, TINY, edited_copy, latest_checkpoint, make_dataset, max_rel_diff,
                     one_error_line, run_train, saved_tensors, train_losses)

KV = TINY + ['--n_kv_head=1']  # (TINY's n_head=2: two query heads share one key/value head)
# lr ~0: a checkpoint after 3 steps holds the initial weights, bit for bit (tests/test_big_path.py)
FROZEN = KV + ['--batch_size=6', '--micro_batch_size=2', '--max_iters=3', '--eval_interval=100',
               '--learning_rate=1e-30', '--min_lr=1e-31', '--balance=even']
REAL = KV + ['--batch_size=8', '--max_iters=3', '--eval_interval=100']
TINY_CONFIG = os.path.join(ROOT, 'configs', 'gpt_tiny.py')


@pytest.fixture(scope='module')
def work(tmp_path_factory):
    # the edited copy in work/code, the data set, and the one-process runs of it
    work = tmp_path_factory.mktemp('modern')
    code = edited_copy(work / 'code', 'model.py', *EDITS[0], more=EDITS[1:])
    (code / 'tests').mkdir()
    shutil.copy(os.path.join(ROOT, 'tests', 'peak_step.py'), code / 'tests')
    make_dataset(work)
    run_train(work, *FROZEN, '--out_dir=frozen_one', '--plan=ddp', code=code)
    run_train(work, *REAL, '--out_dir=real_one', '--plan=ddp', '--micro_batch_size=8', code=code)
    return work


def test_the_copy_is_the_modern_model(work):
    # what the edit did to the weights: no positions, no biases, RMSNorm gains named norm_*, the
    # rotary table in every block, k and v at one head
    saved = saved_tensors(latest_checkpoint(work / 'frozen_one'))
    assert 'transformer.wpe.weight' not in saved and not any(k.endswith('bias') for k in saved)
    assert saved['transformer.h.0.norm_1.weight'].shape == (32,)
    assert saved['transformer.h.1.attn.rotary.angle'].shape == (32, 8)  # block_size × head size/2
    assert saved['transformer.h.0.attn.c_attn.weight'].shape == (32 + 2 * 16, 32)


@pytest.mark.parametrize('strategy,nproc', [('fsdp', 2), ('fsdp+offload', 3)])
def test_initial_weights_and_buffers_do_not_depend_on_placement(work, strategy, nproc):
    out = f"frozen_{strategy.replace('+', '_')}"
    run_train(work, *FROZEN, f'--out_dir={out}', f'--plan={strategy}', '--init_device=meta',
              nproc=nproc, code=work / 'code')
    one, got = (saved_tensors(latest_checkpoint(work / d)) for d in ('frozen_one', out))
    assert one.keys() == got.keys()
    assert [k for k in one if not torch.equal(one[k], got[k])] == []
    norms = [k for k in got if re.search(r'norm_\w+\.weight$', k)]
    assert len(norms) == 2 * 2 + 1 and all(torch.all(got[k] == 1) for k in norms)
    table = angles(block_size=32, n_embd=32, n_head=2)
    for layer in range(2):
        torch.testing.assert_close(got[f'transformer.h.{layer}.attn.rotary.angle'], table,
                                   rtol=2e-6, atol=0)
    l_one, l_got = train_losses(work / 'frozen_one'), train_losses(work / out)
    assert sorted(l_got) == [1, 2, 3]
    assert all(abs(l_one[k] - l_got[k]) <= 1e-6 * l_one[k] for k in l_one), (l_one, l_got)


@pytest.mark.parametrize('strategy', ['ddp', 'fsdp'])
def test_two_ranks_train_as_one_process(work, strategy):
    out = f'real_{strategy}'
    run_train(work, *REAL, f'--out_dir={out}', f'--plan={strategy}', '--micro_batch_size=2',
              '--balance=even', nproc=2, code=work / 'code')
    one, two = (saved_tensors(latest_checkpoint(work / d)) for d in ('real_one', out))
    assert max_rel_diff(two, one) < 1e-5
    l_one, l_two = train_losses(work / 'real_one'), train_losses(work / out)
    assert sorted(l_two) == [1, 2, 3]
    assert all(abs(l_one[k] - l_two[k]) <= 1e-5 * l_one[k] for k in l_one), (l_one, l_two)
    assert l_one[3] < l_one[1]  # (it learns)


def test_resume_is_exact(work):
    # 3 steps, then 3 more from the checkpoint (its buffers read back): the 6 straight steps'
    # weights and losses, bit for bit
    six = REAL[:-2] + ['--max_iters=6', '--eval_interval=100', '--plan=ddp']
    run_train(work, *six, '--out_dir=straight', code=work / 'code')
    shutil.copytree(work / 'real_one', work / 'resumed')
    run_train(work, *six, '--out_dir=resumed', '--init_from=resume', code=work / 'code')
    a, b = (saved_tensors(latest_checkpoint(work / d)) for d in ('straight', 'resumed'))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert train_losses(work / 'straight') == train_losses(work / 'resumed')


def edited_module(work):
    spec = importlib.util.spec_from_file_location('modern_model', work / 'code' / 'model.py')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize('new_tokens', [20, 70])  # 5 + 70 slides past block_size 32
def test_kv_cache_generation_equals_full_recomputation(work, new_tokens):
    from sample import generate
    modern = edited_module(work)
    torch.manual_seed(0)
    model = modern.GPT(modern.GPTConfig(block_size=32, vocab_size=97, n_layer=2, n_head=4,
                                        n_kv_head=2, n_embd=32, init_std=0.3)).eval()
    assert model.new_caches(3)[0]['k'].shape == (3, 2, 32, 8)  # n_kv_head keys per position
    prompt = torch.randint(0, 97, (3, 5))
    cached = generate(model, prompt, new_tokens, temperature=0, use_cache=True)
    full = generate(model, prompt, new_tokens, temperature=0, use_cache=False)
    assert torch.equal(cached, full) and len(set(cached[0, 5:].tolist())) > 1
    idx = torch.randint(0, 97, (2, 32))  # each step's logits are the full forward's
    caches = model.new_caches(2)
    with torch.no_grad():
        steps = [model(idx[:, :7], caches=caches)[0]] + [
            model(idx[:, t:t + 5], caches=caches)[0] for t in range(7, 32, 5)]
        torch.testing.assert_close(torch.cat(steps, dim=1), model(idx)[0], atol=1e-5, rtol=1e-5)


def run_code(work, *args):
    return subprocess.run([sys.executable, *args], cwd=work, capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, OMP_NUM_THREADS='1'))


@pytest.mark.parametrize('n_kv_head', [1, 4])
def test_plan_reads_the_new_field(work, n_kv_head):
    # plan.py of the copy takes --n_kv_head (a field of GPTConfig, no bound: its type is checked)
    # and plans the edited model: its parameters by hand, its peak against a real step's
    shape = dict(n_layer=4, n_head=4, n_embd=256, block_size=256, vocab_size=8192)
    p = run_code(work, 'code/plan.py', TINY_CONFIG, '--gpus=1xcpu',
                 '--host_mem=16', '--batch_size=8', f'--n_kv_head={n_kv_head}',
                 *[f'--{k}={v}' for k, v in shape.items()])
    assert p.returncode == 0, p.stdout + p.stderr
    n = int(re.search(r'([\d,]+) parameters', p.stdout)[1].replace(',', ''))
    assert n == count(n_kv_head=n_kv_head, **{k: v for k, v in shape.items() if k != 'block_size'})
    p = run_code(work, 'code/tests/peak_step.py', 'ddp', '8', 'as-is', f'n_kv_head={n_kv_head}')
    assert p.returncode == 0, p.stderr[-2000:]
    r = json.loads(p.stdout.splitlines()[-1])
    assert r['predicted'] == pytest.approx(r['measured'], rel=0.10), r


def test_the_new_field_is_checked_as_every_knob(work):
    for script, value, says in (('train.py', 'abc', 'expected int'),
                                ('plan.py', '1.5', 'expected int')):
        p = run_code(work, f'code/{script}', *([TINY_CONFIG] if script == 'plan.py' else []),
                     f'--n_kv_head={value}')
        assert says in one_error_line(p) and 'n_kv_head' in p.stderr, p.stderr


def test_export_says_the_model_is_not_gpt2(work):
    p = run_code(work, 'code/sample.py', '--out_dir=frozen_one', '--export_hf=hf_modern')
    lines = p.stderr.splitlines()  # (sample.py says which checkpoint it loaded first)
    assert p.returncode == 2 and len(lines) == 2 and lines[0].startswith('loaded '), p.stderr
    assert lines[1].startswith('error: ') and 'is another network' in lines[1], p.stderr
    assert not (work / 'hf_modern').exists()
