"""
GPT-2, in one file: what the network is, and nothing about where it runs.
Sharding, activation checkpointing, compilation and offload are applied from the outside
(plan.py / train.py); nothing here knows about ranks or devices.
References: OpenAI's GPT-2 (github.com/openai/gpt-2), HF transformers' modeling_gpt2.py,
nanoGPT's model.py (whose module names we keep, so HF weights map one to one: hf.py).
"""
import hashlib
import math
from dataclasses import dataclass, fields

import torch
import torch.nn as nn
from torch._subclasses.fake_tensor import is_fake
from torch.nn import functional as F


@dataclass
class GPTConfig:
    block_size: int = 1024   # longest sequence (learned position embeddings)
    vocab_size: int = 50304  # GPT-2's 50257 padded up to a multiple of 64 for faster matmuls
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True        # biases in Linears and LayerNorms, as GPT-2
    init_std: float = 0.02   # std of the normal init (gigaGPT's configs vary it)


class CausalSelfAttention(nn.Module):

    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)  # q, k, v
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head, self.n_embd, self.dropout = config.n_head, config.n_embd, config.dropout

    def forward(self, x, cache=None):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        mask, causal = None, True
        if cache is not None:  # generation: keys and values of earlier positions are kept
            pos = cache['pos']
            cache['k'][:, :, pos:pos + T], cache['v'][:, :, pos:pos + T] = k, v
            k, v = cache['k'][:, :, :pos + T], cache['v'][:, :, :pos + T]
            if pos > 0:  # the new queries see every cached key and the new keys up to their own
                causal = False
                mask = torch.ones(T, pos + T, dtype=torch.bool, device=x.device).tril(diagonal=pos)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                           dropout_p=self.dropout if self.training else 0.0)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # heads side by side again
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU(approximate='tanh')  # GPT-2's own GELU; HF calls it gelu_new
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x, cache=None):
        x = x + self.attn(self.ln_1(x), cache)
        return x + self.mlp(self.ln_2(x))


def chunk_loss(logits, targets):
    # The loss of one chunk of tokens, logits (rows, vocab) in the compute dtype: the sum of their
    # cross-entropies, in float32; targets -1 add nothing. Plain PyTorch: LMHeadLoss gets its
    # gradient from autograd, so another loss (z-loss, label smoothing) is an edit here only.
    return F.cross_entropy(logits.float(), targets, ignore_index=-1, reduction='sum')


class LMHeadLoss(torch.autograd.Function):
    # Sum of the token losses (chunk_loss) of x @ weight.T without the micro-batch's logits: one
    # group's logits at a time, each chunk of them replaced by its gradient (by autograd), giving
    # the group's share of the gradients of x and weight; backward only scales them.
    kernel = staticmethod(chunk_loss)  # train.py compiles it (forward and autograd's backward)

    @staticmethod
    def forward(ctx, x, weight, targets, need_grad):
        shape, x, targets = x.shape, x.reshape(-1, x.size(-1)), targets.reshape(-1)
        loss = torch.zeros((), device=x.device)
        grad_x = torch.empty_like(x) if need_grad else None
        grad_w = torch.zeros(weight.shape, device=x.device) if need_grad else None  # float32 sum
        ctx.shape, ctx.weight_dtype, dev = shape, weight.dtype, x.device.type
        if torch.is_autocast_enabled(dev):  # cast once here, not in each of the chunks' matmuls
            x, weight = (t.to(torch.get_autocast_dtype(dev)) for t in (x, weight))
        rows, group = LOSS_CHUNK.get(dev, (1024, 1024))
        assert group % rows == 0, f"LOSS_CHUNK[{dev!r}]: group {group} not whole chunks of {rows}"
        logits = x.new_empty(min(group, len(x)), len(weight))  # one group's at a time
        for g in range(0, len(x), group):
            group_logits = torch.mm(x[g:g + group], weight.t(), out=logits[:len(x) - g])
            for i in range(0, len(group_logits), rows):
                chunk = group_logits[i:i + rows].requires_grad_(need_grad)
                with torch.enable_grad():  # forward runs without autograd; the loss needs it
                    chunk_sum = LMHeadLoss.kernel(chunk, targets[g + i:g + i + rows])
                loss += chunk_sum
                if need_grad:  # the chunk's logits give way to their gradient
                    chunk.copy_(torch.autograd.grad(chunk_sum, chunk)[0])
            if need_grad:
                grad_x[g:g + group] = group_logits @ weight
                grad_w += group_logits.t() @ x[g:g + group]
        ctx.save_for_backward(grad_x, grad_w)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        grad_x, grad_w = ctx.saved_tensors
        grad_w = (grad_w * grad_loss).to(ctx.weight_dtype)
        return (grad_x * grad_loss).view(ctx.shape), grad_w, None, None


# (tokens per chunk, tokens per group of chunks), by device type. Per group the logits and the
# gradients of x and weight are a matmul each (the weight's float32 sum per 1024 tokens, not per
# 128, made the loss 1.5× faster at width 768); per chunk autograd's float32 buffers come and go,
# and on a CPU glibc reuses those of 64 tokens without growing its heap (128: up to 37% more peak
# RSS, bench/RESULTS.md). GPU: not yet measured.
LOSS_CHUNK = {'cpu': (64, 1024), 'cuda': (4096, 4096)}


