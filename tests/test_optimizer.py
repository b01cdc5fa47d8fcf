"""
The optimizer contract (model.make_optimizer): a list of optimizers built from the config, each
param group's own lr scaled by the schedule. Swapping in torch.optim.Muon for the blocks' matrices
is one edit of model.py: it trains on one rank and on two (DDP, the same weights), and FSDP, which
would orthogonalise each rank's shard alone, is refused in one line.
"""
import os
import subprocess
import sys

import pytest
import torch

from trainer import (ROOT, TINY, edited_copy, make_dataset, max_rel_diff, one_error_line,
                     train_losses)
from hetgpt.run import checkpoint

ADAMW = """    return [adamw([{'params': decay, 'weight_decay': config['weight_decay']},
                   {'params': other, 'weight_decay': 0.0}], config)]"""
# the edit: the blocks' matrices to Muon, the embeddings and the rest to AdamW as before
MUON = """    blocks = {p for n, p in model.named_parameters() if '.h.' in n and p.dim() == 2}
    return [torch.optim.Muon([p for p in decay if p in blocks], lr=config['learning_rate'],
                             weight_decay=config['weight_decay']),
            adamw([{'params': [p for p in decay if p not in blocks],
                    'weight_decay': config['weight_decay']},
                   {'params': other, 'weight_decay': 0.0}], config)]"""
ARGS = TINY + ['--batch_size=8', '--max_iters=8', '--eval_interval=100', '--plan=auto']


def run(code, cwd, *args, nproc=1):
    launcher = [sys.executable]
    if nproc > 1:
        launcher += ['-m', 'torch.distributed.run', '--standalone', f'--nproc_per_node={nproc}']
    return subprocess.run(launcher + [str(code / 'train.py'), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, OMP_NUM_THREADS='1', PYTHONWARNINGS='ignore'))


@pytest.fixture(scope='module')
def muon(tmp_path_factory):
    work = tmp_path_factory.mktemp('muon')
    code = edited_copy(work / 'code', 'model.py', ADAMW, MUON)
    make_dataset(work)
    runs = {n: run(code, work, *ARGS, f'--out_dir=out{n}', nproc=n) for n in (1, 2)}
    return work, code, runs


def test_muon_is_one_edit_and_trains_on_one_rank_and_two(muon):
    work, code, runs = muon
    for n, p in runs.items():
        assert p.returncode == 0, (n, p.stdout[-2000:], p.stderr[-3000:])
        assert 'candidates: ddp' in p.stdout and 'fsdp' not in p.stdout.split('candidates:')[1]
        losses = train_losses(work / f'out{n}')
        assert losses[8] < losses[1] - 0.3, losses  # it learns
    # The checkpoint holds each optimizer's state: Muon's momentum for the blocks' matrices,
    # AdamW's moments for the rest
    sys.path.insert(0, str(code))
    try:
        import importlib
        edited = importlib.util.spec_from_file_location('edited_model', code / 'model.py')
        module = importlib.util.module_from_spec(edited)
        edited.loader.exec_module(module)
    finally:
        sys.path.remove(str(code))
    from torch.distributed.checkpoint.state_dict import get_state_dict
    model = module.GPT(module.GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=32,
                                        vocab_size=256, bias=False))
    config = dict(learning_rate=3e-3, weight_decay=0.1, beta1=0.9, beta2=0.95, adam_eps=1e-8)
    optimizers = module.make_optimizer(model, config)
    assert [type(o).__name__ for o in optimizers] == ['Muon', 'AdamW']
    _, state = get_state_dict(model, optimizers)
    checkpoint.read(str(work / 'out1' / 'ckpt_00000008'), {'optim': state})
    kinds = {name: set(s) for name, s in state['state'].items()}
    assert kinds['transformer.h.0.attn.c_attn.weight'] == {'momentum_buffer'}
    assert {'exp_avg', 'exp_avg_sq'} <= kinds['transformer.wte.weight']
    assert {'exp_avg', 'exp_avg_sq'} <= kinds['transformer.h.0.ln_1.weight']
    # Two ranks under DDP: the gradient of the whole batch, so the weights of one rank. Muon
    # orthogonalises in bfloat16: a summation-order difference in a gradient can flip a rounding
    # (relative 2**-8) in a few elements' updates, of lr 3e-3 against weights of ~0.02-1.
    one = checkpoint.load_model(str(work / 'out1' / 'ckpt_00000008'), trim_vocab=False).state_dict()
    two = checkpoint.load_model(str(work / 'out2' / 'ckpt_00000008'), trim_vocab=False).state_dict()
    assert max_rel_diff(two, one) < 1e-3


