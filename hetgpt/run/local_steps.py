"""
Local steps, for machines on an ordinary network (DiLoCo: Douillard et
al. 2023, arXiv 2311.08105). With outer_interval = H > 0, each node trains
on its own, its ranks data-parallel among themselves (DDP over the node's
group), and every H steps the nodes average their change of the weights
and an outer optimizer applies it: Nesterov SGD at outer_lr and
outer_momentum (DiLoCo's 0.7 and 0.9). The link between nodes then
carries the weights once per H steps instead of the gradients every step.
outer_interval = 0 (the default): every step is one DDP or FSDP step over
all ranks, and nothing here runs.

A node's data: its ranks' slices of each step's global batch, a function
of (seed, step) as always (corpus.Batches), sized by the split that the
batch has over ranks (by speed, or balance=): over a round the nodes read
the tokens that every-step training reads, each node its own part, and a
faster node takes the larger part of each step. Each node's gradient is
that of its part (the token-loss sum over its tokens), its change
weighted by its part of the batch in the average. A round ends every H
steps, at each evaluation and at the end: the nodes' models are one model
there. A checkpoint holds each node's weights and optimizer state (node
0's as every checkpoint's 'model' and 'optim', which sample.py reads),
and the outer state: a resume anywhere in a round continues it exactly.
An outer step whose result float32 does not hold is not applied (the
nodes go back to the round's start) and counts as a bad step
(hetgpt/run/optim.py, BadSteps).
"""
import math

import torch
import torch.distributed as dist

from hetgpt.errors import die
from hetgpt.knobs import refuses_local_steps
from hetgpt.planner.timing import local_step_times
from hetgpt.run.process_group import gather


