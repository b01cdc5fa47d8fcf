"""
model.py on tiny random models, CPU, float32: generation with and without the KV cache, the HF
GPT-2 import, the parameter count, the init and the tied embeddings.
"""
import math

import pytest
import torch

from hetgpt.run.hf import from_hf
import model as model_module
from model import GPT, GPTConfig
from sample import generate


def tiny(**kw):
    # init_std well above GPT-2's 0.02 so that a random model's logits are far apart: greedy
    # decoding then can't flip on float rounding between the cached and uncached paths.
    args = dict(block_size=32, vocab_size=97, n_layer=2, n_head=2, n_embd=32, init_std=0.3)
    torch.manual_seed(0)
    return GPT(GPTConfig(**{**args, **kw})).eval()


@pytest.mark.parametrize('new_tokens', [20, 70])  # 5 + 20 fits in block_size 32; 5 + 70 slides past it
@pytest.mark.parametrize('bias', [True, False])
def test_kv_cache_greedy_same_tokens(new_tokens, bias):
    model = tiny(bias=bias)
    prompt = torch.randint(0, 97, (3, 5))
    with_cache = generate(model, prompt, new_tokens, temperature=0, use_cache=True)
    without = generate(model, prompt, new_tokens, temperature=0, use_cache=False)
    assert with_cache.shape == (3, 5 + new_tokens)
    assert torch.equal(with_cache, without)
    assert len(set(with_cache[0, 5:].tolist())) > 1  # not a model stuck on one token


def test_kv_cache_top_k_sampling_same_tokens():
    model = tiny()
    prompt = torch.randint(0, 97, (2, 4))
    out = []
    for use_cache in (True, False):
        torch.manual_seed(1234)
        out.append(generate(model, prompt, 60, temperature=1.0, top_k=10, use_cache=use_cache))
    assert torch.equal(out[0], out[1])


def test_kv_cache_logits_match_full_forward():
    # the cache's step-by-step logits are the full forward's logits at every position
    model = tiny()
    idx = torch.randint(0, 97, (2, 32))
    full, _ = model(idx)
    caches = model.new_caches(2)
    with torch.no_grad():
        steps = [model(idx[:, :7], caches=caches)[0]]  # a prompt of 7, then chunks of 1 and 3
        for t in range(7, 20):
            steps.append(model(idx[:, t:t + 1], caches=caches)[0])
        for t in range(20, 32, 3):
            steps.append(model(idx[:, t:t + 3], caches=caches)[0])
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


def test_on_token_sees_every_new_token():
    model = tiny()
    seen = []
    out = generate(model, torch.zeros(1, 3, dtype=torch.long), 10, temperature=0, on_token=seen.append)
    assert torch.equal(torch.cat(seen, dim=1), out[:, 3:])


def test_from_hf_logits_equal():
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    hf = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=64, vocab_size=101,
                                    bos_token_id=None, eos_token_id=None)).eval()
    ours = from_hf(hf).eval()
    assert ours.lm_head.weight is ours.transformer.wte.weight
    idx = torch.randint(0, 101, (2, 64))
    with torch.no_grad():
        theirs = hf(idx).logits
    torch.testing.assert_close(ours(idx)[0], theirs, atol=1e-5, rtol=0)


def count_params(c):
    # by hand, num_params()'s non-embedding count: everything but wpe (the tied wte does matmul work)
    C, b = c.n_embd, int(c.bias)
    ln = C * (1 + b)
    block = ln + (3 * C * C + b * 3 * C) + (C * C + b * C) + ln + (4 * C * C + b * 4 * C) + (4 * C * C + b * C)
    return c.vocab_size * C + c.n_layer * block + ln


@pytest.mark.parametrize('bias', [True, False])
def test_parameter_counts(bias):
    c = GPTConfig(block_size=128, vocab_size=50304, n_layer=4, n_head=4, n_embd=128, bias=bias)
    with torch.device('meta'):  # shapes only, no memory
        model = GPT(c)
    n = count_params(c)
    assert model.num_params() == n
    assert model.num_params(non_embedding=False) == n + 128 * 128
    if bias:
        assert model.num_params(non_embedding=False) == 7_248_640  # configs/gpt_tiny.py's comment


def test_gpt2_124m_param_count():
    with torch.device('meta'):
        model = GPT(GPTConfig(vocab_size=50257))
    assert model.num_params(non_embedding=False) == 124_439_808  # OpenAI's GPT-2 small
    assert model.num_params() == count_params(model.config)


