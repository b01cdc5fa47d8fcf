"""
Initial weights as a function of (seed, parameter name) alone: the same numbers under every
strategy, init_device and world size, however a parameter is placed or sharded.
"""
import hashlib

import torch
from torch._subclasses.fake_tensor import is_fake


@torch.no_grad()
def normal_(p, std, key, device=None):
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
