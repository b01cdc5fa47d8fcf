"""
plan.py: how a GPT config trains on the devices at hand, decided before any weight is allocated.

$ python plan.py configs/gpt_70b.py --gpus 16xA100-80GB --host_mem 1024 --nodes 2
$ python plan.py configs/gpt_13b.py --gpus 4xA100-80GB,4xV100-32GB --host_mem 512

For a strategy (DDP or FSDP2, with or without per-block activation checkpointing and CPU offload)
it predicts the bytes each rank holds, the largest micro-batch that fits, and the step time; it
picks the fastest strategy that fits and splits the global batch over unlike ranks so that they
finish together. train.py applies the plan and checks it with a real probe step. Everything is
derived from the model built on the meta device (exact parameter counts, no weights allocated).
Notation: P parameters, N ranks, L layers, h width, s sequence, b micro-batch, V vocabulary.
"""
import argparse
import functools
import heapq
import math
import re
import resource
import sys
import time
from collections import Counter
from dataclasses import dataclass, field, fields, replace

import torch
from torch.multiprocessing.reductions import StorageWeakRef

import model as network  # looked up at call time: a test may swap in a variant of a module
from configurator import configure, die, oneline
from model import GPT, LOSS_CHUNK, GPTConfig, config_from

GiB = 2**30

# -----------------------------------------------------------------------------
# GPUs. mem: total bytes as nvidia-smi reports them (MiB; ECC parts show a little less than the
# marketed GB). TFLOPS are dense (datasheets print 2:4-sparsity figures: these are half of them).
# bf16/fp16: tensor cores, fp32 accumulate (GeForce cards run fp16 at twice that with fp16
# accumulate, which training does not use). tf32: tensor-core TF32, what float32 matmuls reach
# with torch.backends.cuda.matmul.allow_tf32 (train.py sets it); fp32: CUDA cores, no TF32.
# None: no such unit (Volta/Turing have no bf16 or TF32 tensor cores; bf16 runs at about the
# fp32 rate). hbm: device memory GB/s (the optimizer step is bound by it). host: GB/s per direction
# to the host (PCIe Gen3 x16 15.75, Gen4 31.5, Gen5 63; GH200's NVLink-C2C 450). p2p: GPU<->GPU
# GB/s per direction inside a node (NVLink's quoted total / 2; PCIe where the parts have no NVLink
# switch).
# net: line rate GB/s per GPU between nodes in the part's reference system: DGX H100/H200 one
# 400 Gb/s NIC per GPU (50), DGX A100 one 200 Gb/s per GPU (25), DGX-1 V100 four 100 Gb/s for eight
# (6.25), GH200 one 200 Gb/s NIC per superchip (CSCS Alps: 25); PCIe cards one 100 Gb/s NIC per node
# of eight (AWS g5.48xlarge: 100 Gb/s for 8 A10G: 1.5625). --inter_node_gbs overrides it.
def _gpu(mib, bf16, fp16, tf32, fp32, hbm, host, p2p, net=100 / 8 / 8):
    return dict(mem=mib * 2**20, bf16=bf16, fp16=fp16, tf32=tf32, fp32=fp32, hbm=hbm, host=host,
                p2p=p2p, net=net)


GPUS = {  # sources: NVIDIA datasheets (H200, H200 NVL, GH200, H100, A100, V100, A40, L40S, A10, L4, T4, RTX A6000)
    'H200':           _gpu(143771, 989, 989, 494, 67, 4800, 63, 450, 50),   # 141 GB HBM3e, NVLink 900 GB/s
    'H200-NVL':       _gpu(143771, 835, 835, 417, 60, 4800, 63, 450),       # PCIe; 2/4-way NVLink bridge 900 GB/s
    'GH200':          _gpu(97871, 989, 989, 494, 67, 4000, 450, 450, 25),   # 96 GB HBM3 ("GH200 480GB")
    'GH200-144GB':    _gpu(146831, 989, 989, 494, 67, 4900, 450, 450, 25),  # 144 GB HBM3e
    'H100-SXM':       _gpu(81559, 989, 989, 494, 67, 3350, 63, 450, 50),    # 80 GB HBM3, NVLink 900 GB/s
    'H100-PCIe':      _gpu(81559, 756, 756, 378, 51, 2000, 63, 63),         # 80 GB HBM2e; NVLink bridge pairs only
    'A100-80GB':      _gpu(81920, 312, 312, 156, 19.5, 2039, 31.5, 300, 25),  # SXM4, NVLink 600 GB/s
    'A100-40GB':      _gpu(40960, 312, 312, 156, 19.5, 1555, 31.5, 300, 25),  # SXM4, NVLink 600 GB/s
    'A100-PCIe-80GB': _gpu(81920, 312, 312, 156, 19.5, 1935, 31.5, 31.5),
    'A100-PCIe-40GB': _gpu(40960, 312, 312, 156, 19.5, 1555, 31.5, 31.5),
    'V100-32GB':      _gpu(32768, None, 125, None, 15.7, 900, 15.75, 150, 6.25),  # SXM2, NVLink 300 GB/s
    'V100-16GB':      _gpu(16384, None, 125, None, 15.7, 900, 15.75, 150, 6.25),
    'RTX3090':        _gpu(24576, 71, 71, 35.6, 35.6, 936, 31.5, 31.5),     # GA102 whitepaper
    'RTX4090':        _gpu(24564, 165.2, 165.2, 82.6, 82.6, 1008, 31.5, 31.5),  # AD102 whitepaper; no P2P
    'A6000':          _gpu(49140, 154.8, 154.8, 77.4, 38.7, 768, 31.5, 31.5),   # RTX A6000
    'A40':            _gpu(46068, 149.7, 149.7, 74.8, 37.4, 696, 31.5, 31.5),
    'L40S':           _gpu(46068, 362, 362, 183, 91.6, 864, 31.5, 31.5),
    # A10G (AWS g5): no NVIDIA datasheet; the A10's memory, about half its tensor rate (uncertain)
    'A10G':           _gpu(23028, 70, 70, 35, 31.2, 600, 31.5, 31.5),
    'A10':            _gpu(23028, 125, 125, 62.5, 31.2, 600, 31.5, 31.5),
    'L4':             _gpu(23034, 121, 121, 60, 30.3, 300, 31.5, 31.5),
    'T4':             _gpu(15360, None, 65, None, 8.1, 320, 15.75, 15.75),
}

