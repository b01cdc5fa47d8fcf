"""
What a step of the model as built costs, measured rather than assumed:
parameter counts (the model on the meta device), the bytes autograd saves
for backward and the FLOPs of a block and of the rest (one forward and
backward on fake tensors), the bytes a block's backward holds beyond them,
the optimizer's state, whether it needs whole matrices, and its step's
matmuls (Muon's Newton-Schulz; steps of the optimizer train.py builds). A
researcher's edit to model.py (another MLP, attention, positions,
normalisation or optimizer) is planned right as is. No memory is
allocated; results are cached by shape, so a 175B config is measured in
seconds.
"""
import functools
import inspect
import itertools
import math
import weakref
from collections import Counter
from dataclasses import replace

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

# model.py as network, its names looked up at call time: a test may swap
# in a variant of a module
import model as network
from hetgpt import knobs
from hetgpt.errors import die, oneline

# Every function here takes the model's GPTConfig as it is (frozen, so
# hashable: the caches key on it).


# -----------------------------------------------------------------------------
# Parameter counts, exactly, from the model on the meta device
@functools.lru_cache(maxsize=None)
def _shapes(cfg):
    """Parameter shapes of one block and of the root FSDP group.

    The root: the rest (embeddings, tied wte/lm_head, ln_f). Read from
    the model built on the meta device; (block's, root's), each a tuple
    of shapes.
    """
    with torch.device('meta'):
        model = network.GPT(cfg)
    blocks = model.transformer.h
    in_blocks = {id(p) for b in blocks for p in b.parameters()}
    block = tuple(tuple(p.shape) for p in blocks[0].parameters())
    root = tuple(tuple(p.shape) for p in model.parameters()
                 if id(p) not in in_blocks)
    return block, root


def _numel(shapes):
    """The elements of parameters of these shapes, together."""
    return sum(math.prod(s) for s in shapes)


def counts(c):
    """The model's parameter counts: in all, a block's, the root's.

    Also each part's shapes (block_shapes, root_shapes) and the layers.
    """
    block, root = _shapes(replace(c, n_layer=1))
    return dict(total=c.n_layer * _numel(block) + _numel(root),
                block=_numel(block), root=_numel(root),
                block_shapes=block, root_shapes=root,
                layers=c.n_layer)


# -----------------------------------------------------------------------------
# What the model saves for backward and what its optimizer keeps, measured
# rather than assumed: a researcher's edit to model.py (another MLP,
# attention, normalisation) is planned right as is.
def storage_bytes(tensors, exclude):
    """The bytes of the tensors' storages, each once, but for exclude's.

    exclude: a set of StorageWeakRef.
    """
    seen = {}
    for t in tensors:
        ref = StorageWeakRef(t.untyped_storage())
        if ref not in exclude:
            seen[ref] = t.untyped_storage().nbytes()
    return sum(seen.values())


def _saved(fn, params, *inputs):
    """(saved bytes, output) of fn(*inputs).

    The bytes that autograd saves for backward while fn runs and still
    holds when it returns (each storage once; the parameters themselves
    are model states, not activations). Held: a graph made and freed
    inside fn (the loss's per-chunk autograd) saves nothing lasting.
    """
    packed = []

    def pack(t):
        """Note a weak reference to a saved tensor; save it as is."""
        packed.append(weakref.ref(t))
        return t

    hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
    with hooks:
        out = fn(*inputs)
    held = [t for t in (ref() for ref in packed) if t is not None]
    mine = {StorageWeakRef(p.untyped_storage()) for p in params}
    return storage_bytes(held, mine), out


def _fake(cfg, param_dtype, rest=False):
    """One block with parameters of param_dtype; (block, the rest) if rest.

    The rest: the model without blocks. Made in the caller's
    FakeTensorMode.
    """
    default = torch.get_default_dtype()
    torch.set_default_dtype(param_dtype)
    try:
        block = network.Block(cfg)
        if not rest:
            return block
        return block, network.GPT(replace(cfg, n_layer=0))
    finally:
        torch.set_default_dtype(default)


def _stream(param_dtype, autocast_dtype):
    """The dtype of the residual stream (float32 under autocast)."""
    if autocast_dtype is None:
        return param_dtype
    return torch.float32


