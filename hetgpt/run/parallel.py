"""
The model placed as the plan says: activation checkpointing, compilation,
then FSDP2 or DDP, in that order (compile sees the ac blocks; FSDP wraps
the compiled ones; torchtitan's order), and the autocast its forwards run
under.
"""
import functools
from contextlib import nullcontext

import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint


def wrap(raw_model, plan, rank, world_size, device, dtype, compile, seed,
         group=None):
    """The model placed as the plan says: returns (model, autocast).

    raw_model may be on the meta device: each rank then makes storage for
    its own weights or shard here, with the initial weights
    (GPT.materialise). group: DDP's ranks (local steps: the node's,
    hetgpt/run/local_steps.py); None: every rank.
    """
    device_type, ptdtype = device.split(':')[0], getattr(torch, dtype)
    if plan.ac[rank]:
        # this rank's backward runs each block's forward again
        for block in raw_model.transformer.h:
            block.forward = functools.partial(checkpoint, block.forward,
                                              use_reentrant=False)
    if compile:
        for block in raw_model.transformer.h:
            block.compile()
        # the loss's elementwise work, fused per chunk
        raw_model.loss_kernel = torch.compile(raw_model.loss_kernel)
    model = raw_model
    if plan.shard:
        model = shard(raw_model, plan, world_size, device_type, ptdtype)
    if raw_model.lm_head.weight.is_meta:
        # storage now, where this rank keeps its weights
        home = device
        if plan.offload:
            home = 'cpu'
        raw_model.materialise(home, seed, draw_on=device)
    if not plan.shard:
        raw_model.to(device)
        if world_size > 1:
            model = DDP(raw_model, gradient_as_bucket_view=True,
                        process_group=group)
    # DDP keeps float32 weights and its matmuls run in ptdtype. No cache
    # of the weights' 16-bit copies: under ac it would keep every block's
    # until the forward ends.
    enabled = not plan.shard and ptdtype != torch.float32
    autocast = torch.autocast(device_type=device_type, dtype=ptdtype,
                              cache_enabled=False, enabled=enabled)
    return model, autocast


def shard(raw_model, plan, world_size, device_type, ptdtype):
    """raw_model sharded by FSDP2 over every rank, block by block.

    fully_shard moves each parameter to the device as it shards it: the
    model never has to fit on one GPU. The mesh uses the default group:
    offloaded gradients are host tensors, whose norms clip_grad_norm_
    reduces through its gloo. Pinned host shards (CUDA only) copy
    asynchronously.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import (CPUOffloadPolicy,
                                        MixedPrecisionPolicy,
                                        OffloadPolicy, fully_shard)
    cuda = device_type == 'cuda'
    if plan.offload:
        offload = CPUOffloadPolicy(pin_memory=cuda)
    else:
        offload = OffloadPolicy()
    mesh = init_device_mesh(device_type, (world_size,))
    mp = MixedPrecisionPolicy(param_dtype=ptdtype,
                              reduce_dtype=torch.float32)
    kw = dict(mesh=mesh, mp_policy=mp, offload_policy=offload)
    for block in raw_model.transformer.h:
        fully_shard(block, reshard_after_forward=plan.reshard_after_forward,
                    **kw)
    return fully_shard(raw_model, **kw)


def sync(model, reduce):
    """A backward that reduces the gradients over ranks (reduce) or keeps
    them on this rank, to add the next micro-batch's: a context.

    FSDP2 sets it on every module it wraps; DDP takes a context.
    """
    if hasattr(model, 'set_requires_gradient_sync'):
        model.set_requires_gradient_sync(reduce)
    if isinstance(model, DDP) and not reduce:
        return model.no_sync()
    return nullcontext()