class LocalSteps:
    """The local steps of a run (outer_interval > 0), or nothing."""

    def __init__(self, config, plan, rank, world_size, local_world):
        """The groups of the nodes, when outer_interval > 0 (local_world:
        the ranks on this node); dies where local steps cannot run."""
        self.interval = config['outer_interval']
        self.world_size = world_size
        self.lr = config['outer_lr']
        self.momentum = config['outer_momentum']
        self.eval_interval = config['eval_interval']
        self.max_iters = config['max_iters']
        self.block_size = config['block_size']
        # the group of the inner data parallelism: None, every rank
        self.group = None
        # the exchange's predicted seconds (a wait the watchdog allows)
        self.exchange_seconds = 0.0
        if not self.interval:
            return
        self.exchange_seconds = local_step_times(plan, self.interval)[2]
        # (every rank's local_world: each node's ranks, as many times)
        why = refuses_local_steps(plan.strategy, gather(local_world))
        if why:
            die(f"outer_interval={self.interval}: {why}; or "
                f"outer_interval=0")
        # Two levels of groups: each node's ranks (the inner DDP), and
        # each local rank with its peers of the other nodes (the
        # exchange: each carries 1/L of the weights across)
        L, N = local_world, world_size // local_world
        self.L, self.node, self.local = L, rank // L, rank % L
        self.group, _ = dist.new_subgroups_by_enumeration(
            [[n * L + i for i in range(L)] for n in range(N)])
        self.across, _ = dist.new_subgroups_by_enumeration(
            [[n * L + i for n in range(N)] for i in range(L)])
        # this node's ranks
        self.mine = range(self.node * L, self.node * L + L)

    def __bool__(self):
        """Whether local steps are on."""
        return bool(self.interval)

    def weight(self, sizes, tokens_per_step):
        """The loss's factor (sum of token losses × it).

        1 / the tokens whose gradient the step takes (the whole batch's,
        or this node's), × the ranks DDP averages over.
        """
        if not self.interval:
            return self.world_size / tokens_per_step
        return self.L / max(1, self.share(sizes) * self.block_size)

    def share(self, sizes):
        """This node's sequences of the step (sizes: every rank's)."""
        return sum(sum(sizes[r]) for r in self.mine)

    def begin(self, model):
        """Takes the outer state, on the host: the weights of the last
        round's end (anchor) and the outer momentum, float32, one per
        parameter (a tied one once)."""
        if not self.interval:
            return
        raw = getattr(model, 'module', model)
        self.names, self.params = zip(*raw.named_parameters())
        self.anchor = [p.detach().to('cpu', torch.float32, copy=True)
                       for p in self.params]
        self.buf = [torch.zeros_like(a) for a in self.anchor]

    @torch.no_grad()
    def step(self, it, sizes):
        """The outer step, at a round's end.

        After step it (steps done), with sizes every rank's micro-batches
        of that step. Returns None where no outer step ran, else whether
        it was not applied: a result float32 does not hold (a weight or
        the momentum not finite) is not, and the nodes go back to the
        round's start (the anchor), the outer state as it was. The
        result is the same on every rank (the exchange's sum).
        """
        if not self.interval:
            return None
        if (it % self.interval and it % self.eval_interval
                and it != self.max_iters):
            return None
        part = self.share(sizes) / sum(map(sum, sizes))
        change = torch.cat(
            [(a - p.detach().to('cpu', torch.float32)).flatten()
             for a, p in zip(self.anchor, self.params)]) * part
        # the nodes' weighted sum: the average change
        self.exchange(change)
        # checked whole before any of it is applied (computed twice, so
        # as not to hold another copy of the weights)
        ok = all(bool(torch.isfinite(m).all() and torch.isfinite(a).all())
                 for m, a in self.nesterov(change))
        if ok:
            for (m_new, a_new), m, a in zip(self.nesterov(change), self.buf,
                                            self.anchor):
                m.copy_(m_new)
                a.copy_(a_new)
        for a, p in zip(self.anchor, self.params):
            p.copy_(a)
        return not ok

    def nesterov(self, change):
        """Each parameter's (momentum, anchor) after the outer step on
        change (flat: the average change of the weights), as new
        tensors: torch.optim.SGD's Nesterov, dampening 0."""
        at = 0
        for a, m in zip(self.anchor, self.buf):
            g = change[at:at + a.numel()].view_as(a)
            at += a.numel()
            m_new = m.mul(self.momentum).add_(g)
            yield m_new, a.add(g.add(m_new, alpha=self.momentum),
                               alpha=-self.lr)

    def exchange(self, flat):
        """Sums flat over the nodes, in place.

        Local rank i sums piece i with its peers (the link carries the
        weights once whatever the node's ranks), then the node's ranks
        gather the pieces.
        """
        n = flat.numel()
        rows = torch.zeros(self.L, math.ceil(n / self.L))
        rows.view(-1)[:n] = flat
        dist.all_reduce(rows[self.local], group=self.across)
        if self.L > 1:
            dist.all_gather(list(rows), rows[self.local].clone(),
                            group=self.group)
        flat.copy_(rows.view(-1)[:n])

    def entries(self, state, stored=None):
        """A checkpoint's entries, from state ({'model': ..., 'optim':
        ...}).

        This node's under keys of its own (node 0's as they are), and the
        outer state. stored: a checkpoint's top-level keys, to read what
        it holds (a node it had not: node 0's; no outer state: none).
        """
        if not self.interval:
            return state
        out = {}
        for key, sd in state.items():
            own = key
            if self.node:
                own = f"{key}@node{self.node}"
            if stored is not None and own not in stored:
                own = key
            out[own] = sd
        if stored is None or 'outer' in stored:
            out['outer'] = {'anchor': dict(zip(self.names, self.anchor)),
                            'momentum': dict(zip(self.names, self.buf))}
        return out

    def loaded(self, stored):
        """After a checkpoint without outer state was read (stored: its
        top-level keys): a round starts from its weights."""
        if self.interval and 'outer' not in stored:
            for a, m, p in zip(self.anchor, self.buf, self.params):
                a.copy_(p.detach())
                m.zero_()