@functools.lru_cache(maxsize=None)
def saved_bytes(cfg, param_dtype, autocast_dtype):
    """The bytes autograd saves for backward, per sequence and fixed.

    One block, and the rest (embeddings, ln_f, the loss), run forward on
    fake tensors at the real sequence length for micro-batches of 1 and
    2 sequences, under a dtype policy: float32; float32 weights under
    autocast (DDP); 16-bit weights (FSDP2's param_dtype). Saved bytes are
    affine in the micro-batch: per sequence, and fixed (autocast's 16-bit
    weight copies, the loss's float32 weight gradient). Also the bytes of
    a block's input per sequence, which is what ac (per-block activation
    checkpointing) keeps. No memory is allocated; cached by shape.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode
    s, h = cfg.block_size, cfg.n_embd
    autocast = torch.autocast('cpu', dtype=autocast_dtype,
                              enabled=autocast_dtype is not None)
    found = {}
    with FakeTensorMode():
        block, rest = _fake(cfg, param_dtype, rest=True)
        stream = _stream(param_dtype, autocast_dtype)
        for b in (1, 2):
            x = torch.empty(b, s, h, dtype=stream, requires_grad=True)
            idx = torch.zeros(b, s, dtype=torch.long)
            with autocast:
                found['block', b], y = _saved(
                    block, block.parameters(), x)
                found['rest', b], _ = _saved(
                    lambda i: rest(i, i), rest.parameters(), idx)
    per, fixed = {}, {}
    for k in ('block', 'rest'):
        per[k] = found[k, 2] - found[k, 1]
    for k in ('block', 'rest'):
        fixed[k] = found[k, 1] - per[k]
    return dict(block=per['block'], rest=per['rest'],
                block_fixed=fixed['block'],
                rest_fixed=fixed['rest'],
                block_input=y[:1].numel() * y.element_size())


class _LiveBytes(TorchDispatchMode):
    """The bytes of the storages alive after each op, in self.trace.

    Each storage once; those of `exclude`, and any made before this
    mode, left out. An op's inputs are still referenced when its outputs
    are counted: they do coexist.
    """

    def __init__(self, exclude):
        """exclude: a set of StorageWeakRef not to count."""
        super().__init__()
        self.exclude, self.live, self.trace = exclude, {}, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        """Run the op, note its outputs' storages, trace the live bytes."""
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                ref = StorageWeakRef(t.untyped_storage())
                if ref not in self.exclude:
                    nbytes = t.untyped_storage().nbytes()
                    self.live[ref] = nbytes
        self.trace.append(self.now())
        return out

    def now(self):
        """The bytes of the storages still alive (the freed forgotten)."""
        self.live = {ref: n for ref, n in self.live.items()
                     if not ref.expired()}
        return sum(self.live.values())