def test_init_std_and_scaled_residual_projections():
    torch.manual_seed(0)
    c = GPTConfig(block_size=64, vocab_size=512, n_layer=8, n_head=8, n_embd=512, init_std=0.05)
    model = GPT(c)
    h = model.transformer.h[3]
    for p in (h.attn.c_attn.weight, h.mlp.c_fc.weight, model.transformer.wte.weight):
        assert abs(p.std().item() / 0.05 - 1) < 0.02
        assert abs(p.mean().item()) < 0.002
    for p in (h.attn.c_proj.weight, h.mlp.c_proj.weight):  # 0.05 / sqrt(2 * 8) = 0.0125
        assert abs(p.std().item() / (0.05 / math.sqrt(2 * 8)) - 1) < 0.02
    assert torch.all(h.attn.c_attn.bias == 0) and torch.all(h.ln_1.bias == 0)
    assert torch.all(h.ln_1.weight == 1) and torch.all(model.transformer.ln_f.weight == 1)


def test_tied_embeddings():
    model = tiny()
    assert model.lm_head.weight is model.transformer.wte.weight
    assert sum(p is model.lm_head.weight for p in model.parameters()) == 1  # the optimizer sees it once
    # a training step moves both, from the input side and the output side
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    idx = torch.randint(0, 97, (2, 16))
    before = model.lm_head.weight.detach().clone()
    model(idx, targets=idx)[1].backward()
    opt.step()
    assert model.lm_head.weight is model.transformer.wte.weight
    assert not torch.equal(before, model.transformer.wte.weight)
    # and a state_dict round trip keeps the tie
    other = tiny()
    torch.nn.init.zeros_(other.lm_head.weight)
    other.load_state_dict(model.state_dict())
    assert other.lm_head.weight is other.transformer.wte.weight
    assert torch.equal(other.transformer.wte.weight, model.transformer.wte.weight)


def reference_loss(x, weight, targets, reduction='sum'):
    # The textbook loss: the whole micro-batch's logits, in float32, through F.cross_entropy.
    logits = (x @ weight.t()).float()
    return torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1),
                                             ignore_index=-1, reduction=reduction)


# chunks and groups that do not divide the 3 × 50 tokens, one group of several chunks, one chunk
@pytest.mark.parametrize('rows,group', [(7, 7), (7, 28), (16, 64), (64, 1024), (1000, 1000)])
def test_chunked_loss_and_gradients_equal_full_logits(rows, group):
    torch.manual_seed(0)
    x0, w0 = torch.randn(3, 50, 16), torch.randn(97, 16)
    targets = torch.randint(0, 97, (3, 50))
    targets[1, ::3] = -1  # ignored positions add neither loss nor gradient
    results = []
    for fn in (reference_loss, lambda x, w, t: model_module.LMHeadLoss.apply(
            x, w, t, True, model_module.chunk_loss, (rows, group))):
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        loss = fn(x, w, targets)
        (2.5 * loss).backward()  # the upstream gradient scales both gradients
        results.append((loss.detach(), x.grad, w.grad))
    (ref_loss, ref_gx, ref_gw), (loss, gx, gw) = results
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-4)
    for a, b in ((gx, ref_gx), (gw, ref_gw)):  # float32 sums in another order: relative error of the whole
        assert (a - b).norm() / b.norm() < 1e-6
    assert gx[1, ::3].abs().max() == 0


def test_model_loss_mean_and_sum_match_reference():
    model = tiny()
    idx = torch.randint(0, 97, (2, 16))
    targets = idx.clone()
    targets[0, :5] = -1
    with torch.no_grad():
        x = model.transformer.ln_f(model.transformer.h[1](model.transformer.h[0](
            model.transformer.wte(idx) + model.transformer.wpe(torch.arange(16)))))
        for reduction in ('mean', 'sum'):
            ours = model(idx, targets=targets, reduction=reduction)[1]
            torch.testing.assert_close(ours, reference_loss(x, model.lm_head.weight, targets, reduction))


def test_chunked_loss_under_bf16_autocast_is_close_and_keeps_float32_gradients():
    torch.manual_seed(0)
    x0, w0 = torch.randn(2, 40, 32), torch.randn(300, 32) * 0.5
    targets = torch.randint(0, 300, (2, 40))
    out = []
    for fn in (reference_loss, lambda x, w, t: model_module.LMHeadLoss.apply(
            x, w, t, True, model_module.chunk_loss, model_module.LOSS_CHUNK['cpu'])):
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        with torch.autocast('cpu', dtype=torch.bfloat16):
            loss = fn(x, w, targets)
        loss.backward()
        out.append((loss.detach(), x.grad, w.grad))
    (ref_loss, ref_gx, ref_gw), (loss, gx, gw) = out
    assert gx.dtype == gw.dtype == torch.float32
    assert abs(loss - ref_loss) / ref_loss < 1e-3
    for a, b in ((gx, ref_gx), (gw, ref_gw)):
        assert (a - b).norm() / b.norm() < 2e-2  # bfloat16 matmuls on both sides, rounded differently
