"""
The memory estimator: the bytes one rank holds at the peak of a training
step under a strategy (DDP or FSDP2, with or without per-block activation
checkpointing and CPU offload), by part (parameters, gradients, optimizer
state, activations, the rest), on its device and on its host. Everything
is derived from the model built on the meta device and measured on fake
tensors (hetgpt/planner/costs.py: exact parameter shapes, saved bytes,
optimizer state); the planner searches with it, and train.py's probe step
checks it.
Notation: P parameters, N ranks, L layers, h width, s sequence, b
micro-batch, V vocabulary.
"""
import functools
import itertools
import math

from hetgpt.knobs import dtype_name, flags
from hetgpt.planner import costs
from hetgpt.planner.costs import (activation_bytes, counts,
                                  optimizer_state_bytes)
from hetgpt.owners import owners
from model import LOSS_CHUNK

GiB = 2**30

# Guesses that a probe step replaces; each is what the dry run assumes.
# outside the allocator: CUDA context, NCCL buffers (unless measured)
GPU_OVERHEAD = GiB
# host bytes of one training process (Python, torch, CUDA host state)
PROCESS_HOST = 2 * GiB
CPU_OVERHEAD = GiB // 2  # a CPU rank's process before any tensor
# a CPU rank: malloc's arenas and fragmentation, of what comes and goes
ALLOC_SLACK = 0.05
# glibc's own settings keep freed blocks resident for reuse: a CPU step's
# peak RSS was up to 1.88× the live bytes predicted (bench/glibc_slack.py;
# bench/RESULTS.md, "The CPU step and glibc's allocator")
GLIBC_SLACK = 2.0
# A GPU's allocator, as train.py sets it (expandable_segments): each
# stream's two pools grow by pages, 20 MiB for blocks over 1 MiB and 2 MiB
# for the rest (c10/cuda/CUDACachingAllocator.cpp), and a page freed whole
# goes back before an out-of-memory, so what is lost to rounding is the
# last, partly used page of each pool of each stream that allocates: the
# compute stream's, and under FSDP2 its all-gather copy-in, all-gather and
# reduce-scatter streams' (blocks are rounded to 512 bytes: under 2 MB for
# the 4,000 tensors of a 96-layer model's states, left out).
ALLOC_PAGES = (20 + 2) * 2**20
# by whether the strategy shards (FSDP2)
ALLOC_STREAMS = {False: 1, True: 4}


# -----------------------------------------------------------------------------
# FSDP2's layout of the parameters
def sharded(shapes, n):
    """The elements of a rank's shards of parameters of these shapes.

    FSDP2 shards each parameter on dim 0, padded to a multiple of n: a
    rank holds ceil(d0/n) rows.
    """
    return sum(math.ceil(s[0] / n) * math.prod(s[1:]) for s in shapes)


def _elements(shape, N, shard):
    """A parameter's elements on a rank: its shard's if shard, else all."""
    if shard:
        return math.ceil(shape[0] / N) * math.prod(shape[1:])
    return math.prod(shape)


def whole_matrices(cfg):
    """The matrices whose update needs them whole, as [(elements, part,
    index)]: part 'block' (each layer's) or 'root', index in _shapes'
    order (costs.optimizer_whole). Every layer's, in model order."""
    n = counts(cfg)
    block, root = costs.optimizer_whole(cfg)
    out = []
    for _ in range(n['layers']):
        out += [(math.prod(s), 'block', i)
                for i, (s, w) in enumerate(zip(n['block_shapes'], block))
                if w]
    out += [(math.prod(s), 'root', i)
            for i, (s, w) in enumerate(zip(n['root_shapes'], root)) if w]
    return out


@functools.lru_cache(maxsize=None)
def owners_of(sizes, N):
    """owners.owners(sizes, N), in time that does not grow with N.

    sizes: a tuple. Where there are more ranks than matrices each
    matrix, largest first, goes to the next empty rank: the same owners
    as among len(sizes) ranks. Cached: the search asks again and again.
    """
    return tuple(owners(list(sizes), max(1, min(N, len(sizes)))))