@functools.lru_cache(maxsize=None)
def backward_bytes(cfg, param_dtype, autocast_dtype):
    """The working set of one block's backward: {run: lines}.

    What saved bytes do not show: the live bytes while it runs (the
    incoming gradient, the gradients of the wide intermediates beside
    the saved tensors not yet freed, a weight gradient before it is
    added to its .grad) above the saved bytes it starts from; plain, and
    under ac as hetgpt/run/parallel.py applies it (its recompute
    included). Measured on fake tensors under the dtype policy of
    saved_bytes, after each op, for micro-batches of 1 and 2: each op's
    bytes are affine in the micro-batch, and which op peaks depends on
    it (a fixed weight gradient at 1 sequence, an activation's at 8), so
    this gives the lines (per sequence, fixed) whose maximum is the peak
    at any micro-batch. Cached by shape. The parameters' .grad exist
    before (DDP's buckets, accumulation): they are the model states'
    grads, not counted here.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.checkpoint import checkpoint
    found = {}
    with FakeTensorMode():
        block = _fake(cfg, param_dtype)
        for p in block.parameters():
            p.grad = torch.zeros_like(p)
        ac = functools.partial(checkpoint, block, use_reentrant=False)
        runs = dict(plain=block, ac=ac)
        stream = _stream(param_dtype, autocast_dtype)
        cases = itertools.product(runs.items(), (1, 2))
        for (name, run), b in cases:
            x = torch.empty(b, cfg.block_size, cfg.n_embd,
                            dtype=stream, requires_grad=True)
            # (x is the block input that the layer below made and ac
            # keeps; the output is the next block's input: both counted
            # elsewhere.) train.py's autocast: no cache.
            mine = [x] + [t for p in block.parameters()
                          for t in (p, p.grad)]
            live = _LiveBytes({StorageWeakRef(t.untyped_storage())
                               for t in mine})
            with live:
                with torch.autocast('cpu', dtype=autocast_dtype,
                                    cache_enabled=False,
                                    enabled=autocast_dtype is not None):
                    y = run(x)
                live.exclude.add(StorageWeakRef(y.untyped_storage()))
                start, live.trace = live.now(), []
                y.backward(torch.empty_like(y))
            found[name, b] = [n - start for n in live.trace]
            del x, y, live
    lines = {}
    for name in runs:
        one, two = found[name, 1], found[name, 2]
        if len(one) != len(two):
            # not the same ops at both sizes: the peaks' line alone
            one, two = [max(one)], [max(two)]
        pairs = {(y - x, 2 * x - y) for x, y in zip(one, two)}
        lines[name] = tuple(sorted(p for p in pairs if not any(
            q != p and q[0] >= p[0] and q[1] >= p[1] for q in pairs)))
    return lines


def _measured(measure, *args):
    """measure(*args), or one line that says why it cannot be measured.

    What cannot be measured cannot be planned.
    """
    try:
        return measure(*args)
    except Exception as e:
        die(f"the planner cannot run model.py's network on fake tensors "
            f"to measure it ({oneline(e)}): keep its forward free of "
            f"data-dependent Python (.item(), numpy)")


def policy(strategy, dtype):
    """(parameter dtype, autocast dtype) of a strategy in a compute dtype.

    As train.py runs them: FSDP2's 16-bit parameters, or DDP's float32
    ones under autocast.
    """
    dtype = knobs.dtype_name(dtype)
    halves = {'bfloat16': torch.bfloat16, 'float16': torch.float16}
    half = halves.get(dtype)
    if half is None:
        return torch.float32, None
    if strategy.startswith('fsdp'):
        return half, None
    return torch.float32, half


def activation_bytes(cfg, strategy, dtype):
    """saved_bytes, and backward_bytes as 'backward', for this config.

    Under the dtype policy train.py uses with this strategy.
    """
    p = policy(strategy, dtype)
    return dict(_measured(saved_bytes, cfg, *p),
                backward=_measured(backward_bytes, cfg, *p))


# The train.py knobs the plan is made for, beyond train.py's defaults
# (plan.py --optimizer=muon): make_optimizer is measured as built from them
GIVEN = {}


@functools.lru_cache(maxsize=None)
def _train_defaults():
    """train.py's knobs as written there (not run)."""
    return knobs.defaults_of(knobs.TRAIN_PY)


def train_knobs():
    """train.py's knobs as the plan is made for: model.make_optimizer's config.

    Its defaults, and what set_train_knobs gave (the optimizer's choice).
    """
    return dict(_train_defaults(), **GIVEN)


def set_train_knobs(config):
    """Measure make_optimizer as built from these knobs from now on.

    config: train.py's knobs that differ from its defaults (plan.py's
    --optimizer=muon). What was measured with the knobs before is
    forgotten.
    """
    if config == GIVEN:
        return
    GIVEN.clear()
    GIVEN.update(config)
    for measured in (optimizer_state_bytes, step_bytes, _whole,
                     _matmuls):
        measured.cache_clear()


def _small(cfg):
    """A model config of cfg's structure at a few thousand parameters.

    Its heads, biases and any field an edit added, kept; one layer, 8
    channels a head, 8 positions, 64 tokens.
    """
    return replace(cfg, n_layer=1, n_embd=8 * cfg.n_head, block_size=8,
                   vocab_size=64)


