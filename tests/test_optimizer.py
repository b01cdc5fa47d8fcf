"""
The optimizer contract (model.make_optimizer): a list of optimizers built from the config, each
param group's own lr scaled by the schedule; optimizer='muon' adds torch.optim.Muon for the blocks'
matrices (every path: tests/test_muon.py), and the planner counts each parameter's state.
"""
import pytest
import torch

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


def test_optimizer_muon_gives_the_blocks_matrices_to_muon():
    # Muon's lr, momentum and weight decay from the config, on the blocks' 2-D weights; AdamW as
    # before on the embeddings (the tied head) and on the gains
    import model
    net = model.GPT(model.GPTConfig(n_layer=2, n_head=2, n_embd=8, block_size=4, vocab_size=16))
    config = dict(learning_rate=1e-2, weight_decay=0.3, beta1=0.8, beta2=0.9, adam_eps=1e-6,
                  optimizer='muon', muon_lr=0.05, muon_momentum=0.9, muon_weight_decay=0.01)
    adamw, muon = model.make_optimizer(net, config)
    assert type(adamw) is torch.optim.AdamW and type(muon) is torch.optim.Muon
    (group,) = muon.param_groups
    assert (group['lr'], group['momentum'], group['weight_decay']) == (0.05, 0.9, 0.01)
    names = {id(p): n for n, p in net.named_parameters()}
    assert sorted(names[id(p)] for p in group['params']) == sorted(
        n for n, p in net.named_parameters() if '.h.' in n and p.dim() == 2)
    decayed = [names[id(p)] for p in adamw.param_groups[0]['params']]
    assert decayed == ['transformer.wte.weight', 'transformer.wpe.weight']
    assert sum(p.numel() for o in (adamw, muon) for g in o.param_groups for p in g['params']) == \
        sum(p.numel() for p in net.parameters())


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
