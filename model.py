"""
GPT-2, in one file: what the network is, and nothing about where it runs.
Sharding, activation checkpointing, compilation and offload are applied from
outside (hetgpt/run/parallel.py, as the plan says).
References: OpenAI's GPT-2, HF transformers' modeling_gpt2.py, nanoGPT's
model.py (its module names kept: HF weights map one to one, hetgpt/run/hf.py).
"""
import math
from dataclasses import dataclass, fields

import torch
import torch.nn as nn
from torch.nn import functional as F

from hetgpt.init_weights import normal_


@dataclass(frozen=True)
class GPTConfig:
    # Every field is a knob of train.py and plan.py (train.py may set its own
    # default), bounded by hetgpt/knobs.py's table or else by its type, and
    # kept in each checkpoint: a field added here is all a new knob needs.
    block_size: int = 1024   # longest sequence (learned positions)
    vocab_size: int = 50304  # GPT-2's 50257, padded to a multiple of 64
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True        # biases in Linears and LayerNorms, as GPT-2
    init_std: float = 0.02   # std of the normal init (gigaGPT varies it)


class CausalSelfAttention(nn.Module):

    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        C, bias = config.n_embd, config.bias
        self.c_attn = nn.Linear(C, 3 * C, bias=bias)  # q, k, v
        self.c_proj = nn.Linear(C, C, bias=bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head, self.n_embd = config.n_head, config.n_embd
        self.dropout = config.dropout

    def forward(self, x, cache=None):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        hs = C // self.n_head
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)
        mask, causal = None, True
        if cache is not None:  # generation: earlier keys and values kept
            pos = cache['pos']
            cache['k'][:, :, pos:pos + T] = k
            cache['v'][:, :, pos:pos + T] = v
            k = cache['k'][:, :, :pos + T]
            v = cache['v'][:, :, :pos + T]
            if pos > 0:  # new queries see the cache and new keys up to theirs
                causal = False
                mask = torch.ones(T, pos + T, dtype=torch.bool, device=x.device)
                mask = mask.tril(diagonal=pos)
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                           is_causal=causal, dropout_p=p)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # heads side by side
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):

    def __init__(self, config):
        super().__init__()
        C, bias = config.n_embd, config.bias
        self.c_fc = nn.Linear(C, 4 * C, bias=bias)
        self.gelu = nn.GELU(approximate='tanh')  # GPT-2's (HF: gelu_new)
        self.c_proj = nn.Linear(4 * C, C, bias=bias)
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
    # The summed cross-entropy of a chunk of tokens, in float32; targets -1
    # add nothing. Its gradient comes from autograd: another loss (z-loss,
    # label smoothing) is an edit here only.
    return F.cross_entropy(logits.float(), targets, ignore_index=-1,
                           reduction='sum')


class LMHeadLoss(torch.autograd.Function):
    # The summed loss of x @ weight.T, kernel(chunk of logits, targets) per
    # chunk (chunk_loss, or a compiled copy), without the micro-batch's
    # logits: one group of rows' logits at a time, each chunk of them
    # replaced by its gradient, which gives the group's share of the
    # gradients of x and weight. backward only scales them. chunks: (rows
    # per chunk, per group).

    @staticmethod
    def forward(ctx, x, weight, targets, need_grad, kernel, chunks):
        shape = x.shape
        x, targets = x.reshape(-1, x.size(-1)), targets.reshape(-1)
        loss = torch.zeros((), device=x.device)
        grad_x = grad_w = None
        if need_grad:
            grad_x = torch.empty_like(x)
            grad_w = torch.zeros(weight.shape, device=x.device)  # float32
        ctx.shape, ctx.weight_dtype = shape, weight.dtype
        dev = x.device.type
        if torch.is_autocast_enabled(dev):  # cast once, not per chunk
            dtype = torch.get_autocast_dtype(dev)
            x, weight = x.to(dtype), weight.to(dtype)
        rows, group = chunks
        assert group % rows == 0, f"loss chunks {chunks}: not whole chunks"
        logits = x.new_empty(min(group, len(x)), len(weight))
        for g in range(0, len(x), group):
            xg = x[g:g + group]
            lg = torch.mm(xg, weight.t(), out=logits[:len(xg)])
            for i in range(0, len(lg), rows):
                chunk = lg[i:i + rows].requires_grad_(need_grad)
                with torch.enable_grad():  # (forward runs without autograd)
                    s = kernel(chunk, targets[g + i:g + i + rows])
                loss += s
                if need_grad:  # the chunk's logits give way to their gradient
                    chunk.copy_(torch.autograd.grad(s, chunk)[0])
            if need_grad:
                grad_x[g:g + group] = lg @ weight
                grad_w += lg.t() @ xg
        ctx.save_for_backward(grad_x, grad_w)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        grad_x, grad_w = ctx.saved_tensors
        grad_w = (grad_w * grad_loss).to(ctx.weight_dtype)
        grad_x = (grad_x * grad_loss).view(ctx.shape)
        return grad_x, grad_w, None, None, None, None