@functools.lru_cache(maxsize=None)
def optimizer_state_bytes(cfg):
    """Optimizer state per element of each parameter (AdamW: 8), measured.

    One training step with model.make_optimizer, the optimizer train.py
    builds, on a small model of cfg's structure; scalars such as AdamW's
    step count are left out. Per parameter, since make_optimizer may
    give each its own optimizer (Muon on the blocks' matrices: 4, AdamW
    on the rest: 8): (one block's, the root's), in the order of _shapes,
    which the small model's parameters share with the real one's (a
    small model of another structure would not: GPT-2's biases). (The
    step also loads what any step loads: torch's lazily imported
    modules, autograd's and the kernels' first buffers.)
    """
    net = network.GPT(_small(cfg), 0)
    optimizers = network.make_optimizer(net, train_knobs())
    idx = torch.arange(16).view(2, 8) % 64
    net(idx, idx)[1].backward()
    for opt in optimizers:
        opt.step()
    state = {p: st for opt in optimizers for p, st in opt.state.items()}
    per = {}
    for p in net.parameters():
        kept = [t for t in state.get(p, {}).values()
                if torch.is_tensor(t) and t.numel() > 1]
        per[id(p)] = storage_bytes(kept, set()) / p.numel()
    block = [id(p) for p in net.transformer.h[0].parameters()]
    return (tuple(per[i] for i in block),
            tuple(per[id(p)] for p in net.parameters()
                  if id(p) not in set(block)))


