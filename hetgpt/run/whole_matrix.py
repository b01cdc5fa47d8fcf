"""
An optimizer whose update needs the whole matrix (Muon orthogonalises
it), under FSDP2, which keeps each rank's dim-0 rows of it: each matrix
has one owner (hetgpt/owners.py), which gathers the matrix's weight and
gradient shards, steps the optimizer model.make_optimizer built on the
whole matrix, and sends each rank its rows of the new weight. Only the
owner keeps the matrix's state (Muon's momentum). The arithmetic is the
one-process optimizer's, on the same whole tensors.

torch.optim.Muon on FSDP2's DTensor shards runs without an error but is
not Muon's update of the matrix (tests/test_muon.py); muon-fsdp2 on PyPI
gathers shards of equal size only (docs/training.md).
"""
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from hetgpt.owners import owners
from hetgpt.planner import costs


def wrap(optimizers):
    """The optimizers, each that holds FSDP2 shards (DTensors) and whose
    update of a shard is not its share of the matrix's: whole."""
    return [WholeMatrix(opt) if needs_whole(opt) else opt
            for opt in optimizers]


def needs_whole(opt):
    """Whether opt holds sharded matrices it cannot step shard by shard
    (hetgpt/planner/costs.py's needs_whole, for a group of matrices)."""
    params = [p for g in opt.param_groups for p in g['params']]
    if not any(isinstance(p, DTensor) for p in params):
        return False
    return any(costs.needs_whole(opt, group)
               for group in opt.param_groups
               if any(p.dim() == 2 for p in group['params']))


