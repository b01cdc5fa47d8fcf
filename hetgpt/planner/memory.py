"""
The memory estimator: the bytes one rank holds at the peak of a training step under a strategy
(DDP or FSDP2, with or without per-block activation checkpointing and CPU offload), by part
(parameters, gradients, optimizer state, activations, the rest), on its device and on its host.
Everything is derived from the model built on the meta device and measured on fake tensors
(hetgpt/planner/costs.py: exact parameter shapes, saved bytes, optimizer state); the planner searches
with it, and train.py's probe step checks it.
Notation: P parameters, N ranks, L layers, h width, s sequence, b micro-batch, V vocabulary.
"""
import math

from hetgpt.knobs import dtype_name, flags
from hetgpt.planner import costs
from hetgpt.planner.costs import activation_bytes, counts, optimizer_state_bytes
from model import LOSS_CHUNK

GiB = 2**30

# Guesses that a probe step replaces; each is what the dry run assumes.
GPU_OVERHEAD = GiB     # outside the allocator: CUDA context, NCCL buffers (unless measured)
PROCESS_HOST = 2 * GiB  # host bytes of one training process (Python, torch, CUDA host state)
CPU_OVERHEAD = GiB // 2  # a CPU rank's process before any tensor
ALLOC_SLACK = 0.05     # a CPU rank: malloc's arenas and fragmentation, of what comes and goes
# glibc's own settings keep freed blocks resident for reuse: a CPU step's peak RSS was up to 1.88×
# the live bytes predicted (bench/glibc_slack.py; bench/RESULTS.md, "The CPU step and glibc's
# allocator")
GLIBC_SLACK = 2.0
# A GPU's allocator, as train.py sets it (expandable_segments): each stream's two pools grow by
# pages, 20 MiB for blocks over 1 MiB and 2 MiB for the rest (c10/cuda/CUDACachingAllocator.cpp),
# and a page freed whole goes back before an out-of-memory, so what is lost to rounding is the
# last, partly used page of each pool of each stream that allocates: the compute stream's, and
# under FSDP2 its all-gather copy-in, all-gather and reduce-scatter streams' (blocks are rounded
# to 512 bytes: under 2 MB for the 4,000 tensors of a 96-layer model's states, left out).
ALLOC_PAGES = (20 + 2) * 2**20
ALLOC_STREAMS = {False: 1, True: 4}  # by whether the strategy shards (FSDP2)


# -----------------------------------------------------------------------------
# FSDP2's layout of the parameters
def sharded(shapes, n):
    # FSDP2 shards each parameter on dim 0, padded to a multiple of n: a rank holds ceil(d0/n) rows
    return sum(math.ceil(s[0] / n) * math.prod(s[1:]) for s in shapes)


def optimizer_state(cfg, N, shard):
    # The optimizer's state on one rank: each parameter's (its shard's) elements at what
    # model.make_optimizer keeps for that parameter (costs.optimizer_state_bytes, measured)
    n = counts(cfg)
    size = (lambda s: math.ceil(s[0] / N) * math.prod(s[1:])) if shard else math.prod
    block, root = optimizer_state_bytes(cfg)
    return (n['layers'] * sum(b * size(s) for b, s in zip(block, n['block_shapes']))
            + sum(b * size(s) for b, s in zip(root, n['root_shapes'])))


def _pinned(shapes, n):
    # Pinned host bytes of the fp32 shards: the CUDA caching host allocator rounds every block up
    # to a power of two (FSDP2 pins each parameter's shard, and each gradient copied back to it).
    return sum(1 << (4 * math.ceil(s[0] / n) * math.prod(s[1:]) - 1).bit_length() for s in shapes)


def held(device, e):
    # The bytes a rank's budget holds of an estimate: a CPU rank's RAM its device and host bytes
    return e['total'] + (e['host_rank'] if device == 'cpu' else 0)


