"""
The planner derives the optimizer (issue 50, item 3): switching train.py's knob optimizer from
adamw to muon (Muon for the blocks' matrices, AdamW for the rest) changes the predicted peak memory
and step time by what a formula written here by hand gives, under DDP and under FSDP2 (each matrix
stepped whole by its owner, hetgpt/owners.py). The planner measures the optimizer as built
(model.make_optimizer, from the knobs that costs.set_train_knobs gives): no constant of Muon's.
Where train.py does not have the knob, make_optimizer is replaced by one that reads it.
"""
import pytest
import torch

import model
from hetgpt.gpus import GPUS
from hetgpt.knobs import flags
from hetgpt.planner import costs, memory, timing

CFG = model.GPTConfig(n_layer=2, n_head=2, n_embd=64, block_size=32, vocab_size=512, bias=False)
# the blocks' matrices (rows, columns), by hand: c_attn 3C×C, attn.c_proj C×C, c_fc 4C×C,
# mlp.c_proj C×4C, in each of the 2 layers
MATRICES = [(192, 64), (64, 64), (256, 64), (64, 256)] * 2
# the rest: wte V×C, wpe block_size×C, five LayerNorm gains (two a block, ln_f)
REST = 512 * 64 + 32 * 64 + 5 * 64
GPU = 'H100-SXM'
RANKS = [dict(device='cuda', gpu=GPU, dtype='bfloat16', node=0, rank=0, count=2, nodes=1)]
ADAM, MOMENTUM = 8, 4  # bytes of state per element: two float32 moments; one momentum


def newton_schulz(rows, cols, steps=5):
    # torch.optim.Muon's _zeropower_via_newtonschulz (torch/optim/_muon.py) on X, m×n with m <= n
    # (it transposes a tall matrix), in bfloat16, per iteration: A = X Xᵀ (m×n @ n×m), B = bA + cA²
    # (m×m @ m×m), X = aX + BX (m×m @ m×n); ns_steps = 5. As (b, m, n, k) of m×k @ k×n.
    m, n = sorted((rows, cols))
    return [(1, m, m, n), (1, m, m, m), (1, m, n, m)] * steps


def flops(shapes):
    return sum(2 * b * m * n * k for b, m, n, k in shapes)


def seconds(shapes):
    return sum(timing.matmul_seconds(GPU, 'bfloat16', *s) for s in shapes)


def muon_for_the_knob(net, config, adamw=model.make_optimizer):
    # optimizer='muon': Muon for the blocks' matrices, AdamW for the rest (as the knob will)
    if config.get('optimizer', 'adamw') == 'adamw':
        return adamw(net, config)
    blocks = {p for n, p in net.named_parameters() if '.h.' in n and p.dim() == 2}
    return [torch.optim.Muon([p for p in net.parameters() if p in blocks], lr=0.02),
            torch.optim.AdamW([p for p in net.parameters() if p not in blocks], lr=1e-3)]


def the_knob():
    # model.make_optimizer where train.py has the knob, else one that reads it
    if 'optimizer' in costs.train_knobs():
        return model.make_optimizer
    return muon_for_the_knob


@pytest.fixture(scope='module')
def planned():
    # each optimizer's estimate (micro-batch 8 on 2 ranks) and step (16 sequences on 2 H100s),
    # under DDP and FSDP2, and its measured matmuls
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(model, 'make_optimizer', the_knob())
        try:
            for name in ('adamw', 'muon'):
                costs.set_train_knobs({'optimizer': name})
                for s in ('ddp', 'fsdp'):
                    out[name, s] = (memory.estimate(CFG, s, 8, 2),
                                    timing.step(CFG, 16, RANKS, flags(s), [8], [False], False)[0])
                out[name] = costs.optimizer_matmuls(CFG)
        finally:
            costs.set_train_knobs({})
    return out


def test_newton_schulz_is_counted_from_the_optimizer_as_built(planned):
    # AdamW's step has no matmul; Muon's, on each block matrix, those of Newton-Schulz
    assert sum(planned['adamw'], ()) == ((),) * 9
    block, root = planned['muon']
    got = [sorted(dict(items).items()) for items in block if items]
    counted = [sum(n * 2 * b * m * nn * k for (b, m, nn, k, _), n in items) for items in got]
    assert counted == [flops(newton_schulz(*s)) for s in MATRICES[:4]]
    assert root == ((), (), ())
    # FlopCounterMode on torch's own Muon step agrees: 5·(4m²n + 2m³)
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode
    with FakeTensorMode():
        p = torch.nn.Parameter(torch.empty(256, 64))
        p.grad = torch.zeros_like(p)
        opt = torch.optim.Muon([p])
        with FlopCounterMode(display=False) as counter:
            opt.step()
    assert counter.get_total_flops() == 5 * (4 * 64 * 64 * 256 + 2 * 64 ** 3)


