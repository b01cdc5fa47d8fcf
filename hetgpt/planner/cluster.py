"""
Identical ranks as one entry, so that planning takes as long for a million
GPUs as for eight. The planner (hetgpt/planner/search.py) takes a list of
entries, each a rank's dict standing for `count` identical ranks, and sums
over ranks and nodes by those counts: its work grows with the kinds of
rank, never with their number. train.py gives one entry per rank (count
1); plan.py lays out --gpus as entries (layout). An entry's fields beside
the rank's own:

  count   how many ranks it stands for
  node    its first node (the key of its group of nodes: every entry of
          those nodes has it)
  nodes   how many nodes alike it spans, count / nodes of its ranks in
          each
  rank    its first rank; stride: ranks per node, so that its ranks are,
          node by node, rank + i·stride + j for node i of its nodes and
          j < count / nodes

Where ranks tie in the split, the first entry's first ranks go first: rank
order when each entry's ranks are consecutive (train.py's, and plan.py's
but for a kind in nodes of several kinds, where another tie order gives a
split of the same step).
"""
import bisect
import itertools
from collections import Counter


def normalise(ranks):
    """The entries with the fields above where not given: one rank each,
    in the order given."""
    out, at = [], 0
    for r in ranks:
        r = dict(dict(count=1, nodes=1, rank=at), **r)
        assert r['count'] >= 1 and r['count'] % r['nodes'] == 0, \
            (f"an entry of {r['count']} ranks cannot be spread evenly "
             f"over {r['nodes']} node(s)")
        r.setdefault('stride', r['count'] // r['nodes'])
        out.append(r)
        at = max(at, span(r, 0, r['count'])[1] + 1)
    return out


def world(ranks):
    """How many ranks the entries stand for."""
    return sum(r.get('count', 1) for r in ranks)


def per_node(ranks, value=lambda r: 1):
    """node -> the ranks in each node of its group (every node of a group
    holds as many), or the sum of value(rank) over them."""
    out = Counter()
    for r in ranks:
        each = r.get('count', 1) // r.get('nodes', 1)
        out[r['node']] += value(r) * each
    return out


def node_count(ranks):
    """How many nodes in all."""
    nodes = {r['node']: r.get('nodes', 1) for r in ranks}
    return sum(nodes.values())


def span(r, offset, k):
    """(first rank, last rank, first node, last node) of k of entry r's
    ranks from the offset-th."""
    width = r['count'] // r['nodes']
    a, b = offset, offset + k - 1
    first = r['rank'] + a // width * r['stride'] + a % width
    last = r['rank'] + b // width * r['stride'] + b % width
    return first, last, r['node'] + a // width, r['node'] + b // width


def layout(items, per):
    """The entries of items placed `per` ranks to a node in turn.

    items: [(count, rank dict)] in rank order (the last node may hold
    fewer). Consecutive nodes that hold the same (the same kinds, as many
    of each, in the same order) are one group of nodes, and each run of one
    kind in its nodes is an entry. The work grows with the items, not the
    ranks: the nodes inside one item are alike, so a node differs only
    where an item ends.
    """
    merged = []  # (one run of a kind given as several items is one item)
    for c, r in items:
        if merged and merged[-1][1] == r:
            merged[-1][0] += c
        elif c:
            merged.append([c, r])
    ends = list(itertools.accumulate(c for c, _ in merged))
    total = (ends or [0])[-1]
    at, node = 0, 0
    groups = []  # [first node, nodes, content]
    while at < total:
        first = bisect.bisect_right(ends, at)
        end = min(at + per, total)
        content = []  # this node's [count, rank dict] runs
        j, pos = first, at
        while pos < end:
            take = min(ends[j], end) - pos
            content.append([take, merged[j][1]])
            pos, j = pos + take, j + 1
        alike = 1
        if len(content) == 1 and end - at == per:
            alike = (ends[first] - at) // per
        if groups and groups[-1][2] == content:
            groups[-1][1] += alike
        else:
            groups.append([node, alike, content])
        at, node = at + alike * per, node + alike
    out = []
    for first, n, content in groups:
        width, offset = sum(c for c, _ in content), 0
        for c, r in content:
            out.append(dict(r, count=c * n, node=first, nodes=n,
                            rank=first * per + offset, stride=width))
            offset += c
    return out


def expand(ranks):
    """One entry per rank, in rank order.

    A plan of them is the reference for the grouped one, and the
    planner's advice grows a mix of a few thousand ranks this way.
    """
    out = []
    for r in normalise(ranks):
        width = r['count'] // r['nodes']
        for p in range(r['count']):
            first = span(r, p, 1)[0]
            node = r['node'] + p // width
            out.append((first, dict(r, count=1, nodes=1, node=node,
                                    rank=first, stride=1)))
    return [r for _, r in sorted(out, key=lambda x: x[0])]
