"""
The edit most researchers make first, written as one: model.py's GPT-2 block turned into a modern
one (RMSNorm, rotary positions held in a buffer, SwiGLU, grouped-query attention with a new
GPTConfig field n_kv_head, no biases). EDITS are (old, new) replacements of model.py's text, read
top to bottom as a diff; nothing else of the repository is edited (tests/test_modern_block.py).
"""

EDITS = [
    # the config: a field for grouped-query attention; bias goes (no biases anywhere)
    ("""    dropout: float = 0.0
    bias: bool = True        # biases in Linears and LayerNorms, as GPT-2
""", """    dropout: float = 0.0
    n_kv_head: int = 0       # heads of keys and values (grouped-query); 0: n_head
"""),
    # rotary positions: a table of angles in a buffer, made by reset_parameters
    ("""class CausalSelfAttention(nn.Module):
""", """class Rotary(nn.Module):
    # RoFormer's rotary positions: channels i and i + hs/2 turned together
    # by pos * 10000^(-2i/hs), from a table of those angles

    def __init__(self, config):
        super().__init__()
        half = config.n_embd // config.n_head // 2
        self.register_buffer('angle', torch.empty(config.block_size, half))
        self.reset_parameters()

    def reset_parameters(self):
        pos, half = self.angle.shape
        i = torch.arange(half, dtype=torch.float32, device=self.angle.device)
        t = torch.arange(pos, dtype=torch.float32, device=self.angle.device)
        self.angle.copy_(t[:, None] * 10000 ** (-i / half))

    def forward(self, x, start):  # x: (B, heads, T, hs) at positions start...
        a = self.angle[start:start + x.size(2)]
        cos, sin = a.cos().to(x.dtype), a.sin().to(x.dtype)
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class CausalSelfAttention(nn.Module):
"""),
    # grouped-query attention, rotary, no biases
    ("""        assert config.n_embd % config.n_head == 0
        C, bias = config.n_embd, config.bias
        self.c_attn = nn.Linear(C, 3 * C, bias=bias)  # q, k, v
        self.c_proj = nn.Linear(C, C, bias=bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head, self.n_embd = config.n_head, config.n_embd
        self.dropout = config.dropout
""", """        C, nh = config.n_embd, config.n_head
        self.n_head, self.n_kv = nh, config.n_kv_head or nh
        assert C % nh == 0 and nh % self.n_kv == 0
        self.hs = C // nh
        kv = self.n_kv * self.hs
        self.c_attn = nn.Linear(C, C + 2 * kv, bias=False)  # q, k, v
        self.c_proj = nn.Linear(C, C, bias=False)
        self.rotary = Rotary(config)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.dropout = config.dropout
"""),
    ("""        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        hs = C // self.n_head
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)
        mask, causal = None, True
        if cache is not None:  # generation: earlier keys and values kept
            pos = cache['pos']
""", """        kv = self.n_kv * self.hs
        q, k, v = self.c_attn(x).split([C, kv, kv], dim=2)
        q = q.view(B, T, self.n_head, self.hs).transpose(1, 2)
        k = k.view(B, T, self.n_kv, self.hs).transpose(1, 2)
        v = v.view(B, T, self.n_kv, self.hs).transpose(1, 2)
        start = cache['pos'] if cache is not None else 0
        q, k = self.rotary(q, start), self.rotary(k, start)
        mask, causal = None, True
        if cache is not None:  # generation: earlier keys and values kept
            pos = cache['pos']
"""),
    ("""                                           is_causal=causal, dropout_p=p)
""", """                                           is_causal=causal, dropout_p=p,
                                           enable_gqa=True)
"""),
    # SwiGLU
    ("""        C, bias = config.n_embd, config.bias
        self.c_fc = nn.Linear(C, 4 * C, bias=bias)
        self.gelu = nn.GELU(approximate='tanh')  # GPT-2's (HF: gelu_new)
        self.c_proj = nn.Linear(4 * C, C, bias=bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))
""", """        C = config.n_embd
        hidden = 8 * C // 3  # LLaMA's: as many weights as 4 * C with GELU
        self.c_fc = nn.Linear(C, 2 * hidden, bias=False)  # gate and value
        self.c_proj = nn.Linear(hidden, C, bias=False)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        gate, value = self.c_fc(x).chunk(2, dim=-1)
        return self.dropout(self.c_proj(F.silu(gate) * value))
"""),
    # RMSNorm, named as a modern model names it (not ln_*)
    ("""        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
""", """        self.norm_1 = nn.RMSNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.norm_2 = nn.RMSNorm(config.n_embd)
"""),
    ("""        x = x + self.attn(self.ln_1(x), cache)
        return x + self.mlp(self.ln_2(x))
""", """        x = x + self.attn(self.norm_1(x), cache)
        return x + self.mlp(self.norm_2(x))
"""),
    # no learned positions
    ("""            wpe=nn.Embedding(config.block_size, config.n_embd),
""", ""),
    ("""            ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
""", """            norm_f=nn.RMSNorm(config.n_embd),
"""),
    ("""        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.transformer.wpe.weight.numel()
        return n
""", """        return sum(p.numel() for p in self.parameters())
"""),
    ("""        pos = torch.arange(start, start + T, dtype=torch.long, device=idx.device)
        tok = self.transformer.wte(idx)
        x = self.transformer.drop(tok + self.transformer.wpe(pos))
""", """        x = self.transformer.drop(self.transformer.wte(idx))
"""),
    ("""        x = self.transformer.ln_f(x)
""", """        x = self.transformer.norm_f(x)
"""),
    # the KV cache: n_kv_head keys and values per position
    ("""        shape = (batch, c.n_head, c.block_size, c.n_embd // c.n_head)
""", """        shape = (batch, c.n_kv_head or c.n_head, c.block_size,
                 c.n_embd // c.n_head)
"""),
]


def angles(block_size, n_embd, n_head):
    # the rotary table by its formula, computed apart from the edit's code: row t, column i is
    # t * 10000^(-i / half), half = head size / 2, in float64 then rounded once
    import torch
    half = n_embd // n_head // 2
    i = torch.arange(half, dtype=torch.float64)
    t = torch.arange(block_size, dtype=torch.float64)
    return (t[:, None] * torch.pow(10000.0, -i / half)).float()


def count(n_layer, n_embd, n_head, n_kv_head, vocab_size):
    # the edited model's parameters by hand: per block two RMSNorm gains, q, k, v (k and v at
    # n_kv_head heads), the output projection, SwiGLU's three matrices; the tied embedding, the
    # last norm
    C, hs = n_embd, n_embd // n_head
    hidden = 8 * C // 3
    block = 2 * C + C * (C + 2 * n_kv_head * hs) + C * C + 3 * C * hidden
    return vocab_size * C + n_layer * block + C