# Guesses that a probe step replaces; each is what the dry run assumes.
EFFICIENCY = 0.5        # matmul FLOPs reached / dense peak: nanoGPT ~0.4-0.5 MFU on A100, Megatron-LM ~0.5
LINK_EFFICIENCY = 0.7   # NCCL bus bandwidth / link's nominal (nccl-tests: ~230 of 300 GB/s on A100 NVLink)
PCIE_EFFICIENCY = 0.7   # pinned copies / PCIe nominal (notes: A100 H2D 25 of 31.5, H100 35-53 of 63 GB/s)
HBM_EFFICIENCY = 0.7    # fused AdamW's streaming / HBM peak
HOST_ADAM_BW = 100e9    # bytes/s per node for the CPU AdamW step (memory bound; train.py measures it)
LAUNCH_S = 1e-4         # seconds per layer per micro-batch (forward + backward kernel launches)
FSDP_GROUP_S = 2e-4     # seconds per FSDP group per micro-batch: hooks, copy-in/copy-out (fwd + bwd)
CPU_FLOPS = 1e11        # FLOP/s of a CPU rank when not measured (2 AVX-512 cores, float32)
CPU_COMM_BW = 2e9       # gloo over loopback
UNKNOWN_GPU = _gpu(0, 50, 50, 25, 12, 1000, 15.75, 15.75)  # a GPU not in the table (mem must be given)
GPU_OVERHEAD = GiB      # CUDA context + cuBLAS workspace + NCCL buffers, when not measured at start-up
PROCESS_HOST = 2 * GiB  # host bytes of one training process (Python, torch, CUDA host state)
CPU_OVERHEAD = GiB // 2 # a CPU rank's process before any tensor
ALLOC_SLACK = 0.05      # caching-allocator rounding and fragmentation, of the memory that comes and goes

STRATEGIES = ('ddp', 'ddp+ac', 'fsdp-noreshard', 'fsdp', 'fsdp+ac', 'fsdp+offload', 'fsdp+ac+offload')


def flags(strategy):
    assert strategy in STRATEGIES, f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}"
    shard = strategy.startswith('fsdp')
    return dict(ac='+ac' in strategy, shard=shard, reshard_after_forward=shard and strategy != 'fsdp-noreshard',
                offload='offload' in strategy)


def gpu_key(name):
    # torch.cuda.get_device_name() -> a GPUS key, or None. Also accepts a key in any case.
    if name is None:
        return None
    for key in GPUS:
        if name.lower() == key.lower():
            return key
    t = name.upper().replace('-', ' ').split()
    pcie = 'PCIE' in t
    if 'GH200' in t: return 'GH200-144GB' if any(x.startswith('144G') for x in t) else 'GH200'
    if 'H200' in t: return 'H200-NVL' if 'NVL' in t else 'H200'
    if 'H100' in t: return 'H100-PCIe' if pcie else 'H100-SXM'
    if 'A100' in t: return ('A100-PCIe-' if pcie else 'A100-') + ('80GB' if '80GB' in t else '40GB')
    if 'V100' in t: return 'V100-32GB' if '32GB' in t else 'V100-16GB'
    if '3090' in t: return 'RTX3090'
    if '4090' in t: return 'RTX4090'
    for key in ('A6000', 'A40', 'L40S', 'A10G', 'A10', 'L4', 'T4'):
        if key in t:
            return key
    return None


def peak_flops(device, dtype='bfloat16', tf32=True):
    # Dense peak FLOP/s of a GPU (a torch device name or a GPUS key) in a compute dtype; None for a
    # CPU or an unknown GPU. float32 counts TF32 tensor cores when tf32 (as train.py runs CUDA);
    # a dtype without tensor cores on that part falls back to the fp32 CUDA-core rate.
    key = gpu_key(device)
    if key is None:
        return None
    g, dtype = GPUS[key], str(dtype).replace('torch.', '')
    col = {'bfloat16': 'bf16', 'bf16': 'bf16', 'float16': 'fp16', 'fp16': 'fp16', 'tf32': 'tf32',
           'float32': 'tf32' if tf32 else 'fp32', 'fp32': 'fp32'}[dtype]
    return (g[col] or g['fp32']) * 1e12


def host_memory_available():
    # Bytes the OS could give now (MemAvailable), for train.py's ranks.
    with open('/proc/meminfo') as f:
        info = {line.split(':')[0]: int(line.split()[1]) * 1024 for line in f}
    return info.get('MemAvailable', info['MemTotal'])


def peak_rss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


# -----------------------------------------------------------------------------
# Parameter counts, exactly, from the model on the meta device
def _config(model_config):
    return config_from(model_config) if isinstance(model_config, dict) else model_config


@functools.lru_cache(maxsize=None)
def _shapes(config_items):
    # Parameter shapes of one block and of the root FSDP group (the rest: embeddings, tied
    # wte/lm_head, ln_f), from the model built on the meta device.
    with torch.device('meta'):
        model = network.GPT(GPTConfig(**dict(config_items)))
    in_blocks = {id(p) for b in model.transformer.h for p in b.parameters()}
    block = tuple(tuple(p.shape) for p in model.transformer.h[0].parameters())
    root = tuple(tuple(p.shape) for p in model.parameters() if id(p) not in in_blocks)
    return block, root


def counts(model_config):
    c = _config(model_config)
    block, root = _shapes(tuple(sorted(vars(replace(c, n_layer=1)).items())))
    numel = lambda shapes: sum(math.prod(s) for s in shapes)
    return dict(total=c.n_layer * numel(block) + numel(root), block=numel(block), root=numel(root),
                block_shapes=block, root_shapes=root)


def _sharded(shapes, n):
    # FSDP2 shards each parameter on dim 0, padded to a multiple of n: a rank holds ceil(d0/n) rows
    return sum(math.ceil(s[0] / n) * math.prod(s[1:]) for s in shapes)


def _pinned(shapes, n):
    # Pinned host bytes of the fp32 shards: the CUDA caching host allocator rounds every block up
    # to a power of two (FSDP2 pins each parameter's shard, and each gradient copied back to it).
    return sum(1 << (4 * math.ceil(s[0] / n) * math.prod(s[1:]) - 1).bit_length() for s in shapes)


# -----------------------------------------------------------------------------
# What the model saves for backward and what its optimizer keeps, measured rather than assumed: a
# researcher's edit to model.py (another MLP, attention, normalisation) is planned right as is.
def _storage_bytes(tensors, exclude):
    seen = {}
    for t in tensors:
        ref = StorageWeakRef(t.untyped_storage())
        if ref not in exclude:
            seen[ref] = t.untyped_storage().nbytes()
    return sum(seen.values())


def _saved(fn, params, *inputs):
    # Bytes that autograd saves for backward while fn runs (each storage once; the parameters
    # themselves are model states, not activations), and fn's output.
    packed = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t):
        out = fn(*inputs)
    return _storage_bytes(packed, {StorageWeakRef(p.untyped_storage()) for p in params}), out


