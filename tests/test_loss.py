"""
The chunked loss (model.LMHeadLoss) takes its per-chunk formula from one plain function
(model.chunk_loss, passed to LMHeadLoss as its kernel) and that formula's gradient from autograd,
so another loss is that function edited. Here a z-loss and label smoothing are swapped in, and checked
against their textbook versions on the whole micro-batch's logits: loss, gradients of x and weight.
"""
import pytest
import torch
import torch.nn.functional as F

import model

Z, EPS = 1e-4, 0.1  # z-loss weight (PaLM's), label smoothing


def z_loss_chunk(logits, targets):  # what a researcher would write in model.chunk_loss
    logits = logits.float()
    z = logits.logsumexp(dim=-1) ** 2 * (targets != -1)
    return F.cross_entropy(logits, targets, ignore_index=-1, reduction='sum') + Z * z.sum()


def smoothed_chunk(logits, targets):
    return F.cross_entropy(logits.float(), targets, ignore_index=-1, reduction='sum',
                           label_smoothing=EPS)


def whole_logits(x, weight, targets):
    logits = (x @ weight.t()).float()
    targets = targets.reshape(-1)
    logits = logits.view(-1, logits.size(-1))[targets != -1]
    return logits, targets[targets != -1]


def z_loss_textbook(x, weight, targets):
    # cross-entropy of every kept token plus Z * log(Z)^2, Z the softmax's normaliser
    logits, targets = whole_logits(x, weight, targets)
    z = torch.logsumexp(logits, dim=-1) ** 2
    return F.cross_entropy(logits, targets, reduction='sum') + Z * z.sum()


def smoothed_textbook(x, weight, targets):
    # cross-entropy against (1 - EPS) * one-hot + EPS / vocab
    logits, targets = whole_logits(x, weight, targets)
    logp = torch.log_softmax(logits, dim=-1)
    picked = logp[torch.arange(len(targets)), targets]
    return -((1 - EPS) * picked + EPS * logp.mean(dim=-1)).sum()


def plain_textbook(x, weight, targets):
    logits, targets = whole_logits(x, weight, targets)
    return F.cross_entropy(logits, targets, reduction='sum')


def losses_and_grads(fn, x0, w0, targets, autocast):
    x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
    with torch.autocast('cpu', dtype=torch.bfloat16, enabled=autocast):
        loss = fn(x, w, targets)
    (2.5 * loss).backward()  # the upstream gradient scales both gradients
    return loss.detach(), x.grad, w.grad


# chunks and groups that do not divide the 3 × 50 tokens, one group of several chunks, one chunk
@pytest.mark.parametrize('rows,group', [(7, 7), (7, 28), (16, 64), (64, 1024), (1000, 1000)])
@pytest.mark.parametrize('autocast', [False, True], ids=['float32', 'bf16-autocast'])
@pytest.mark.parametrize('chunk,textbook', [(z_loss_chunk, z_loss_textbook),
                                            (smoothed_chunk, smoothed_textbook)],
                         ids=['z-loss', 'label-smoothing'])
def test_swapped_chunk_loss_matches_textbook(rows, group, autocast, chunk, textbook):
    torch.manual_seed(0)
    x0, w0 = torch.randn(3, 50, 16), torch.randn(97, 16)
    targets = torch.randint(0, 97, (3, 50))
    targets[1, ::3] = -1  # ignored positions add neither loss nor gradient
    chunked = lambda x, w, t: model.LMHeadLoss.apply(  # noqa: E731
        x, w, t, True, chunk, (rows, group))
    loss, gx, gw = losses_and_grads(chunked, x0, w0, targets, autocast)
    ref_loss, ref_gx, ref_gw = losses_and_grads(textbook, x0, w0, targets, autocast)
    assert gx.dtype == gw.dtype == torch.float32
    assert gx[1, ::3].abs().max() == 0
    if autocast:  # bfloat16 matmuls on both sides, rounded differently
        assert abs(loss - ref_loss) / ref_loss < 1e-3
        for a, b in ((gx, ref_gx), (gw, ref_gw)):
            assert (a - b).norm() / b.norm() < 2e-2
        return
    # the variant's own term is far above the tolerance: the swap did take effect
    plain = losses_and_grads(plain_textbook, x0, w0, targets, False)
    assert abs(ref_loss - plain[0]) / ref_loss > 1e-4
    assert (ref_gw - plain[2]).norm() / ref_gw.norm() > 1e-4
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-4)
    for a, b in ((gx, ref_gx), (gw, ref_gw)):  # float32 sums in another order
        assert (a - b).norm() / b.norm() < 1e-6


def test_loss_without_gradients_is_the_same_sum():
    # eval (need_grad False): the chunk's loss alone, no autograd graph, no gradient buffers
    torch.manual_seed(0)
    x, w = torch.randn(2, 40, 16), torch.randn(97, 16)
    targets = torch.randint(0, 97, (2, 40))
    targets[0, :7] = -1
    with torch.no_grad():
        loss = model.LMHeadLoss.apply(x, w, targets, False, model.chunk_loss, (64, 1024))
    torch.testing.assert_close(loss, plain_textbook(x, w, targets), rtol=1e-6, atol=1e-4)
