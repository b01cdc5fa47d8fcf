"""
Initial weights as a function of (seed, parameter name) alone: the same
numbers under every strategy, init_device and world size, however a
parameter is placed or sharded.
"""
import hashlib

import torch
from torch._subclasses.fake_tensor import is_fake


@torch.no_grad()
def normal_(p, std, key, device=None):
    """Fills p from normal(0, std) as a function of key alone.

    Its rows in blocks of about 2^20 values, each drawn (on device) by a
    generator seeded by (key, block). A DTensor (a rank's FSDP shard of
    dim 0) draws only the blocks of its rows: any split of the rows gets
    the same numbers.
    """
    # (shapes only: meta, the planner's fake tensors)
    if p.is_meta or is_fake(p) or not p.numel():
        return
    local, first = p, 0
    if hasattr(p, 'to_local'):
        from torch.distributed.tensor._utils import (
            compute_local_shape_and_global_offset as where)
        local = p.to_local()
        first = where(p.shape, p.device_mesh, p.placements)[1][0]
    if p.dim():
        rows, total = local.view(len(local), -1), len(p)
    else:
        rows, total = local.view(1, 1), 1
    per = max(1, 2**20 // rows.size(1))  # rows per block
    last = (first + len(rows) - 1) // per
    for b in range(first // per, last + 1):
        name = f"{key}/{b}".encode()
        digest = hashlib.blake2b(name, digest_size=8).digest()
        seed = int.from_bytes(digest, 'big')
        gen = torch.Generator(device or local.device)
        gen.manual_seed(seed >> 1)
        n = min(per, total - b * per)
        block = torch.empty(n, rows.size(1), device=gen.device)
        block.normal_(0, std, generator=gen)
        lo = max(b * per, first)
        hi = min((b + 1) * per, first + len(rows))
        # (to its device)
        rows[lo - first:hi - first].copy_(block[lo - b * per:hi - b * per])