@functools.lru_cache(maxsize=None)
def saved_bytes(config_items, param_dtype, autocast_dtype):
    # One block, and the rest (embeddings, ln_f, the loss), run forward on fake tensors at the
    # real sequence length for micro-batches of 1 and 2 sequences, under a dtype policy: float32;
    # float32 weights under autocast (DDP); 16-bit weights (FSDP2's param_dtype). Saved bytes are
    # affine in the micro-batch: per sequence, and fixed (autocast's 16-bit weight copies, the
    # loss's float32 weight gradient). Also the bytes of a block's input per sequence, which is
    # what per-block checkpointing keeps. No memory is allocated; cached by shape.
    from torch._subclasses.fake_tensor import FakeTensorMode
    cfg = GPTConfig(**dict(config_items))
    s, h = cfg.block_size, cfg.n_embd
    autocast = torch.autocast('cpu', dtype=autocast_dtype, enabled=autocast_dtype is not None)
    default = torch.get_default_dtype()
    found = {}
    with FakeTensorMode():
        torch.set_default_dtype(param_dtype)
        try:
            block = network.Block(cfg)
            rest = network.GPT(replace(cfg, n_layer=0))
        finally:
            torch.set_default_dtype(default)
        stream = param_dtype if autocast_dtype is None else torch.float32
        for b in (1, 2):
            x = torch.empty(b, s, h, dtype=stream, requires_grad=True)
            idx = torch.zeros(b, s, dtype=torch.long)
            with autocast:
                found['block', b], y = _saved(block, block.parameters(), x)
                found['rest', b], _ = _saved(lambda i: rest(i, i), rest.parameters(), idx)
    per = {k: found[k, 2] - found[k, 1] for k in ('block', 'rest')}
    fixed = {k: found[k, 1] - per[k] for k in ('block', 'rest')}
    return dict(block=per['block'], rest=per['rest'], block_fixed=fixed['block'],
                rest_fixed=fixed['rest'], block_input=y[:1].numel() * y.element_size())


def _measured(measure, *args):
    # What cannot be measured cannot be planned: say so in one line.
    try:
        return measure(*args)
    except Exception as e:
        die(f"the planner cannot run model.py's network on fake tensors to measure it "
            f"({oneline(e)}): keep its forward free of data-dependent Python (.item(), numpy)")


def activation_bytes(model_config, strategy, dtype):
    # saved_bytes for this config under the dtype policy train.py uses with this strategy.
    dtype = str(dtype).replace('torch.', '')
    half = {'bfloat16': torch.bfloat16, 'float16': torch.float16}.get(dtype)
    policy = (torch.float32, None) if half is None else (half, None) if flags(strategy)['shard'] \
        else (torch.float32, half)
    return _measured(saved_bytes, tuple(sorted(vars(_config(model_config)).items())), *policy)


@functools.lru_cache(maxsize=None)
def optimizer_state_bytes():
    # Optimizer state per parameter (AdamW: 8), measured: one step of model.make_optimizer, the
    # optimizer train.py builds, on a small model; scalars such as AdamW's step count are left out.
    torch.manual_seed(0)
    net = network.GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=8, vocab_size=64))
    optimizer = network.make_optimizer(net.parameters())
    for p in net.parameters():
        p.grad = torch.randn_like(p)
    optimizer.step()
    state = [t for st in optimizer.state.values() for t in st.values()
             if torch.is_tensor(t) and t.numel() > 1]
    return _storage_bytes(state, set()) / sum(p.numel() for p in net.parameters())


@functools.lru_cache(maxsize=None)
def optimizer_updates_shards_alone():
    # FSDP2 steps each rank's dim-0 shard of a matrix on its own. An elementwise optimizer (AdamW,
    # SGD, Lion) updates the halves of a matrix as it updates the whole; one whose update needs the
    # whole matrix (Muon's orthogonalisation) does not, and cannot run sharded.
    torch.manual_seed(0)
    whole = torch.nn.Parameter(torch.randn(8, 6))
    halves = [torch.nn.Parameter(half.clone()) for half in whole.detach().split(4)]
    grad = torch.randn(8, 6)
    for params, grads in (([whole], [grad]), (halves, grad.split(4))):
        optimizer = network.make_optimizer(params)
        for p, g in zip(params, grads):
            p.grad = g.clone()
        optimizer.step()
    return torch.allclose(whole.detach(), torch.cat([h.detach() for h in halves]), atol=1e-6)


@functools.lru_cache(maxsize=None)
def model_flops(config_items):
    # Training FLOPs of one sequence, counted (FlopCounterMode) on fake tensors: one block forward
    # and backward, plain and under the checkpointing train.py applies (whose recompute stops
    # short of the block's last matmul), and the rest (embeddings, ln_f, the loss's matmuls).
    # Attention runs as SDPA's math kernel here, which the counter sees: its full s×s products,
    # PaLM's 12·h·s per token and layer (the fused kernels of the CPU and GPU skip the masked
    # half, or are not counted at all on the CPU).
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.checkpoint import checkpoint
    from torch.utils.flop_counter import FlopCounterMode
    cfg = GPTConfig(**dict(config_items))
    counted = {}
    with FakeTensorMode(), sdpa_kernel(SDPBackend.MATH):
        block, rest = network.Block(cfg), network.GPT(replace(cfg, n_layer=0))
        x = torch.empty(1, cfg.block_size, cfg.n_embd, requires_grad=True)
        idx = torch.zeros(1, cfg.block_size, dtype=torch.long)
        runs = dict(block=lambda: block(x), ac=lambda: checkpoint(block, x, use_reentrant=False),
                    rest=lambda: rest(idx, idx)[1])
        for name, run in runs.items():
            with FlopCounterMode(display=False) as counter:
                run().sum().backward()
            counted[name] = counter.get_total_flops()
    return counted


def flops_per_sequence(model_config, ac=False):
    # Training FLOPs of one sequence (model_flops): MFU's numerator everywhere, train.py's too.
    c = _config(model_config)
    f = _measured(model_flops, tuple(sorted(vars(c).items())))
    return c.n_layer * f['ac' if ac else 'block'] + f['rest']