def test_muon_under_fsdp_is_refused_in_one_line(muon):
    # FSDP would orthogonalise each rank's rows alone: not Muon's update of the matrix
    work, code, _ = muon
    p = run(code, work, *ARGS, '--out_dir=out_fsdp', '--plan=fsdp')
    assert p.returncode == 2
    assert 'plan=fsdp' in one_error_line(p) and 'use plan=ddp' in one_error_line(p)
    assert not (work / 'out_fsdp' / 'ckpt_00000008').exists()
    p = subprocess.run([sys.executable, str(code / 'plan.py'), os.path.join(ROOT, 'configs',
                        'gpt_tiny.py'), '--gpus', '2xcpu', '--host_mem', '16', '--plan', 'fsdp'],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and 'use plan=ddp' in one_error_line(p)


def test_make_optimizer_takes_the_config():
    # The learning rate, betas, eps and weight decay come from the config as given
    import model
    net = model.GPT(model.GPTConfig(n_layer=1, n_head=2, n_embd=8, block_size=4, vocab_size=16))
    config = dict(learning_rate=1e-2, weight_decay=0.3, beta1=0.8, beta2=0.9, adam_eps=1e-6)
    (opt,) = model.make_optimizer(net, config)
    assert [g['weight_decay'] for g in opt.param_groups] == [0.3, 0.0]
    assert all(g['lr'] == 1e-2 and g['betas'] == (0.8, 0.9) and g['eps'] == 1e-6
               for g in opt.param_groups)
    decayed = {id(p) for p in opt.param_groups[0]['params']}
    assert decayed == {id(p) for p in net.parameters() if p.dim() == 2}
    assert sum(p.numel() for g in opt.param_groups for p in g['params']) == \
        sum(p.numel() for p in net.parameters())
    assert torch.optim.AdamW is type(opt)


@pytest.mark.parametrize('bias', [True, False])
def test_the_plan_counts_each_parameters_optimizer_state(monkeypatch, bias):
    # Muon keeps one momentum (4 bytes per element) for the blocks' matrices, AdamW two moments (8)
    # for the rest: the planner's optimizer state is that sum over the real model's parameters,
    # not a small model's average applied to all of them (with or without biases: a small model
    # of another structure would pair the wrong parameters)
    import model
    from hetgpt.planner import costs, memory

    def muon_and_adamw(net, config):  # as MUON's edit splits the parameters
        blocks = {p for n, p in net.named_parameters() if '.h.' in n and p.dim() == 2}
        return [torch.optim.Muon(list(blocks), lr=0.02),
                torch.optim.AdamW([p for p in net.parameters() if p not in blocks], lr=1e-3)]

    monkeypatch.setattr(model, 'make_optimizer', muon_and_adamw)
    costs.optimizer_state_bytes.cache_clear()
    try:
        cfg = model.GPTConfig(n_layer=6, n_head=4, n_embd=128, block_size=64, vocab_size=4096,
                              bias=bias)
        with torch.device('meta'):
            net = model.GPT(cfg)
        expected = sum((4 if '.h.' in n and p.dim() == 2 else 8) * p.numel()
                       for n, p in net.named_parameters())
        assert memory.estimate(cfg, 'ddp', 1, 1)['optim'] == expected
    finally:
        costs.optimizer_state_bytes.cache_clear()


def test_the_plan_counts_the_optimizer_step_s_temporaries(monkeypatch):
    # Fused AdamW (make_optimizer's) updates in place: its step needs nothing beside the states.
    # Muon orthogonalises each matrix's update in bfloat16 (Newton-Schulz): its step holds at
    # least the float32 update of the largest block matrix and its bfloat16 copy, and at most a
    # few of each with the k × k products (k its shorter side). Under DDP, one micro-batch whose
    # activations are smaller than the gradients, the step is the peak: the states and that.
    import model
    from hetgpt.planner import costs, memory
    cfg = model.GPTConfig(n_layer=4, n_head=8, n_embd=512, block_size=64, vocab_size=4096)
    costs.step_bytes.cache_clear()
    assert costs.step_bytes_of(cfg) == 0

    def muon_and_adamw(net, config):  # as MUON's edit splits the parameters
        blocks = {p for n, p in net.named_parameters() if '.h.' in n and p.dim() == 2}
        return [torch.optim.Muon(list(blocks), lr=0.02),
                torch.optim.AdamW([p for p in net.parameters() if p not in blocks], lr=1e-3)]

    costs.step_bytes.cache_clear()
    costs.optimizer_state_bytes.cache_clear()
    try:
        # foreach AdamW (make_optimizer's fallback) takes the square root of every second moment
        # at once: 4 bytes per parameter
        monkeypatch.setattr(model, 'make_optimizer', lambda net, config: [
            torch.optim.AdamW(net.parameters(), lr=1e-3, foreach=True)])
        with torch.device('meta'):
            P = sum(p.numel() for p in model.GPT(cfg).parameters())
        assert costs.step_bytes_of(cfg) == 4 * P
        monkeypatch.setattr(model, 'make_optimizer', muon_and_adamw)
        costs.step_bytes.cache_clear()
        m, k = 4 * cfg.n_embd, cfg.n_embd  # the MLP's matrices: 2048 × 512
        temporaries = costs.step_bytes_of(cfg)
        assert (4 + 2) * m * k <= temporaries <= 4 * (4 + 2) * m * k + 4 * 2 * k * k, temporaries
        e = memory.estimate(cfg, 'ddp', 1, 1, micro_batches=1)
        states = e['params'] + e['grads'] + e['optim']
        assert e['activations'] < e['grads']
        assert e['total'] - e['other'] == states + temporaries
    finally:
        costs.step_bytes.cache_clear()
        costs.optimizer_state_bytes.cache_clear()