def optimizer_state(cfg, N, shard):
    """The optimizer's state on one rank, in bytes.

    Each parameter's (its shard's) elements at what model.make_optimizer
    keeps for that parameter (costs.optimizer_state_bytes, measured).
    Under FSDP2 (shard) a matrix whose update needs it whole
    (costs.optimizer_whole: Muon's) keeps its whole state on its owner
    alone (hetgpt/owners.py): the rank that owns the most.
    """
    n = counts(cfg)
    block, root = optimizer_state_bytes(cfg)
    whole, mats = ((), ()), []
    if shard:
        whole, mats = costs.optimizer_whole(cfg), whole_matrices(cfg)
    per_block = sum(b * _elements(s, N, shard)
                    for b, s, w in itertools.zip_longest(
                        block, n['block_shapes'], whole[0]) if not w)
    per_root = sum(b * _elements(s, N, shard)
                   for b, s, w in itertools.zip_longest(
                       root, n['root_shapes'], whole[1]) if not w)
    rank = [0] * max(1, min(N, len(mats)))  # (owners_of's ranks)
    per = dict(block=block, root=root)
    sizes = tuple(size for size, _, _ in mats)
    for (size, part, i), r in zip(mats, owners_of(sizes, N)):
        rank[r] += per[part][i] * size
    return n['layers'] * per_block + per_root + max(rank, default=0)


def _pinned(shapes, n):
    """Pinned host bytes of the fp32 shards of parameters of these shapes.

    The CUDA caching host allocator rounds every block up to a power of
    two (FSDP2 pins each parameter's shard, and each gradient copied
    back to it).
    """
    total = 0
    for s in shapes:
        nbytes = 4 * math.ceil(s[0] / n) * math.prod(s[1:])
        total += 1 << (nbytes - 1).bit_length()
    return total


def held(device, e):
    """The bytes a rank's budget holds of an estimate e.

    A CPU rank's RAM holds its device and its host bytes.
    """
    if device == 'cpu':
        return e['total'] + e['host_rank']
    return e['total']