# -----------------------------------------------------------------------------
# The estimator: bytes on one rank
def estimate(model_config, strategy, micro_batch, world_size, dtype='bfloat16', ranks_per_node=None,
             overhead=None, device='cuda', accumulate=False, micro_batches=2):
    cfg, n, f = _config(model_config), counts(model_config), flags(strategy)
    N, b, s, h, L, V = world_size, micro_batch, cfg.block_size, cfg.n_embd, cfg.n_layer, cfg.vocab_size
    P, Pb, Pr = n['total'], n['block'], n['root']
    cb = 4 if str(dtype).replace('torch.', '') in ('float32', 'fp32') else 2  # bytes of the compute dtype
    # Model states: fp32 params 4 + fp32 grads 4 + the optimizer's state (measured; AdamW's 8 makes
    # ZeRO's 16 B/param). DDP (gradient_as_bucket_view: the grads are the buckets) keeps them all;
    # FSDP2 shards all three by N (fp32 shards; reduce_dtype fp32).
    mine = _sharded(n['block_shapes'], N) * L + _sharded(n['root_shapes'], N) if f['shard'] else P
    optim = round(optimizer_state_bytes() * mine)
    part = dict(params=4 * mine, grads=4 * mine, optim=optim)
    # FSDP2 accumulating without sync (set_requires_gradient_sync(False)) keeps every parameter's
    # gradient unsharded in reduce_dtype (fp32) on the device until the reduce-scatter
    unsharded_grads = 4 * P if f['shard'] and accumulate else 0
    host_rank = 0 if device == 'cpu' else PROCESS_HOST
    if f['offload']:  # CPUOffloadPolicy: shards on the host, pinned params and grads; AdamW steps there
        host_rank += (_pinned(n['block_shapes'], N) * L + _pinned(n['root_shapes'], N)) * 2 + optim
        part = dict(params=0, grads=0, optim=0)
    part['grads'] += unsharded_grads
    a = activation_bytes(cfg, strategy, dtype)
    # The loss (model.LMHeadLoss) never holds the micro-batch's logits: one chunk of them at a time
    # (compute dtype and float32) and the gradients of a group of chunks (compute dtype, and their
    # concatenation) come and go in its forward; its backward scales the head's float32 gradient.
    rows, group = LOSS_CHUNK.get(device, (1024, 1024))
    tokens = b * s
    logits = max(min(rows, tokens) * V * (4 + cb) + 2 * min(group, tokens) * V * cb, 4 * V * h)
    # Activations: what autograd saves, measured per sequence (saved_bytes). Per-block
    # checkpointing keeps each block's input and recomputes one block at a time in the backward,
    # after the loss's working set is gone.
    saved = b * a['rest'] + a['rest_fixed']
    if f['ac']:
        activations = L * b * a['block_input'] + saved + max(b * a['block'], logits)
    else:
        activations = L * b * a['block'] + saved + logits
    if not f['shard']:
        # autocast's 16-bit copies of the weights, saved for backward (the live block's under AC)
        buffers = a['block_fixed'] * (1 if f['ac'] else L)
    else:
        # FSDP2 buffers: the root group is never resharded after forward, and the tied
        # wte/lm_head gradient lives through the whole backward (params + grads unsharded); the
        # blocks: current + prefetched unsharded (all of them from forward to backward without
        # resharding); one block's unsharded grad plus its fp32 copy for the reduce-scatter;
        # under offload the fp32 shards of two blocks copied to the device before their all-gather.
        reduce = 4 if cb == 2 else 0
        live = 2 * cb * Pb if f['reshard_after_forward'] else cb * L * Pb
        buffers = 2 * cb * Pr + live + (cb + reduce) * Pb + (8 * math.ceil(Pb / N) if f['offload'] else 0)
    if overhead is None:
        overhead = GPU_OVERHEAD if device == 'cuda' else CPU_OVERHEAD
    other = buffers + ALLOC_SLACK * (activations + buffers) + overhead
    part.update(activations=activations, other=int(other))
    # The peak, not the sum of the parts: activations are freed as backward makes the gradients,
    # so both are held at once only when gradients outlive a step's forward: earlier micro-batches'
    # (micro_batches > 1, FSDP's unsharded accumulation) or DDP's buckets (several ranks).
    held = micro_batches > 1 or accumulate or (N > 1 and not f['shard'])
    grads_and_activations = part['grads'] + activations if held else max(part['grads'], activations)
    part['total'] = part['params'] + part['optim'] + int(other) + grads_and_activations
    part['host_rank'] = host_rank
    part['host'] = host_rank * (ranks_per_node or min(N, 8))
    return part


# -----------------------------------------------------------------------------
# Splitting a global batch over unlike ranks
def split_batch(batch, c0, c1, caps, count=None):
    # Whole sequences n_i, sum n_i = batch, 0 <= n_i <= caps_i, minimising max_i c0_i + c1_i·n_i.
    # Greedy: each next sequence goes to the rank that would finish it earliest. It is optimal:
    # rank i's finishing times c0_i + c1_i·k (k = 1, 2, ...) increase with k, a split takes a
    # prefix of each rank's list, so its maximum is at least the batch-th smallest of all these
    # values; the greedy takes exactly the batch smallest. count=K > 1: FSDP's lockstep, below.
    if not len(c0) == len(c1) == len(caps):
        raise ValueError(f"split_batch: c0, c1 and caps differ in length ({len(c0)}, {len(c1)}, {len(caps)})")
    if min(c1, default=0) < 0 or batch < 0:
        raise ValueError("split_batch: the batch and each rank's c1 must be >= 0")
    if count and count > 1:
        return _split_lockstep(batch, c0, c1, caps, count)
    if sum(caps) < batch:
        raise ValueError(f"cannot split {batch} sequences over {len(caps)} ranks: their caps {list(caps)} "
                         f"hold only {sum(caps)}; lower batch_size, or allow more micro-batches or sequences per rank")
    n = [0] * len(caps)
    heap = [(c0[i] + c1[i], i) for i in range(len(caps)) if caps[i] > 0]
    heapq.heapify(heap)
    for _ in range(batch):
        _, i = heapq.heappop(heap)
        n[i] += 1
        if n[i] < caps[i]:
            heapq.heappush(heap, (c0[i] + c1[i] * (n[i] + 1), i))
    return n