class GPT(nn.Module):

    def __init__(self, config, seed=None):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # tied input and output embeddings
        self.init_weights(seed)

    def init_weights(self, seed=None, device=None):
        # GPT-2 init: normal(0, init_std) everywhere, zero biases, and the projections that add
        # into the residual stream scaled by 1/sqrt(2 * n_layer) (two per block); a function of
        # (seed, parameter name) alone, however the weights are placed (draw_normal_). seed None:
        # torch.manual_seed's; device: where the draws run (CUDA's numbers are not the CPU's).
        seed = torch.initial_seed() if seed is None else seed
        for name, p in self.named_parameters():
            if name.endswith('bias'):
                nn.init.zeros_(p)
            elif 'ln_' in name:
                nn.init.ones_(p)
            else:
                residual = name.endswith('c_proj.weight')
                std = self.config.init_std / math.sqrt(2 * self.config.n_layer if residual else 1)
                draw_normal_(p, std, f"{seed}/{name}", device)

    def materialise(self, device, seed, draw_on=None):
        # A model built on the meta device (or wrapped by FSDP there) gets storage on device, and
        # its initial weights (init_weights, the draws made on draw_on)
        self.to_empty(device=device)
        self.lm_head.weight = self.transformer.wte.weight  # to_empty unties them
        self.init_weights(seed, draw_on)

    def num_params(self, non_embedding=True):
        # non_embedding: without the position embeddings (they do no matmul work; the tied wte does)
        n = sum(p.numel() for p in self.parameters())
        return n - self.transformer.wpe.weight.numel() if non_embedding else n

    def forward(self, idx, targets=None, reduction='mean', caches=None, last_only=False):
        # idx, targets: (B, T) token ids; targets -1 are ignored. With reduction='sum' the loss is
        # the sum of token losses, which train.py divides by the tokens of the whole global batch.
        B, T = idx.size()
        start = caches[0]['pos'] if caches else 0
        assert start + T <= self.config.block_size, f"sequence of {start + T} > block_size"
        pos = torch.arange(start, start + T, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for i, block in enumerate(self.transformer.h):
            x = block(x, caches[i] if caches else None)
        if caches:
            for cache in caches:
                cache['pos'] += T
        x = self.transformer.ln_f(x)
        if targets is None:
            return self.lm_head(x[:, [-1]] if last_only else x), None
        # The loss without the (tokens × vocab) logits: see LMHeadLoss. No logits are returned.
        loss = LMHeadLoss.apply(x, self.lm_head.weight, targets, torch.is_grad_enabled())
        return None, loss if reduction == 'sum' else loss / (targets != -1).sum()


@torch.no_grad()
def draw_normal_(p, std, key, device=None):
    # p from normal(0, std) as a function of key alone: its rows in blocks of about 2^20 values,
    # each drawn (on device) by a generator seeded by (key, block). A DTensor (a rank's FSDP shard
    # of dim 0) draws only the blocks of its rows: any split of the rows gets the same numbers.
    if p.is_meta or is_fake(p) or not p.numel():  # (shapes only: meta, the planner's fake tensors)
        return
    local, first = p, 0
    if hasattr(p, 'to_local'):
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset as where
        local, first = p.to_local(), where(p.shape, p.device_mesh, p.placements)[1][0]
    rows, total = (local.view(len(local), -1), len(p)) if p.dim() else (local.view(1, 1), 1)
    per = max(1, 2**20 // rows.size(1))  # rows per block
    for b in range(first // per, (first + len(rows) - 1) // per + 1):
        seed = int.from_bytes(hashlib.blake2b(f"{key}/{b}".encode(), digest_size=8).digest(), 'big')
        gen = torch.Generator(device or local.device).manual_seed(seed >> 1)
        block = torch.empty(min(per, total - b * per), rows.size(1), device=gen.device)
        block.normal_(0, std, generator=gen)
        lo, hi = max(b * per, first), min((b + 1) * per, first + len(rows))
        rows[lo - first:hi - first].copy_(block[lo - b * per:hi - b * per])  # (to its device)


def make_optimizer(params, learning_rate=6e-4, weight_decay=0.1, betas=(0.9, 0.95), eps=1e-8):
    # AdamW, decaying the matmul weights and embeddings but not biases and LayerNorm gains. The
    # planner steps this once on a small model to learn its state bytes per parameter: another
    # optimizer here is planned right.
    params = list(params)
    groups = [{'params': [p for p in params if p.dim() >= 2], 'weight_decay': weight_decay},
              {'params': [p for p in params if p.dim() < 2], 'weight_decay': 0.0}]
    try:
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, eps=eps, fused=True)
    except (RuntimeError, TypeError):  # no fused kernel for this device or torch version
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, eps=eps, foreach=True)


def config_from(d):
    # A GPTConfig from any dict (a train.py config, a checkpoint's saved config): known keys only.
    return GPTConfig(**{f.name: d[f.name] for f in fields(GPTConfig) if f.name in d})