def rows_of(rows, world):
    """Each rank's rows of a matrix of `rows` rows: FSDP2's dim-0 chunks
    (torch.chunk's: ceil(rows / world) each, the last ones fewer or
    none)."""
    c = -(-rows // world)
    return [max(0, min(rows, (r + 1) * c) - r * c) for r in range(world)]


def gather(local, rows, owner):
    """The whole matrix on rank owner, from every rank's rows (local);
    None on the others. Each rank sends its rows padded to the largest
    chunk, on the device they are on (CUDA: NCCL; the host: gloo)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    sizes = rows_of(rows, world)
    pad = local.new_zeros((sizes[0],) + tuple(local.shape[1:]))
    pad[:local.shape[0]] = local
    parts = None
    if rank == owner:
        parts = [torch.empty_like(pad) for _ in range(world)]
    dist.gather(pad, parts, dst=owner)
    if rank != owner:
        return None
    return torch.cat([part[:n] for part, n in zip(parts, sizes)])


def scatter(whole, local, rows, owner):
    """Each rank's rows of whole (a matrix of `rows` rows on rank owner;
    None elsewhere) copied into local, its shard."""
    rank, world = dist.get_rank(), dist.get_world_size()
    sizes = rows_of(rows, world)
    pad = local.new_empty((sizes[0],) + tuple(local.shape[1:]))
    parts = None
    if rank == owner:
        parts = [pad.new_zeros(pad.shape) for _ in range(world)]
        for part, piece in zip(parts, whole.split(sizes[0])):
            part[:piece.shape[0]] = piece
    dist.scatter(pad, parts, src=owner)
    local.copy_(pad[:local.shape[0]])


def is_like(v, p):
    """Whether state entry v is a tensor of matrix p's shape (sharded as
    p is when saved), not a scalar."""
    return torch.is_tensor(v) and tuple(v.shape) == tuple(p.shape)


class WholeMatrix(torch.optim.Optimizer):
    """opt (model.make_optimizer's, holding FSDP2 shards) stepping whole
    matrices: the owner of each gathers, steps and scatters it.

    Its param_groups are opt's (the shards: the schedule sets their lr,
    the loss scale unscales their gradients); the owner's copy of opt
    (`inner`) holds a stand-in for each matrix it owns, which takes the
    whole weight and gradient during the step and none between steps,
    and its state. state_dict() is opt's on one process: each matrix's
    state as sharded as its weight (DCP saves and reshards it; a
    checkpoint of one process's Muon loads).
    """

    def __init__(self, opt):
        """Takes over opt's groups; opt itself is no longer stepped."""
        super().__init__(opt.param_groups, opt.defaults)
        self.rank = dist.get_rank()
        params = [p for g in self.param_groups for p in g['params']]
        self.owner = dict(zip(params, owners(
            [p.numel() for p in params], dist.get_world_size())))
        self.stand_in = {}
        groups = []
        for g in self.param_groups:
            mine = [p for p in g['params'] if self.owner[p] == self.rank]
            for p in mine:
                self.stand_in[p] = torch.nn.Parameter(
                    p.to_local().new_empty(0, 0))
            groups.append({**costs.settings(opt, g),
                           'params': [self.stand_in[p] for p in mine]})
        self.inner = None
        if self.stand_in:
            self.inner = type(opt)(groups)

    @torch.no_grad()
    def step(self, closure=None):
        """Each matrix's update, whole, in the order of the groups.

        Every rank takes part in each matrix's gather and scatter.
        State cleared (hetgpt/run/optim.py's frozen): the owners' too.
        """
        if not self.state and self.inner is not None:
            self.inner.state.clear()
        self.sync_settings()
        for g in self.param_groups:
            for p in g['params']:
                if p.grad is None:
                    continue
                self.step_one(p)
                self.state[p]['owner'] = self.owner[p]

    def sync_settings(self):
        """The inner groups' settings from the groups (lr: the
        schedule's)."""
        if self.inner is None:
            return
        for g, inner in zip(self.param_groups, self.inner.param_groups):
            inner.update({k: v for k, v in g.items() if k != 'params'})

    def step_one(self, p):
        """Matrix p (a DTensor): gathered, stepped and scattered."""
        owner, rows = self.owner[p], p.shape[0]
        weight = gather(p.to_local(), rows, owner)
        grad = gather(p.grad.to_local(), rows, owner)
        if owner == self.rank:
            stand_in = self.stand_in[p]
            stand_in.data, stand_in.grad = weight, grad
            self.inner.step()
            stand_in.grad = None
        scatter(weight, p.to_local(), rows, owner)
        if owner == self.rank:
            stand_in.data = weight.new_empty(0, 0)

    def state_dict(self):
        """opt's state_dict as one process holds it, each state tensor
        the shape of its matrix as sharded as the matrix (a DTensor)."""
        kinds = {}  # what each owned matrix's state holds
        for p, stand_in in self.stand_in.items():
            held = self.inner.state.get(stand_in, {})
            kinds[self.index(p)] = {
                k: 'shard' if is_like(v, p) else v
                for k, v in held.items()}
        every = [None] * dist.get_world_size()
        dist.all_gather_object(every, kinds)
        kinds = {i: k for part in every for i, k in part.items()}
        state = {}
        for g in self.param_groups:
            for p in g['params']:
                held = self.sharded(p, kinds.get(self.index(p), {}))
                if held:
                    state[p] = held
        saved, self.state = self.state, state
        try:
            return super().state_dict()
        finally:
            self.state = saved

    def index(self, p):
        """p's place among all the groups' parameters."""
        params = [q for g in self.param_groups for q in g['params']]
        return next(i for i, q in enumerate(params) if q is p)

    def sharded(self, p, kinds):
        """Matrix p's state (the owner's), its tensors as p's shards."""
        out = {}
        held = {}
        if self.owner[p] == self.rank:
            held = self.inner.state.get(self.stand_in[p], {})
        for k, kind in sorted(kinds.items()):
            if kind != 'shard':
                out[k] = kind
                continue
            local = torch.empty_like(p.to_local())
            scatter(held.get(k), local, p.shape[0], self.owner[p])
            out[k] = DTensor.from_local(
                local, p.device_mesh, p.placements, shape=p.shape,
                stride=p.stride())
        return out

    def load_state_dict(self, state_dict):
        """opt's state_dict as state_dict() gives it (any world size):
        the groups' settings, and each matrix's state to its owner."""
        groups = state_dict['param_groups']
        for g, saved in zip(self.param_groups, groups):
            g.update({k: v for k, v in saved.items() if k != 'params'})
        self.sync_settings()
        params = [p for g in self.param_groups for p in g['params']]
        ids = [i for saved in groups for i in saved['params']]
        self.state.clear()
        if self.inner is not None:
            self.inner.state.clear()
        for i, p in zip(ids, params):
            held = state_dict['state'].get(i)
            if held is None:
                continue
            mine = {}
            for k, v in sorted(held.items()):
                if isinstance(v, DTensor):  # (else whole: every rank's)
                    v = gather(v.to_local().to(p.to_local()), p.shape[0],
                               self.owner[p])
                mine[k] = v
            if self.owner[p] == self.rank:
                self.inner.state[self.stand_in[p]] = mine
            self.state[p]['owner'] = self.owner[p]