def _split_lockstep(batch, c0, c1, caps, count):
    # FSDP: every rank runs `count` micro-batches, and each micro-batch waits for the slowest rank.
    # caps and c0 are per micro-batch; rank i's pieces are micro_batches(n_i, caps_i, count), so
    # one more sequence for rank i adds one to its micro-batch number n_i mod count. Two greedy
    # fills, the better kept, then single moves between ranks while they help (up to 16 ranks).
    # Not provably optimal: tests/test_split.py compares it with brute force.
    if count * sum(caps) < batch:
        raise ValueError(f"cannot split {batch} sequences over {len(caps)} ranks in {count} micro-batches: "
                         f"their caps {list(caps)} per micro-batch hold only {count * sum(caps)}")
    R = len(caps)

    def times(n):  # each micro-batch's time: its slowest rank
        pieces = [micro_batches(x, c, count) for x, c in zip(n, caps)]
        return [max(a + b * p[j] for a, b, p in zip(c0, c1, pieces)) for j in range(count)]

    def fill(n):  # the remaining sequences one by one, each where it lengthens the step least
        slot = times(n)
        grow = lambda i: max(slot[n[i] % count], c0[i] + c1[i] * (n[i] // count + 1)) - slot[n[i] % count]
        for _ in range(batch - sum(n)):
            i = min((i for i in range(R) if n[i] < count * caps[i]), key=lambda i: (grow(i), c1[i], i))
            slot[n[i] % count] += grow(i)
            n[i] += 1
        return n

    # (a) from nothing; (b) floor(batch/count) split as one micro-batch, count times over
    n = min(fill([0] * R), fill([count * x for x in split_batch(batch // count, c0, c1, caps)]),
            key=lambda n: sum(times(n)))
    improved = R <= 16
    while improved:
        improved = False
        for i, k in ((i, k) for i in range(R) for k in range(R) if i != k):
            m = list(n)
            m[i], m[k] = m[i] - 1, m[k] + 1
            if m[i] >= 0 and m[k] <= count * caps[k] and sum(times(m)) < sum(times(n)) - 1e-12:
                n, improved = m, True
    return n


def micro_batches(n, cap, count=None):
    # A rank's n sequences as near-equal micro-batches of at most cap: ceil(n/cap) of them, or
    # exactly count (FSDP: every rank runs the same count; pieces may be empty).
    if count is None:
        count = math.ceil(n / cap) if n else 0
    if n > count * cap:
        raise ValueError(f"{n} sequences do not fit in {count} micro-batches of at most {cap}")
    q, r = divmod(n, count) if count else (0, 0)
    return [q + 1] * r + [q] * (count - r)


def rank_micro_batches(shares, caps, rank, lockstep):
    # Rank `rank`'s micro-batch sizes. Under DDP ranks may run different numbers of micro-batches
    # (all but the last under no_sync); FSDP2 all-gathers in every forward (lockstep), so there all
    # ranks run the same number, of varying size.
    counts = [math.ceil(n / c) if n else 1 for n, c in zip(shares, caps)]
    return micro_batches(shares[rank], caps[rank], max(counts) if lockstep else counts[rank])


def step_time(split, c0, c1):
    return max(a + b * n for a, b, n in zip(c0, c1, split))


def better_split(current, c0, c1, gain=0.03):
    # The best split of the same batch, if it is predicted to be more than `gain` faster: noise in
    # the measured speeds must not make the split wander. A share has no cap: it runs in
    # micro-batches of at most the rank's cap, accumulating.
    batch = sum(current)
    best = split_batch(batch, c0, c1, [batch] * len(current))
    return best if step_time(best, c0, c1) < (1 - gain) * step_time(current, c0, c1) else current


def weighted_split(batch, weights):
    # balance=w1,w2,...: shares proportional to the weights, in whole sequences
    return split_batch(batch, [0.0] * len(weights), [1 / w for w in weights], [batch] * len(weights))


# The default process group's backend, by the device type train.py runs on. Under CUDA one group has
# a backend per device type: NCCL serves only CUDA tensors, and train.py also reduces host tensors
# (flags, counts, the peak FLOPS; gradients under CPU offload), which go through gloo.
BACKENDS = {'cuda': 'cpu:gloo,cuda:nccl', 'cpu': 'gloo'}


def this_rank(device_type, rank, local_world):
    # What this rank has, for make_plan: its device and memory, and its node's host memory. A GPU
    # rank calls it after its first collective on the device: the memory in use then but not in
    # PyTorch's allocator (CUDA context, NCCL's buffers, other processes) is its measured overhead.
    host = host_memory_available()
    if device_type != 'cuda':
        return dict(device='cpu', node=rank // local_world, host_mem=host, gpu=None,
                    mem=host // local_world, overhead=None)
    free, total = torch.cuda.mem_get_info()
    return dict(device='cuda', node=rank // local_world, host_mem=host,
                gpu=gpu_key(torch.cuda.get_device_name()), mem=total,
                overhead=total - free - torch.cuda.memory_reserved())


# -----------------------------------------------------------------------------
# The planner
@dataclass
class Plan:
    strategy: str
    ac: bool
    shard: bool
    reshard_after_forward: bool
    offload: bool
    reduce_every_micro_batch: bool  # FSDP: reduce-scatter after each micro-batch (else accumulate unsharded)
    micro_batch: list               # per rank: the largest micro-batch (sequences) that fits
    share: list                     # per rank: sequences of the global batch
    accum: list                     # per rank: micro-batches per step
    micro_batches: list             # per rank: their sizes
    predicted: list                 # per rank: estimate() at its largest micro-batch
    step_time: float
    tokens_per_sec: float
    mfu: float
    fits: bool
    advice: str = ''
    needs: dict = field(default_factory=dict)
    ranks: list = field(default_factory=list)
    batch_size: int = 0
    block_size: int = 0
    n_params: int = 0
    dtype: str = 'bfloat16'
    candidates: list = field(default_factory=list)  # (strategy, fits, predicted step time)
    config: GPTConfig = None

    def table(self, measured=None):
        g = lambda x: '-' if x is None else f"{x / GiB:.1f}"
        parts = ('params', 'grads', 'optim', 'activations', 'other', 'total')
        head = (f"{'rank':>4} {'node':>4} {'device':<14} {'share':>5} {'micro×acc':>9}     "
                + ''.join(f"{p[:5]:>8}" for p in parts) + f"{'budget':>8}{'host/node':>10}{'tok/s':>10}{'MFU':>6}")
        out = [f"plan: {self.strategy} ({'fits' if self.fits else 'does NOT fit'}), {len(self.ranks)} rank(s), "
               f"{self.n_params:,} parameters, {self.dtype}, batch {self.batch_size} × {self.block_size} tokens; "
               f"memory in GiB", head]
        for i, r in enumerate(self.ranks):
            p, mb = self.predicted[i], f"{max(self.micro_batches[i])}×{self.accum[i]}"
            tps = self.share[i] * self.block_size / self.step_time if self.step_time else None
            peak = _peak(r, self.dtype)
            mfu = f"{self.share[i] * flops_per_sequence(self.config) / self.step_time / peak:.0%}" \
                if peak and self.step_time else '-'
            out.append(f"{i:>4} {r['node']:>4} {r['gpu'] or r['device']:<14} {self.share[i]:>5} {mb:>9} pred"
                       + ''.join(f"{g(p[k]):>8}" for k in parts) + f"{g(r['mem'] * r['fraction']):>8}"
                       + f"{g(p['host']) if p['host'] else '-':>10}"
                       + (f"{tps:>10,.0f}" if tps else f"{'-':>10}") + f"{mfu:>6}")
            if measured and i < len(measured) and measured[i]:
                out.append(f"{'':>40} meas" + ''.join(f"{g(measured[i].get(k)):>8}" for k in parts)
                           + f"{'':>8}{g(measured[i].get('host')):>10}")
        if self.step_time:
            out.append(f"predicted: step {self.step_time:.3g} s, {self.tokens_per_sec:,.0f} tokens/s"
                       + (f", MFU {self.mfu:.0%}" if self.mfu else '')
                       + f" (matmuls at {EFFICIENCY:.0%} of dense peak, links at {LINK_EFFICIENCY:.0%})")
        out.append('candidates: ' + ' | '.join(f"{s} {f'{t:.3g} s' if ok else 'x'}" for s, ok, t in self.candidates))
        if self.advice:
            out.append(('advice: ' if not self.fits else 'note: ') + self.advice)
        return '\n'.join(out)


def _dev(rank):
    return GPUS.get(rank.get('gpu')) or UNKNOWN_GPU


def _peak(rank, dtype):
    return rank.get('flops') or (peak_flops(rank['gpu'], dtype) if rank['device'] == 'cuda' else None)


def _normalise(ranks, fraction):
    out = [dict(dict(gpu=None, node=0, host_mem=None), **r) for r in ranks]
    for r in out:
        r.setdefault('device', 'cuda' if r['gpu'] else 'cpu')
        assert r.get('mem') or r['gpu'] in GPUS, f"rank {r}: give mem (bytes) for a CPU rank or a GPU not in GPUS"
        r['mem'] = r.get('mem') or GPUS[r['gpu']]['mem']
        if r.get('overhead') is None:
            r['overhead'] = GPU_OVERHEAD if r['device'] == 'cuda' else CPU_OVERHEAD
        r['fraction'] = fraction
    return out


def _bandwidth(ranks, inter_node_bw):
    # Bytes/s of the ring's slowest hop: NVLink/PCIe inside a node (unlike GPUs on one node talk
    # over PCIe), the NIC between nodes (inter_node_bw, else the slowest part's 'net'); gloo for
    # CPU ranks.
    if any(r['device'] == 'cpu' for r in ranks):
        return CPU_COMM_BW
    kinds = {r['gpu'] for r in ranks}
    intra = _dev(ranks[0])['p2p'] if len(kinds) == 1 else min(_dev(r)['host'] for r in ranks)
    intra *= 1e9
    inter = inter_node_bw or min(_dev(r)['net'] for r in ranks) * 1e9
    return LINK_EFFICIENCY * (min(intra, inter) if len({r['node'] for r in ranks}) > 1 else intra)


def _evaluate(cfg, batch, ranks, strategy, mbs, dtype, inter_node_bw):
    # FSDP accumulates in one of two ways: reduce-scatter after every micro-batch (gradients stay
    # sharded), or accumulate unsharded fp32 gradients and reduce once per step (+4P bytes, fewer
    # collectives). The second is tried when the first fits and needs several micro-batches.
    first = _evaluate_one(cfg, batch, ranks, strategy, mbs, dtype, inter_node_bw, False)
    if flags(strategy)['shard'] and 'step' in first and max(map(len, first['sizes'])) > 1:
        second = _evaluate_one(cfg, batch, ranks, strategy, mbs, dtype, inter_node_bw, True)
        if 'step' in second and second['step'] < first['step']:
            return second
    return first


def _evaluate_one(cfg, batch, ranks, strategy, mbs, dtype, inter_node_bw, accumulate):
    # One strategy on these ranks: caps, host check, split, predicted step time.
    f, R, n = flags(strategy), len(ranks), counts(cfg)
    per_node = Counter(r['node'] for r in ranks)
    used = lambda r, e: e['total'] + (e['host_rank'] if r['device'] == 'cpu' else 0)  # a CPU rank's RAM holds both
    est = lambda r, b, micro_batches=2: estimate(cfg, strategy, b, R, dtype, per_node[r['node']],
                                                 r['overhead'], r['device'], accumulate, micro_batches)
    caps, memo = [], {}
    for r in ranks:  # the largest micro-batch under the budget (totals grow with it)
        key = (r['device'], r['mem'], r['overhead'], per_node[r['node']])
        if key not in memo:
            budget, low, high = r['mem'] * r['fraction'], 0, batch
            while low < high:
                mid = (low + high + 1) // 2
                low, high = (mid, high) if used(r, est(r, mid)) <= budget else (low, mid - 1)
            # one rank whose whole batch is one micro-batch holds no gradients in its forward
            if R == 1 and low < batch and used(r, est(r, batch, micro_batches=1)) <= budget:
                low = batch
            memo[key] = low
        caps.append(memo[key])
    host_need = Counter()  # a node's host bytes: its GPU ranks' (CPU ranks count theirs in their budget)
    for r in ranks:
        host_need[r['node']] += est(r, 0)['host_rank'] * (r['device'] == 'cuda')
    host_ok = all(r['host_mem'] is None or host_need[r['node']] <= r['host_mem'] * r['fraction']
                                    for r in ranks)
    if mbs:
        caps = [min(mbs, batch) if c >= min(mbs, batch) else 0 for c in caps]
    result = dict(strategy=strategy, accumulate=accumulate, caps=caps, host_need=host_need, device_ok=min(caps) > 0, host_ok=host_ok,
                  need=[(used(r, est(r, max(1, mbs))), r['mem'] * r['fraction']) for r in ranks])
    if not (result['device_ok'] and host_ok):
        return result
    # Time. Compute: FLOPs at peak × EFFICIENCY per sequence, plus launches per micro-batch.
    fl = flops_per_sequence(cfg, f['ac'])
    c1 = [fl / (_peak(r, dtype) * EFFICIENCY) if _peak(r, dtype) else
          fl / (CPU_FLOPS if r['device'] == 'cpu' else _dev(r)['bf16'] * 1e12 * EFFICIENCY) for r in ranks]
    c0_mb = cfg.n_layer * LAUNCH_S + ((cfg.n_layer + 1) * FSDP_GROUP_S if f['shard'] else 0.0)
    mine = _sharded(n['block_shapes'], R) * cfg.n_layer + _sharded(n['root_shapes'], R) if f['shard'] else n['total']
    # Optimizer step: fused AdamW, memory bound, on the device; on the host under offload (or for
    # CPU ranks), where the ranks of a node share its memory bandwidth.
    on_host = lambda r: f['offload'] or r['device'] == 'cpu'
    # the optimizer step streams p, g and its state in, p and the state out; clipping reads g
    step_bytes = 16 + 2 * optimizer_state_bytes()
    opt = [step_bytes * mine * (per_node[r['node']] / HOST_ADAM_BW if on_host(r)
                                else 1 / (_dev(r)['hbm'] * 1e9 * HBM_EFFICIENCY)) for r in ranks]
    bw, ring = _bandwidth(ranks, inter_node_bw), (R - 1) / R
    cb = 4 if dtype in ('float32', 'fp32') else 2
    if not f['shard']:
        # DDP: each rank alone, then one all-reduce of the fp32 grads (ring: 2(N-1)/N of them),
        # overlapped with the backward (2/3) of the slowest rank's last micro-batch.
        share = split_batch(batch, opt, [c + c0_mb / m for c, m in zip(c1, caps)], [batch] * R)
        # no sequences: one forward and backward of one sequence × 0 (train.py's empty micro-batch)
        sizes = [micro_batches(k, m) or [0] for k, m in zip(share, caps)]
        busy = [sum(c0_mb + c * max(m, 1) for m in ms) + o for c, ms, o in zip(c1, sizes, opt)]
        slow = max(range(R), key=busy.__getitem__)
        allreduce = 2 * ring * 4 * n['total'] / bw
        step = busy[slow] + max(0.0, allreduce - 2 / 3 * (c0_mb + c1[slow] * max(sizes[slow][-1], 1)))
    else:
        # FSDP2 per micro-batch: all-gather of 16-bit weights (forward, and again for backward when
        # resharded) and a reduce-scatter of fp32 grads, each (N-1)/N of the model; under offload
        # the fp32 shards cross PCIe to the device before each all-gather and the grads back (one
        # rank too: no ring, the same copies).
        gathers = 2 if f['reshard_after_forward'] else 1
        pcie = min(_dev(r)['host'] for r in ranks) * 1e9 * PCIE_EFFICIENCY
        gather = ring * gathers * cb * n['total'] / bw + (gathers * 4 * mine / pcie if f['offload'] else 0)
        reduce = ring * 4 * n['total'] / bw + (4 * mine / pcie if f['offload'] else 0)
        # Offloaded and reduced after each micro-batch, every micro-batch but the first adds its
        # gradients to the host's: FSDP2 then copies them back synchronously (its add on the host
        # needs them) and adds on the CPU (read 2, write 1 fp32 per parameter): not overlapped.
        host_add = 0.0
        if f['offload'] and not accumulate:
            host_add = 4 * mine / pcie + 12 * mine * max(per_node.values()) / HOST_ADAM_BW
        # The same count K of micro-batches on every rank; each waits for the slowest rank's
        # piece, and prefetching overlaps the collectives with compute. Try K from the fewest up
        # while the caps still bind the split.
        best = None
        for K in range(math.ceil(batch / sum(caps)), batch + 1):
            share = split_batch(batch, [c0_mb] * R, c1, caps, count=K)
            sizes = [micro_batches(x, m, K) for x, m in zip(share, caps)]
            comm = [gather + (reduce if not accumulate or j == K - 1 else 0) for j in range(K)]
            compute = [max(c0_mb + c * max(ms[j], 1) for c, ms in zip(c1, sizes)) for j in range(K)]
            t = sum(max(comm[j], compute[j]) + (host_add if j else 0.0) for j in range(K)) + max(opt)
            if best is None or t < best[0]:
                best = (t, share, sizes)
            if all(x < K * m for x, m in zip(share, caps)):  # no rank is full: more micro-batches only cost
                break
        step, share, sizes = best
        # the root group (tied embeddings) is gathered before anything can run and reduced after
        # everything has: its collectives are exposed
        step += ring * (cb + 4) * n['root'] / bw if R > 1 else 0.0
    predicted = [est(r, max(max(ms), 1), len(ms)) for r, ms in zip(ranks, sizes)]
    peaks = [_peak(r, dtype) for r in ranks]
    mfu = batch * flops_per_sequence(cfg) / step / sum(peaks) if all(peaks) else None
    result.update(share=share, sizes=sizes, predicted=predicted, step=step, mfu=mfu,
                  tokens_per_sec=batch * cfg.block_size / step)
    return result


def _grow(ranks, k):
    # The same mix of devices k times over, with the nodes filled as now (8 per node if one).
    per = max(Counter(r['node'] for r in ranks).values())
    per = 8 if len({r['node'] for r in ranks}) == 1 and per < 8 else per
    return [dict(r, node=i // per) for i, r in enumerate(ranks * k)]


def _advice(cfg, batch, ranks, plan, mbs, dtype, inter_node_bw, results):
    # What would make it fit, computed: more host memory (offload), more of the same GPUs, a
    # shorter sequence. (The global batch never matters: accumulation reaches any batch.)
    tried = [s for s in STRATEGIES if plan in ('auto', s)]
    # why: the rung that comes closest on the device, and the host memory of the offload rungs
    why = ''
    if not any(r['device_ok'] for r in results):
        worst = [(max(range(len(ranks)), key=lambda i: r['need'][i][0] / r['need'][i][1]), r) for r in results]
        i, r = min(worst, key=lambda w: w[1]['need'][w[0]][0] / w[1]['need'][w[0]][1])
        why = (f"{r['strategy']} needs {r['need'][i][0] / GiB:,.1f} GiB on rank {i} ({ranks[i]['gpu'] or 'cpu'}) at "
               f"{max(1, mbs)} sequence(s) per micro-batch, budget {r['need'][i][1] / GiB:,.1f}")
    for r in results:
        if r['device_ok'] and not r['host_ok']:
            node = max(r['host_need'], key=r['host_need'].get)
            host_mem = next(x['host_mem'] for x in ranks if x['node'] == node)
            why += (f"{r['strategy']} fits the device but needs {r['host_need'][node] / GiB:,.0f} GiB of host memory "
                    f"on node {node}, budget {host_mem * ranks[0]['fraction'] / GiB:,.0f}")
            break
    ways, needs = [], {}
    for r in results:
        if r['strategy'] in tried and flags(r['strategy'])['offload'] and r['device_ok']:
            host = max(r['host_need'].values()) / ranks[0]['fraction']
            if host < needs.get('host_mem_per_node', math.inf):
                needs['host_mem_per_node'] = host
                ways.append(f"host memory >= {host / GiB:,.0f} GiB per node ({r['strategy']})")
    if all(r['device'] == 'cuda' for r in ranks) and (plan == 'auto' or flags(plan)['shard']):
        fits = lambda k: any('step' in _evaluate(cfg, batch, _grow(ranks, k), s, mbs, dtype, inter_node_bw)
                             for s in tried)
        lo, hi = 1, 2
        while hi * len(ranks) <= 4096 and not fits(hi):
            lo, hi = hi, hi * 2
        if hi * len(ranks) <= 4096:
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (lo, mid) if fits(mid) else (mid, hi)
            grown = _grow(ranks, hi)
            mix = ' + '.join(f"{c}×{g}" for g, c in Counter(r['gpu'] or 'GPU' for r in grown).items())
            needs['gpus'] = len(grown)
            ways.append(f"{mix} ({len({r['node'] for r in grown})} node(s), same host memory per node)")
    for s in tried:  # the states fit but not one sequence: the longest block_size that would
        r = next(r for r in results if r['strategy'] == s)
        if r['host_ok'] and not r['device_ok']:
            ok = lambda t: _evaluate(replace(cfg, block_size=t), 1, ranks, s, 0, dtype, inter_node_bw)['device_ok']
            lo, hi = 0, cfg.block_size
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if ok(mid) else (lo, mid)
            if lo > 0 and lo > needs.get('block_size', 0):
                needs['block_size'] = lo
                ways.append(f"block_size <= {lo} ({s})")
    text = f"{why}." + (" Would fit with: " + '; or '.join(ways) if ways else '')
    return text, needs


def make_plan(model_config, batch_size, ranks, plan='auto', micro_batch_size=0, memory_fraction=0.9,
              dtype='bfloat16', inter_node_bw=None):
    # ranks: one dict per rank: device 'cuda'|'cpu', gpu (GPUS key or None), mem (device bytes the
    # rank may use; a CPU rank: its share of host memory), host_mem (its node's host bytes, None =
    # not checked), node, overhead (bytes outside PyTorch's allocator; None = default), flops (optional
    # measured FLOP/s). Every candidate that fits is timed; the fastest wins (ties: lower rung).
    cfg = _config(model_config)
    ranks = _normalise(ranks, memory_fraction)
    dtype = str(dtype).replace('torch.', '')
    assert plan == 'auto' or plan in STRATEGIES, f"plan={plan!r}: choose auto or one of {', '.join(STRATEGIES)}"
    tried = STRATEGIES if plan == 'auto' else (plan,)
    if not optimizer_updates_shards_alone():
        if flags(tried[0])['shard'] and plan != 'auto':
            die(f"plan={plan}: model.make_optimizer's update of a matrix is not the update of its "
                f"row shards (FSDP would change it): use plan=ddp or plan=ddp+ac")
        tried = tuple(s for s in tried if not flags(s)['shard'])
    results = [_evaluate(cfg, batch_size, ranks, s, micro_batch_size, dtype, inter_node_bw) for s in tried]
    feasible = [r for r in results if 'step' in r]
    best = min(feasible, key=lambda r: r['step']) if feasible else None
    advice, needs = '', {}
    if best is None:
        advice, needs = _advice(cfg, batch_size, ranks, plan, micro_batch_size, dtype, inter_node_bw, results)
        if plan != 'auto':
            auto = make_plan(cfg, batch_size, ranks, 'auto', micro_batch_size, memory_fraction, dtype, inter_node_bw)
            if auto.fits:
                advice, needs['plan'] = advice + f" plan=auto fits ({auto.strategy}).", auto.strategy
        best = dict(results[-1])  # the last rung tried, shown at one sequence per rank
        best.update(share=[0] * len(ranks), sizes=[[1]] * len(ranks), step=0.0, tokens_per_sec=0.0, mfu=None,
                    predicted=[estimate(cfg, best['strategy'], 1, len(ranks), dtype,
                                        Counter(x['node'] for x in ranks)[r['node']], r['overhead'], r['device'])
                               for r in ranks])
    elif any(r['host_mem'] is None for r in ranks) and flags(best['strategy'])['offload']:
        advice = "host memory not given: not checked"
    f = flags(best['strategy'])
    p = Plan(strategy=best['strategy'], **f, reduce_every_micro_batch=f['shard'] and not best['accumulate'],
             micro_batch=best['caps'], share=best['share'], accum=[len(m) for m in best['sizes']], micro_batches=best['sizes'],
             predicted=best['predicted'], step_time=best['step'], tokens_per_sec=best['tokens_per_sec'],
             mfu=best['mfu'], fits=bool(feasible), advice=advice, needs=needs, ranks=ranks,
             batch_size=batch_size, block_size=cfg.block_size, n_params=counts(cfg)['total'], dtype=dtype,
             candidates=[(r['strategy'], 'step' in r, r.get('step')) for r in results], config=cfg)
    return p


# -----------------------------------------------------------------------------
# Dry run
def _cluster(gpus, nodes, host_mem):
    # '4xA100-80GB,4xV100-32GB' -> ranks spread evenly over nodes (default: 8 GPUs per node)
    kinds = []
    for item in gpus.split(','):
        m = re.fullmatch(r'(?:(\d+)x)?(.+)', item.strip())
        key = m and ('cpu' if m[2].lower() == 'cpu' else gpu_key(m[2]))
        if key is None or int(m[1] or 1) < 1:
            die(f"--gpus: cannot read {item!r}; write COUNTxNAME (COUNT >= 1) with NAME one of "
                f"{', '.join(GPUS)}, or cpu (with --host_mem)")
        if key == 'cpu' and not host_mem:
            die(f"--gpus {item}: CPU ranks need --host_mem (GiB per node), their memory")
        kinds += [key] * int(m[1] or 1)
    if nodes > len(kinds):
        die(f"--nodes {nodes} but --gpus {gpus} has {len(kinds)} ranks: at least one per node")
    nodes = nodes or math.ceil(len(kinds) / 8)
    per = math.ceil(len(kinds) / nodes)
    host = host_mem * GiB if host_mem else None
    return [dict(device='cpu', gpu=None, node=i // per, host_mem=host, mem=host // per if host else None)
            if g == 'cpu' else dict(device='cuda', gpu=g, node=i // per, host_mem=host)
            for i, g in enumerate(kinds)]


class ArgumentParser(argparse.ArgumentParser):
    def error(self, message):  # one line, as every other mistake (argparse prints the usage too)
        die(f"{message} (python plan.py -h for help)")


def main(argv=None):
    # Returns 0 when the config fits, 1 when it does not; a mistake in the arguments exits 2.
    t0 = time.time()
    ap = ArgumentParser(
        description="Does a GPT config fit these GPUs, and how? (meta device, no GPU needed)")
    ap.add_argument('config', nargs='+', help="configs/*.py, and --key=value overrides of the model or batch")
    ap.add_argument('--gpus', default='1xH200', help="e.g. 16xA100-80GB or 4xA100-80GB,4xV100-32GB or 2xcpu")
    ap.add_argument('--host_mem', type=float, default=None, help="host memory per node, GiB (default: not checked)")
    ap.add_argument('--nodes', type=int, default=0)
    ap.add_argument('--plan', default='auto', choices=('auto',) + STRATEGIES)
    ap.add_argument('--micro_batch_size', type=int, default=0)
    ap.add_argument('--memory_fraction', type=float, default=0.9)
    ap.add_argument('--dtype', default='bfloat16', choices=('bfloat16', 'float16', 'float32'))
    ap.add_argument('--inter_node_gbs', type=float, default=None,
                    help="GB/s per GPU between nodes (default: the GPU's reference system, GPUS 'net')")
    args, rest = ap.parse_known_args(argv)
    for name, ok, want in (  # (nan and inf fail these comparisons)
            ('host_mem', args.host_mem is None or 0 < args.host_mem < math.inf, 'a number > 0'),
            ('nodes', args.nodes >= 0, '>= 0 (0: 8 GPUs per node)'),
            ('micro_batch_size', args.micro_batch_size >= 0, ">= 0 (0: the planner's choice)"),
            ('memory_fraction', 0 < args.memory_fraction <= 1, 'in (0, 1]'),
            ('inter_node_gbs', args.inter_node_gbs is None or 0 < args.inter_node_gbs < math.inf,
             'a number > 0')):
        if not ok:
            die(f"--{name} {getattr(args, name)}: must be {want}")
    for a in args.config + rest:
        if not (a.startswith('--') or a.endswith('.py')):
            die(f"{a!r}: give config files (configs/*.py) and --key=value overrides")
    defaults = {f.name: f.default for f in fields(GPTConfig)} | dict(batch_size=1)
    rules = dict(block_size='> 0', vocab_size='> 0', n_layer='> 0', n_head='> 0', n_embd='> 0',
                 dropout='[0, 1)', bias='', init_std='> 0', batch_size='> 0')
    config = configure(defaults, args.config + rest, strict_files=False, rules=rules)
    if config['n_embd'] % config['n_head']:
        die(f"n_embd={config['n_embd']} is not divisible by n_head={config['n_head']}")
    ranks = _cluster(args.gpus, args.nodes, args.host_mem)
    p = make_plan(config_from(config), config['batch_size'], ranks, plan=args.plan,
                  micro_batch_size=args.micro_batch_size, memory_fraction=args.memory_fraction,
                  dtype=args.dtype, inter_node_bw=args.inter_node_gbs and args.inter_node_gbs * 1e9)
    print(p.table())
    print(f"({time.time() - t0:.1f} s)")
    return 0 if p.fits else 1


if __name__ == '__main__':
    sys.exit(main())