# (tokens per chunk, per group of chunks), by device type: a matmul per group
# (1024 tokens: 1.5× faster than 128 at width 768), autograd's float32 buffers
# per chunk (64 on a CPU: 128 took up to 37% more peak RSS; bench/RESULTS.md)
LOSS_CHUNK = {'cpu': (64, 1024), 'cuda': (4096, 4096)}


class GPT(nn.Module):
    # What hetgpt's machinery relies on, kept by any edit of this file:
    # - the blocks are transformer.h: FSDP shards, ac checkpoints, compile
    #   compiles and the planner measures each one (and the rest as one);
    # - lm_head.weight is transformer.wte.weight (tied);
    # - forward(idx, targets, reduction='sum') returns (None, the summed
    #   token losses); without targets, the logits (sample.py);
    # - the model is built on the meta device, then init_weights makes every
    #   parameter and buffer (by module type: below);
    # - new_caches(batch) makes sample.py's KV cache, one entry per block;
    # - loss_kernel is chunk_loss (run/parallel.py compiles it), loss_chunks
    #   LMHeadLoss's chunks (None: LOSS_CHUNK of the device; the planner's).

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
        self.transformer.wte.weight = self.lm_head.weight  # tied embeddings
        self.loss_kernel, self.loss_chunks = chunk_loss, None
        self.init_weights(seed)

    def init_weights(self, seed=None, device=None):
        # Every parameter and buffer, by its module's type: Linear, Embedding
        # from normal(0, init_std), c_proj's / sqrt(2 * n_layer) (GPT-2's),
        # zero biases; any other by its reset_parameters() (norms, a rotary
        # table). A draw is a function of (seed, name) alone
        # (hetgpt/init_weights.py); seed None: torch's; device: where draws
        # run (CUDA's are not CPU's).
        seed = torch.initial_seed() if seed is None else seed
        done = set()  # (the tied head is wte's weight: drawn once, as wte)
        for name, m in self.named_modules():
            own = [*m.parameters(recurse=False), *m.buffers(recurse=False)]
            if all(id(t) in done for t in own):
                continue
            done.update(map(id, own))
            if isinstance(m, (nn.Linear, nn.Embedding)):
                std = self.config.init_std
                if name.endswith('c_proj'):
                    std /= math.sqrt(2 * self.config.n_layer)
                normal_(m.weight, std, f"{seed}/{name}.weight", device)
                if getattr(m, 'bias', None) is not None:
                    nn.init.zeros_(m.bias)
            elif hasattr(m, 'reset_parameters'):
                m.reset_parameters()
            else:
                raise TypeError(
                    f"model.py: {type(m).__name__} ({name}) holds weights or "
                    f"buffers but has no reset_parameters() to make them; "
                    f"give it one (GPT.init_weights calls it)")

    def materialise(self, device, seed, draw_on=None):
        # Storage for a model built on the meta device (or wrapped by FSDP
        # there): the weights on device, the buffers where the forward runs
        # (draw_on; under offload the weights stay on the host); then the
        # initial weights and buffers, drawn on draw_on
        self.to_empty(device=device)
        for m in self.modules():
            for name, b in m.named_buffers(recurse=False):
                setattr(m, name, torch.empty_like(b, device=draw_on or device))
        self.lm_head.weight = self.transformer.wte.weight  # (to_empty unties)
        self.init_weights(seed, draw_on)

    def new_caches(self, batch):
        # sample.py's KV cache: per block, the keys and values of block_size
        # positions (an attention with other keys edits their shape here)
        c, w = self.config, self.lm_head.weight
        shape = (batch, c.n_head, c.block_size, c.n_embd // c.n_head)
        return [dict(pos=0, k=w.new_empty(shape), v=w.new_empty(shape))
                for _ in self.transformer.h]

    def num_params(self, non_embedding=True):
        # non_embedding: without the positions (no matmul; the tied wte has)
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.transformer.wpe.weight.numel()
        return n

    def forward(self, idx, targets=None, reduction='mean', caches=None,
                last_only=False):
        # idx, targets: (B, T) token ids; targets -1 are ignored. 'sum': the
        # sum of token losses (train.py divides by the whole batch's tokens)
        B, T = idx.size()
        start = caches[0]['pos'] if caches else 0
        assert start + T <= self.config.block_size, "longer than block_size"
        pos = torch.arange(start, start + T, dtype=torch.long, device=idx.device)
        tok = self.transformer.wte(idx)
        x = self.transformer.drop(tok + self.transformer.wpe(pos))
        for i, block in enumerate(self.transformer.h):
            x = block(x, caches[i] if caches else None)
        for cache in caches or []:
            cache['pos'] += T
        x = self.transformer.ln_f(x)
        if targets is None:
            return self.lm_head(x[:, [-1]] if last_only else x), None
        # the loss without the (tokens × vocab) logits: no logits returned
        chunks = self.loss_chunks or LOSS_CHUNK.get(x.device.type)
        loss = LMHeadLoss.apply(x, self.lm_head.weight, targets,
                                torch.is_grad_enabled(), self.loss_kernel,
                                chunks or (1024, 1024))
        if reduction == 'sum':
            return None, loss
        return None, loss / (targets != -1).sum()


def make_optimizer(model, config):
    # A list of optimizers from train.py's knobs: AdamW, decaying matrices,
    # not biases and gains; optimizer='muon': Muon on the blocks' matrices
    # (lr × max(1, rows/cols)^0.5: Keller Jordan's). The planner measures.
    muon = config.get('optimizer') == 'muon'
    mats = [p for n, p in model.named_parameters()
            if muon and '.h.' in n and p.dim() == 2]
    decay = [p for p in model.parameters()
             if p.dim() >= 2 and all(p is not m for m in mats)]
    other = [p for p in model.parameters() if p.dim() < 2]
    opts = [adamw([{'params': decay, 'weight_decay': config['weight_decay']},
                   {'params': other, 'weight_decay': 0.0}], config)]
    if muon:
        opts.append(torch.optim.Muon(
            mats, lr=config['muon_lr'], momentum=config['muon_momentum'],
            weight_decay=config['muon_weight_decay']))
    return opts


def adamw(groups, config):
    kw = dict(lr=config['learning_rate'], eps=config['adam_eps'],
              betas=(config['beta1'], config['beta2']))
    try:
        return torch.optim.AdamW(groups, **kw, fused=True)
    except (RuntimeError, TypeError):  # no fused kernel here
        return torch.optim.AdamW(groups, **kw, foreach=True)


def config_from(d):
    # A GPTConfig from any dict (a config, a checkpoint's): known keys only
    return GPTConfig(**{f.name: d[f.name] for f in fields(GPTConfig)
                        if f.name in d})