# -----------------------------------------------------------------------------
# The estimator: bytes on one rank
def estimate(cfg, strategy, micro_batch, world_size, dtype='bfloat16',
             ranks_per_node=None, overhead=None, device='cuda',
             accumulate=False, micro_batches=2):
    """The bytes one rank holds at the peak of a step, by part.

    {params, grads, optim, activations, other, total} on the device, and
    host_rank (this rank's host bytes) and host (its node's, for
    ranks_per_node ranks, else min(N, 8)). micro_batches: how many a
    step runs; accumulate: FSDP2 accumulating without sync; overhead:
    the bytes outside the tensors where measured (else GPU_OVERHEAD or
    CPU_OVERHEAD).
    """
    n, f = counts(cfg), flags(strategy)
    N, b, s = world_size, micro_batch, cfg.block_size
    h, L, V = cfg.n_embd, cfg.n_layer, cfg.vocab_size
    P, Pb, Pr = n['total'], n['block'], n['root']
    cb = 2  # compute dtype bytes
    if dtype_name(dtype) in ('float32', 'fp32'):
        cb = 4
    # Model states: fp32 params 4 + fp32 grads 4 + the optimizer's state
    # (measured; AdamW's 8 makes ZeRO's 16 B/param). DDP
    # (gradient_as_bucket_view: the grads are the buckets) keeps them
    # all; FSDP2 shards all three by N (fp32 shards; reduce_dtype fp32).
    if f['shard']:
        mine = sharded(n['block_shapes'], N) * L \
            + sharded(n['root_shapes'], N)
    else:
        mine = P
    optim = round(optimizer_state(cfg, N, f['shard']))
    part = dict(params=4 * mine, grads=4 * mine, optim=optim)
    # FSDP2 accumulating without sync (set_requires_gradient_sync(False))
    # keeps every parameter's gradient unsharded in reduce_dtype (fp32) on
    # the device until the reduce-scatter
    unsharded_grads = 0
    if f['shard'] and accumulate:
        unsharded_grads = 4 * P
    host_rank = PROCESS_HOST
    if device == 'cpu':
        host_rank = 0
    if f['offload']:
        # CPUOffloadPolicy: shards on the host, pinned params and grads;
        # AdamW there
        pinned = _pinned(n['block_shapes'], N) * L \
            + _pinned(n['root_shapes'], N)
        host_rank += pinned * 2 + optim
        part = dict(params=0, grads=0, optim=0)
    part['grads'] += unsharded_grads
    a = activation_bytes(cfg, strategy, dtype)
    # The loss (model.LMHeadLoss) never holds the micro-batch's logits:
    # one chunk of them at a time (compute dtype; float32, its
    # log-softmax and autograd's gradient of it) and the gradients of a
    # group of chunks (one buffer, compute dtype) come and go in its
    # forward; its backward scales the head's float32 gradient.
    # (the planner's ranks are 'cuda' or 'cpu')
    rows, group = LOSS_CHUNK[device]
    tokens = b * s
    chunk = min(rows, tokens) * V * (cb + 12)
    grads = min(group, tokens) * V * cb
    logits = max(chunk + grads, 4 * V * h)
    # Activations: what autograd saves, measured per sequence
    # (saved_bytes), kept by every block (under ac: each block's input),
    # and at the peak either the loss's working set with the rest's saved
    # bytes, or later the working set of the top block's backward
    # (backward_bytes: beside its saved tensors, or all of them
    # recomputed under ac, the gradients of its wide intermediates) with
    # the one saved tensor of the loss that outlives its backward: its
    # float32 gradient of the head, now the tied weight's.
    if f['ac']:
        kept = L * b * a['block_input']
        lines = a['backward']['ac']
    else:
        kept = L * b * a['block']
        lines = a['backward']['plain']
    backward = max(b * per + fixed for per, fixed in lines)
    loss = b * a['rest'] + a['rest_fixed'] + logits
    activations = kept + max(loss, a['rest_fixed'] + backward)
    if not f['shard']:
        # autocast's 16-bit copies of the weights, saved for backward
        # (under AC: made again by the recompute, in its working set;
        # train.py's autocast keeps no cache of them)
        buffers = 0
        if not f['ac']:
            buffers = a['block_fixed'] * L
    else:
        # FSDP2 buffers: the root group is never resharded after
        # forward, and the tied wte/lm_head gradient lives through the
        # whole backward (params + grads unsharded); the blocks: current
        # + prefetched unsharded (all of them from forward to backward
        # without resharding); one block's unsharded grad plus its fp32
        # copy for the reduce-scatter; under offload the fp32 shards of
        # two blocks copied to the device before their all-gather.
        reduce = 0
        if cb == 2:
            reduce = 4
        if f['reshard_after_forward']:
            live = 2 * cb * Pb
        else:
            live = cb * L * Pb
        buffers = 2 * cb * Pr + live + (cb + reduce) * Pb
        if f['offload']:
            buffers += 8 * math.ceil(Pb / N)
    if overhead is None:
        overhead = CPU_OVERHEAD
        if device == 'cuda':
            overhead = GPU_OVERHEAD
    if device == 'cuda':
        slack = ALLOC_STREAMS[f['shard']] * ALLOC_PAGES
    else:
        slack = ALLOC_SLACK * (activations + buffers)
    other = buffers + slack + overhead
    part.update(activations=activations, other=int(other))
    # The peak, not the sum of the parts: activations are freed as
    # backward makes the gradients, so both are held at once only when
    # gradients outlive a step's forward: earlier micro-batches'
    # (micro_batches > 1, FSDP's unsharded accumulation) or DDP's
    # buckets (several ranks).
    together = micro_batches > 1 or accumulate \
        or (N > 1 and not f['shard'])
    if together:
        grads_and_activations = part['grads'] + activations
    else:
        grads_and_activations = max(part['grads'], activations)
    part['total'] = part['params'] + part['optim'] + int(other) \
        + grads_and_activations
    # The optimizer step, the activations gone: its temporaries
    # (costs.step_bytes, measured; a shard's are its share) beside the
    # states, on the host under offload. A matrix stepped whole under
    # FSDP2 (Muon's) is its owner's, one at a time: its step's
    # temporaries whole, and its gathered gradient and new weight
    # (float32) beside them.
    ways = 1
    if f['shard']:
        ways = N
    temporaries = costs.step_bytes_of(cfg) / ways
    if f['shard'] and whole_matrices(cfg):
        largest = max(size for size, _, _ in whole_matrices(cfg))
        temporaries = costs.step_bytes_of(cfg) + 8 * largest
    if f['offload']:
        host_rank += temporaries
    else:
        states = sum(part[k] for k in ('params', 'grads', 'optim'))
        part['total'] = max(part['total'],
                            states + int(other) + int(temporaries))
    part['host_rank'] = host_rank
    part['host'] = host_rank * (ranks_per_node or min(N, 8))
    return part