def _step_peak(cfg, layers, fake):
    """The peak live bytes of model.make_optimizer's second step.

    On a model of cfg at `layers` layers: on fake tensors if fake, else
    on the CPU. The weights, gradients and state are left out.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode
    if fake:
        where = FakeTensorMode()
    else:
        where = torch.device('cpu')
    with where:
        net = network.GPT(replace(cfg, n_layer=layers))
        for p in net.parameters():
            p.grad = torch.zeros_like(p)
        optimizers = network.make_optimizer(net, train_knobs())
        for opt in optimizers:  # (the first step makes the state)
            opt.step()
        mine = [t for p in net.parameters() for t in (p, p.grad)]
        mine += [t for opt in optimizers for st in opt.state.values()
                 for t in st.values() if torch.is_tensor(t)]
        live = _LiveBytes({StorageWeakRef(t.untyped_storage())
                           for t in mine})
        with live:
            for opt in optimizers:
                opt.step()
        return max(live.trace, default=0)


@functools.lru_cache(maxsize=None)
def step_bytes(cfg):
    """The optimizer step's temporaries: (per layer, fixed) bytes.

    The bytes live during model.make_optimizer's step beyond the
    weights, gradients and state (none for fused AdamW, which updates in
    place; Muon's Newton-Schulz products of the matrix it works on;
    foreach kernels' copies of a whole group), measured on fake tensors
    at the real shapes with 1 and 2 layers, float32 weights. An
    optimizer whose step reads a value (foreach AdamW's step count) is
    measured instead on a small model of cfg's structure (_small), per
    element.
    """
    try:
        one, two = _step_peak(cfg, 1, True), _step_peak(cfg, 2, True)
        return two - one, 2 * one - two
    except Exception:
        small = _small(cfg)
        one = _step_peak(small, 1, False)
        two = _step_peak(small, 2, False)
        n, real = counts(small), counts(cfg)
        return ((two - one) / n['block'] * real['block'],
                (2 * one - two) / n['root'] * real['root'])


def step_bytes_of(c):
    """The optimizer step's temporaries, in bytes, for config c."""
    per_layer, fixed = _measured(step_bytes, replace(c, n_layer=1))
    return c.n_layer * per_layer + fixed


def _per_part(net, value):
    """(one block's, the root's) values of a model's parameters.

    value(p) for each, in the order of _shapes.
    """
    block = list(net.transformer.h[0].parameters())
    mine = {id(p) for p in block}
    return (tuple(value(p) for p in block),
            tuple(value(p) for p in net.parameters() if id(p) not in mine))


def settings(opt, group):
    """A group's settings that opt's class takes (lr, momentum, ...)."""
    takes = inspect.signature(type(opt)).parameters
    return {k: v for k, v in group.items()
            if k in takes and k != 'params'}


def needs_whole(opt, group):
    """Whether opt's update of a matrix, with group's settings, is not
    the update of its row halves, each stepped alone.

    opt's class steps a random 8 × 6 matrix whole and as two halves (a
    generator of its own: the caller's random state is left as it was);
    an elementwise optimizer (AdamW, SGD) gives the same weights. The
    planner (optimizer_whole) and the run (hetgpt/run/whole_matrix.py)
    ask it.
    """
    draw = torch.Generator().manual_seed(0)
    whole = torch.nn.Parameter(torch.randn(8, 6, generator=draw))
    halves = [torch.nn.Parameter(h.clone())
              for h in whole.detach().split(4)]
    grad = torch.randn(8, 6, generator=draw)
    tries = (([whole], [grad]), (halves, grad.split(4)))
    for params, grads in tries:
        for p, g in zip(params, grads):
            p.grad = g.clone()
        type(opt)(params, **settings(opt, group)).step()
    joined = torch.cat([h.detach() for h in halves])
    return not torch.allclose(whole.detach(), joined, atol=1e-6)


def optimizer_whole(cfg):
    """Which parameters' update needs the whole matrix: (block's, root's).

    FSDP2 steps each rank's dim-0 shard of a matrix on its own. An
    elementwise optimizer (AdamW, SGD, Lion) updates the halves of a
    matrix as it updates the whole; one whose update needs the whole
    matrix (Muon's orthogonalisation) does not: under FSDP2 its owner
    (hetgpt/owners.py) steps it whole. Each optimizer that
    model.make_optimizer gives a matrix, with its group's settings, on a
    whole and on halves; per parameter, in the order of _shapes.
    """
    return _whole(cfg, network.make_optimizer)


@functools.lru_cache(maxsize=None)
def _whole(cfg, make_optimizer):
    """optimizer_whole, cached by the make_optimizer it measures.

    (A test that swaps model.make_optimizer is measured anew.)
    """
    net = network.GPT(_small(cfg), 0)
    whole = {}
    for opt in make_optimizer(net, train_knobs()):
        for group in opt.param_groups:
            matrices = [p for p in group['params'] if p.dim() == 2]
            if matrices:
                needs = needs_whole(opt, group)
                whole.update((id(p), needs) for p in matrices)
    return _per_part(net, lambda p: whole.get(id(p), False))


# one step's matmuls of an optimizer on a parameter, by (optimizer,
# settings, shape, dtype): a 96-layer model steps a few shapes
_STEPS = {}


def _step_matmuls(opt, group, shape):
    """The matmuls of one step of opt's kind on a float32 tensor alone.

    Of this shape, with group's settings, on a fake tensor (the
    caller's FakeTensorMode), recorded by _Work: sorted items.
    """
    given = settings(opt, group)
    key = (type(opt), repr(sorted(given.items())), shape)
    if key not in _STEPS:
        q = torch.nn.Parameter(torch.empty(shape))
        q.grad = torch.zeros_like(q)
        one = type(opt)([q], **given)
        with _Work() as work:
            one.step()
        _STEPS[key] = tuple(sorted(work.matmuls.items()))
    return _STEPS[key]


def optimizer_matmuls(cfg):
    """The matmuls of each parameter's optimizer step: (block's, root's).

    Muon's Newton-Schulz iterations on its matrix, none for an
    elementwise optimizer (AdamW): one step of the optimizer that
    model.make_optimizer gives the parameter (on a small model of cfg's
    structure, _small), with its group's settings, on a fake tensor of
    the real shape, recorded op by op as ((b, m, n, k, dtype), count)
    items; per parameter of a block and of the root, in the order of
    _shapes. No constant of any optimizer; cached by shape.
    """
    return _matmuls(cfg, network.make_optimizer)


@functools.lru_cache(maxsize=None)
def _matmuls(cfg, make_optimizer):
    """optimizer_matmuls, cached by the make_optimizer it measures."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    net = network.GPT(_small(cfg), 0)
    where = {id(p): (opt, group) for opt in make_optimizer(net, train_knobs())
             for group in opt.param_groups for p in group['params']}
    n = counts(cfg)
    real = (n['block_shapes'], n['root_shapes'])
    found = []
    try:
        with FakeTensorMode():
            for part, shapes in zip(_per_part(net, lambda p: id(p)), real):
                found.append(tuple(
                    _step_matmuls(*where[i], shape) if i in where else ()
                    for i, shape in zip(part, shapes)))
    except Exception as e:
        die(f"the planner cannot run model.make_optimizer's step on "
            f"fake tensors to measure it ({oneline(e)}): keep its "
            f"step free of data-dependent Python (.item())")
    return tuple(found)


@functools.lru_cache(maxsize=None)
def model_flops(cfg):
    """Training FLOPs of one sequence, counted: {part: FLOPs}.

    Counted (FlopCounterMode) on fake tensors: one block forward and
    backward, plain and under ac as hetgpt/run/parallel.py applies it
    (whose recompute stops short of the block's last matmul), and the
    rest (embeddings, ln_f, the loss's matmuls). Attention runs as
    SDPA's math kernel here, which the counter sees: its full s×s
    products, PaLM's 12·h·s per token and layer (the fused kernels of
    the CPU and GPU skip the masked half, or are not counted at all on
    the CPU).
    """
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.checkpoint import checkpoint
    from torch.utils.flop_counter import FlopCounterMode
    counted = {}
    with FakeTensorMode(), sdpa_kernel(SDPBackend.MATH):
        block, rest = network.Block(cfg), network.GPT(replace(cfg, n_layer=0))
        x = torch.empty(1, cfg.block_size, cfg.n_embd,
                        requires_grad=True)
        idx = torch.zeros(1, cfg.block_size, dtype=torch.long)
        runs = dict(
            block=lambda: block(x),
            ac=lambda: checkpoint(block, x, use_reentrant=False),
            rest=lambda: rest(idx, idx)[1])
        for name, run in runs.items():
            with FlopCounterMode(display=False) as counter:
                run().sum().backward()
            counted[name] = counter.get_total_flops()
    return counted


# -----------------------------------------------------------------------------
# The kinds of work of a GPU rank's step, for its clock
# (hetgpt/planner/timing.py): each matmul's shape, each attention kernel's,
# and the bytes that every other kernel reads and writes (norms,
# activations, residual adds, dropout, casts, the loss's softmax, embedding
# gathers, adding into .grad), recorded op by op on fake tensors as a
# micro-batch runs them. A view moves nothing; an embedding reads the rows
# it gathers, not its whole table (GATHERS likewise).
MATMULS = ('mm', 'addmm', 'bmm', 'baddbmm')
# ops that read only the entries their index names (the loss's pick of
# each target's log-probability, and its gradient's scatter), not the
# whole tensor they are given
GATHERS = ('nll_loss_forward', 'nll_loss_backward')


def _nbytes(x):
    """The bytes of the tensors in x (any nesting of them)."""
    return sum(t.numel() * t.element_size() for t in tree_leaves(x)
               if isinstance(t, torch.Tensor))


class _Work(TorchDispatchMode):
    """The work of the ops run under it, kind by kind.

    matmuls: {(b, m, n, k, dtype): count}; attention: {(batch, heads, q,
    kv, head_dim, causal, backward, dtype): count}; bytes: what every
    other kernel reads and writes.
    """

    def __init__(self):
        """No work yet."""
        super().__init__()
        self.matmuls, self.attention = Counter(), Counter()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        """Run the op and count its work by kind."""
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        op = func._schema.name.split('::')[-1]
        names = (a.name for a in func._schema.arguments)
        named = dict(zip(names, args), **kwargs)
        if func.namespace != 'aten' or 'empty' in op:
            return out
        if op in MATMULS:  # (b×)m×k @ k×n
            a, b = args[-2], args[-1]
            batch = 1
            if a.dim() == 3:
                batch = a.shape[0]
            key = (batch, a.shape[-2], b.shape[-1], a.shape[-1],
                   str(a.dtype)[6:])
            self.matmuls[key] += 1
        elif 'scaled_dot_product' in op:
            q, k = named['query'], named['key']
            causal = bool(named.get('is_causal')) \
                and named.get('attn_mask') is None
            key = (*q.shape[:3], k.shape[2], q.shape[3], causal,
                   'backward' in op, str(q.dtype)[6:])
            self.attention[key] += 1
        elif not self._view(func, args, out):
            index = named.get('indices', named.get('target'))
            if op == 'embedding':
                read = _nbytes(out) + _nbytes(index)
            elif op in GATHERS:
                read = _nbytes(index)
            else:
                read = _nbytes((args, kwargs))
            self.bytes += read + _nbytes(out)
        return out

    @staticmethod
    def _view(func, args, out):
        """Whether the op's outputs are views of its inputs.

        (A mutation of one reads and writes it: not a view.)
        """
        if func._schema.is_mutable:
            return False
        mine = {StorageWeakRef(t.untyped_storage())
                for t in tree_leaves(args) if isinstance(t, torch.Tensor)}
        return all(StorageWeakRef(t.untyped_storage()) in mine
                   for t in tree_leaves(out)
                   if isinstance(t, torch.Tensor))


@functools.lru_cache(maxsize=None)
def _work(cfg, param_dtype, autocast_dtype, part, micro):
    """(matmuls, attention, bytes) of _Work for one part of the model.

    part: 'block', 'ac' (a block under activation checkpointing,
    recompute included) or 'rest', for a micro-batch of `micro`
    sequences, forward and backward; the loss in the chunks a GPU rank
    takes (model.LOSS_CHUNK). Cached by shape.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.checkpoint import checkpoint
    with FakeTensorMode():
        block, rest = _fake(cfg, param_dtype, rest=True)
        rest.loss_chunks = network.LOSS_CHUNK['cuda']
        stream = _stream(param_dtype, autocast_dtype)
        x = torch.empty(micro, cfg.block_size, cfg.n_embd, dtype=stream,
                        requires_grad=True)
        idx = torch.zeros(micro, cfg.block_size, dtype=torch.long)
        runs = dict(
            block=lambda: block(x).sum(),
            rest=lambda: rest(idx, idx)[1],
            ac=lambda: checkpoint(block, x, use_reentrant=False).sum())
        autocast = torch.autocast('cpu', dtype=autocast_dtype,
                                  enabled=autocast_dtype is not None)
        with autocast, _Work() as work:
            runs[part]().backward()
    return work.matmuls, work.attention, work.bytes


def _scaled(counter, times):
    """A Counter with each count times `times`."""
    return Counter({k: times * n for k, n in counter.items()})


def work(cfg, micro, strategy, dtype, ac=False):
    """One micro-batch's work on a GPU rank, all blocks and the rest.

    As train.py runs this strategy in this dtype: the matmuls {(b, m, n,
    k, dtype): count}, the attention kernels {(batch, heads, q, kv,
    head_dim, causal, backward, dtype): count} and the other kernels'
    bytes (_work).
    """
    p = policy(strategy, dtype)
    part = 'block'
    if ac:
        part = 'ac'
    block = _measured(_work, cfg, *p, part, micro)
    rest = _measured(_work, cfg, *p, 'rest', micro)
    L = cfg.n_layer
    return dict(matmuls=_scaled(block[0], L) + rest[0],
                attention=_scaled(block[1], L) + rest[1],
                bytes=L * block[2] + rest[2])


def attention_flops(batch, heads, q, kv, head_dim, causal, backward):
    """An attention kernel's FLOPs as FlashAttention counts them.

    (arXiv 2307.08691, its benchmarks): the two products,
    4·q·kv·head_dim per head, half that when causal, the backward 2.5
    times the forward.
    """
    share = 1.0
    if causal:
        share = 0.5
    f = 4 * batch * heads * q * kv * head_dim * share
    if backward:
        return f * 2.5
    return f


def flops_per_sequence(c, ac=False):
    """Training FLOPs of one sequence (model_flops).

    MFU's numerator everywhere, train.py's too.
    """
    f = _measured(model_flops, c)
    part = 'block'
    if ac:
        part = 'ac'
    return c.n_layer * f[part] + f['rest']


def mfu(cfg, sequences, seconds, peak):
    """Model FLOPs utilisation; None when the peak is not known.

    The training FLOPs of `sequences` sequences (flops_per_sequence; no
    recompute counted) done in `seconds`, over `peak` FLOP/s.
    """
    if not (peak and seconds) or math.isnan(peak):
        return None
    return sequences * flops_per_sequence(cfg) / seconds / peak