# -----------------------------------------------------------------------------
# The estimator: bytes on one rank
def estimate(cfg, strategy, micro_batch, world_size, dtype='bfloat16', ranks_per_node=None,
             overhead=None, device='cuda', accumulate=False, micro_batches=2):
    n, f = counts(cfg), flags(strategy)
    N, b, s, h, L, V = (world_size, micro_batch, cfg.block_size, cfg.n_embd, cfg.n_layer,
                        cfg.vocab_size)
    P, Pb, Pr = n['total'], n['block'], n['root']
    cb = 4 if dtype_name(dtype) in ('float32', 'fp32') else 2  # compute dtype bytes
    # Model states: fp32 params 4 + fp32 grads 4 + the optimizer's state (measured; AdamW's 8 makes
    # ZeRO's 16 B/param). DDP (gradient_as_bucket_view: the grads are the buckets) keeps them all;
    # FSDP2 shards all three by N (fp32 shards; reduce_dtype fp32).
    mine = sharded(n['block_shapes'], N) * L + sharded(n['root_shapes'], N) if f['shard'] else P
    optim = round(optimizer_state(cfg, N, f['shard']))
    part = dict(params=4 * mine, grads=4 * mine, optim=optim)
    # FSDP2 accumulating without sync (set_requires_gradient_sync(False)) keeps every parameter's
    # gradient unsharded in reduce_dtype (fp32) on the device until the reduce-scatter
    unsharded_grads = 4 * P if f['shard'] and accumulate else 0
    host_rank = 0 if device == 'cpu' else PROCESS_HOST
    if f['offload']:  # CPUOffloadPolicy: shards on the host, pinned params and grads; AdamW there
        host_rank += (_pinned(n['block_shapes'], N) * L + _pinned(n['root_shapes'], N)) * 2 + optim
        part = dict(params=0, grads=0, optim=0)
    part['grads'] += unsharded_grads
    a = activation_bytes(cfg, strategy, dtype)
    # The loss (model.LMHeadLoss) never holds the micro-batch's logits: one chunk of them at a time
    # (compute dtype; float32, its log-softmax and autograd's gradient of it) and the gradients of
    # a group of chunks (one buffer, compute dtype) come and go in its forward; its backward
    # scales the head's float32 gradient.
    rows, group = LOSS_CHUNK[device]  # (the planner's ranks are 'cuda' or 'cpu')
    tokens = b * s
    logits = max(min(rows, tokens) * V * (cb + 12) + min(group, tokens) * V * cb, 4 * V * h)
    # Activations: what autograd saves, measured per sequence (saved_bytes), kept by every block
    # (under ac: each block's input), and at the peak either the loss's
    # working set with the rest's saved bytes, or later the working set of the top block's
    # backward (backward_bytes: beside its saved tensors, or all of them recomputed under
    # ac, the gradients of its wide intermediates) with the one saved tensor of the
    # loss that outlives its backward: its float32 gradient of the head, now the tied weight's.
    kept = L * b * (a['block_input'] if f['ac'] else a['block'])
    backward = max(b * per + fixed for per, fixed in a['backward']['ac' if f['ac'] else 'plain'])
    activations = kept + max(b * a['rest'] + a['rest_fixed'] + logits, a['rest_fixed'] + backward)
    if not f['shard']:
        # autocast's 16-bit copies of the weights, saved for backward (under AC: made again by the
        # recompute, in its working set; train.py's autocast keeps no cache of them)
        buffers = 0 if f['ac'] else a['block_fixed'] * L
    else:
        # FSDP2 buffers: the root group is never resharded after forward, and the tied
        # wte/lm_head gradient lives through the whole backward (params + grads unsharded); the
        # blocks: current + prefetched unsharded (all of them from forward to backward without
        # resharding); one block's unsharded grad plus its fp32 copy for the reduce-scatter;
        # under offload the fp32 shards of two blocks copied to the device before their all-gather.
        reduce = 4 if cb == 2 else 0
        live = 2 * cb * Pb if f['reshard_after_forward'] else cb * L * Pb
        buffers = 2 * cb * Pr + live + (cb + reduce) * Pb + \
            (8 * math.ceil(Pb / N) if f['offload'] else 0)
    if overhead is None:
        overhead = GPU_OVERHEAD if device == 'cuda' else CPU_OVERHEAD
    slack = ALLOC_STREAMS[f['shard']] * ALLOC_PAGES if device == 'cuda' else \
        ALLOC_SLACK * (activations + buffers)
    other = buffers + slack + overhead
    part.update(activations=activations, other=int(other))
    # The peak, not the sum of the parts: activations are freed as backward makes the gradients,
    # so both are held at once only when gradients outlive a step's forward: earlier micro-batches'
    # (micro_batches > 1, FSDP's unsharded accumulation) or DDP's buckets (several ranks).
    held = micro_batches > 1 or accumulate or (N > 1 and not f['shard'])
    grads_and_activations = part['grads'] + activations if held else max(part['grads'], activations)
    part['total'] = part['params'] + part['optim'] + int(other) + grads_and_activations
    # The optimizer step, the activations gone: its temporaries (costs.step_bytes, measured; a
    # shard's are its share) beside the states, on the host under offload
    temporaries = costs.step_bytes_of(cfg) / (N if f['shard'] else 1)
    if f['offload']:
        host_rank += temporaries
    else:
        part['total'] = max(part['total'], sum(part[k] for k in ('params', 'grads', 'optim'))
                            + int(other) + int(temporaries))
    part['host_rank'] = host_rank
    part['host'] = host_rank * (ranks_per_node or min(N, 8))
    return part