def test_ddp_memory_and_step_follow_the_knob(planned):
    # Every rank keeps every matrix's state: 8 → 4 bytes an element of the matrices; every rank
    # runs every matrix's Newton-Schulz, and streams its state (read and write) through HBM
    matrices = sum(r * c for r, c in MATRICES)
    (adamw, t_adamw), (muon, t_muon) = planned['adamw', 'ddp'], planned['muon', 'ddp']
    assert adamw['optim'] - muon['optim'] == (ADAM - MOMENTUM) * matrices
    assert adamw['optim'] == ADAM * (matrices + REST)
    assert adamw['total'] - muon['total'] == (ADAM - MOMENTUM) * matrices  # (activations peak)
    hbm = GPUS[GPU]['hbm'] * 1e9 * timing.HBM_EFFICIENCY
    ns = sum(seconds(newton_schulz(*s)) for s in MATRICES)
    streamed = 2 * (muon['optim'] - adamw['optim']) / hbm
    assert t_muon - t_adamw == pytest.approx(ns + streamed, rel=1e-9)
    assert ns > 0


def test_fsdp_memory_and_step_follow_the_knob(planned):
    # FSDP2 on 2 ranks: AdamW keeps each rank's half of every state. Muon's matrices are stepped
    # whole by their owners: largest first, each to the rank owning fewer elements: rank 0 both
    # c_fc, rank 1 both mlp.c_proj, then one c_attn and one attn.c_proj each: half the matrices'
    # elements and half their Newton-Schulz (the same shapes: c_proj is c_fc transposed) each.
    matrices = sum(r * c for r, c in MATRICES)
    (adamw, t_adamw), (muon, t_muon) = planned['adamw', 'fsdp'], planned['muon', 'fsdp']
    assert adamw['optim'] == ADAM * (matrices + REST) // 2
    assert muon['optim'] == ADAM * REST // 2 + MOMENTUM * matrices // 2
    assert adamw['total'] - muon['total'] == adamw['optim'] - muon['optim']
    hbm = GPUS[GPU]['hbm'] * 1e9 * timing.HBM_EFFICIENCY
    ns = sum(seconds(newton_schulz(*s)) for s in MATRICES) / 2
    streamed = 2 * (muon['optim'] - adamw['optim']) / hbm
    # and each matrix's exchange, one at a time (hetgpt/run/whole_matrix.py): its weight's and
    # gradient's rows to the owner, the new weight's back, float32, half of each crossing the
    # owner's link on 2 ranks; three collectives
    link = timing.bandwidth(RANKS, None)
    exchange = 3 * 4 * matrices / 2 / link + 3 * len(MATRICES) * timing.COLLECTIVE_S
    assert t_muon - t_adamw == pytest.approx(ns + streamed + exchange, rel=1e-9)


def test_fsdp_step_holds_one_whole_matrix_at_a_time(monkeypatch):
    # The owner's step: the largest matrix's gathered gradient and new weight (float32, 8 bytes an
    # element) beside Muon's temporaries of it (measured), not a 1/N share of them
    monkeypatch.setattr(model, 'make_optimizer', the_knob())
    try:
        costs.set_train_knobs({'optimizer': 'muon'})
        big = model.GPTConfig(n_layer=2, n_head=4, n_embd=256, block_size=16, vocab_size=512,
                              bias=False)
        e = memory.estimate(big, 'fsdp', 1, 2, micro_batches=1)
        temporaries = costs.step_bytes_of(big) + 8 * 4 * 256 * 256
        states = e['params'] + e['grads'] + e['optim']
        assert e['total'] - e['other'] == states + temporaries
    finally:
        costs.set_train_knobs({})


def test_a_plan_is_made_for_its_own_knobs_not_for_an_earlier_plans(monkeypatch):
    # make_plan(knobs=None) plans for train.py's defaults (AdamW), whatever optimizer the plan
    # before it was made for (costs.set_train_knobs): a plan is a function of its arguments
    from hetgpt.planner import search
    monkeypatch.setattr(model, 'make_optimizer', the_knob())
    try:
        plans = [search.make_plan(CFG, 16, RANKS, plan=s, knobs=k)
                 for k in (None, {'optimizer': 'muon'}, None) for s in ('ddp', 'fsdp')]
    finally:
        costs.set_train_knobs({})
    adamw, muon, again = [[(p.step_time, p.predicted) for p in plans[i:i + 2]] for i in (0, 2, 4)]
    assert muon != adamw and again == adamw, (adamw, muon, again)
