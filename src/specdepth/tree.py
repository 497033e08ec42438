"""Draft trees: the shape of a step's speculation per row, and the verifier's attention over it.

A tree hangs below the root, the row's last known token (depth 0). Its nodes are draft tokens, numbered
0..N-1 in an order where a parent comes before its children; node i's parent is parent[i] (-1: a child of
the root). A node's rank is its position among its parent's children in node order: rank r is the draft's
rank-r candidate after the parent's path (0 its top token). Three equivalent spellings:

* the parent array, as above (any tree);
* choices: each node as the tuple of ranks on its path from the root (the format of Medusa's and EAGLE's
  tree choices): (0,) is the root's top candidate, (0, 1) that node's second candidate. A set of choices
  must be prefix-closed and rank-contiguous (rank r implies its siblings 0..r-1);
* widths per level: widths[d] = the candidates every node at depth d keeps as children (depth 0: the
  root), the full product tree Medusa builds from per-head top-k; [3, 2, 1] has 3 + 6 + 6 nodes. A zero
  width ends the tree; only zeros may follow it.

A plain depth k is the chain widths [1] * k. Trees compare equal when they have the same choices, whatever
their node order; `from_choices` and `from_widths` number nodes by depth, then by rank path.

The verifier runs the root and the nodes in one forward: query 0 is the root, query 1 + i is node i
(a row's verify tokens are 1 + N, the chain's k + 1). Query j of a row sits at position context + depth
(context: the tokens cached before the root, so the root at `context`) and is stored at slot context + j;
it attends to the row's prefix slots (< context) and to the slots of its ancestors and itself. Rows pad
to a common query count (a node bucket); a padding query sits at the root's position and attends to the
prefix and itself only, and no real query attends to it.

How the pieces fit: a tree plan is built and checked by from_widths / from_parents / from_choices (their
ValueErrors name the fault; the engine words them as PolicyErrors); a row costs 1 + N verify tokens, where
a chain costs k + 1; node_bucket picks the padded query count for static shapes; the verifier's forward
takes `positions` and `attention_mask`; tree_verify decides the accepted path (greedy or SpecInfer's
rule) and kept_slots says where its KV moves; tree_acceptance is the simulator's counterpart.
"""
from __future__ import annotations

import operator
from itertools import repeat
from typing import Iterable, Sequence

import numpy as np

# EAGLE's default static tree (`mc_sim_7b_63` in eagle/model/choices.py of SafeAILab/EAGLE): 25 nodes,
# depth 5, at most 4 candidates at the root.
EAGLE_CHOICES = ((0,), (1,), (2,), (3,), (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0), (2, 1), (3, 0),
                 (0, 0, 0), (0, 0, 1), (0, 0, 2), (0, 1, 0), (0, 1, 1), (0, 2, 0), (0, 2, 1), (1, 0, 0),
                 (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 0, 2), (0, 0, 0, 0, 0), (0, 0, 0, 0, 1))


def _cap(n: int, max_nodes: int | None) -> None:
    if max_nodes is not None and n > max_nodes:
        raise ValueError(f"tree has {n} nodes, more than the cap of {max_nodes}")


class Tree:
    """A draft tree by its parent array (see the module docstring), with each node's depth (1 below the
    root) and rank; immutable. Built by from_parents, from_choices, from_widths or chain."""

    __slots__ = ("parent", "depth", "rank", "_max_depth", "_parents")

    def __init__(self, parent: np.ndarray, depth: np.ndarray, rank: np.ndarray):
        self.parent, self.depth, self.rank = parent, depth, rank
        self._max_depth = self._parents = None
        for a in (parent, depth, rank):
            a.flags.writeable = False

    @property
    def nodes(self) -> int:
        return int(self.parent.size)

    @property
    def max_depth(self) -> int:
        if self._max_depth is None:   # the arrays are read-only: computed once
            self._max_depth = int(self.depth.max(initial=0))
        return self._max_depth

    def level_parents(self) -> np.ndarray:
        """int64 [max_depth]: the distinct parents of the nodes at each depth 1..max_depth (`parent_counts`' row
        for this tree; computed once, read-only)."""
        if self._parents is None:
            D = self.max_depth
            out = np.zeros(D, np.int64)
            if self.nodes:
                par = np.unique(self.parent)                        # parents with children (-1: the root)
                pd = np.where(par >= 0, self.depth[np.maximum(par, 0)], 0)   # a parent's depth; children at pd + 1
                out = np.bincount(pd, minlength=D)[:D]
            out.flags.writeable = False
            self._parents = out
        return self._parents

    @property
    def is_chain(self) -> bool:
        return bool(np.array_equal(self.parent, np.arange(self.nodes) - 1))

    def choices(self) -> tuple[tuple[int, ...], ...]:
        """Each node's rank path from the root, in node order."""
        out: list[tuple[int, ...]] = []
        for i in range(self.nodes):
            p = int(self.parent[i])
            out.append((out[p] if p >= 0 else ()) + (int(self.rank[i]),))
        return tuple(out)

    def widths(self) -> list[int] | None:
        """The widths per level if the tree is a full product tree (every node at a depth has the same
        number of children and every leaf is at the deepest level), else None."""
        kids = np.bincount(self.parent + 1, minlength=self.nodes + 1)   # [root, node 0, ...]
        depth = np.concatenate([[0], self.depth])
        out = []
        for d in range(self.max_depth + 1):
            k = np.unique(kids[depth == d])
            if k.size != 1 or (d < self.max_depth) != (k[0] > 0):
                return None
            out.append(int(k[0]))
        return out[:-1]

    def children(self) -> np.ndarray:
        """int64 [1 + N, W] over queries (0 the root, 1 + i node i): entry [j, r] = the query of j's rank-r
        child, -1 where there is none. W = the widest node's children (at least 1)."""
        return children_table([self])[0]

    def __eq__(self, other) -> bool:
        return isinstance(other, Tree) and set(self.choices()) == set(other.choices())

    __hash__ = None

    def __repr__(self) -> str:
        return f"Tree(parent={self.parent.tolist()})"


def from_parents(parents: Sequence[int] | np.ndarray, max_nodes: int | None = None) -> Tree:
    """The tree of a parent array: parents[i] in -1..i-1 (a parent before its children)."""
    p = np.asarray(parents)
    if p.ndim != 1 or (p.size and not np.issubdtype(p.dtype, np.integer)):
        raise ValueError(f"tree parents must be a 1-D list of integers, got {parents!r}")
    p = p.astype(np.int64)
    _cap(p.size, max_nodes)
    bad = np.flatnonzero((p < -1) | (p >= np.arange(p.size)))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"tree parents: node {i} has parent {int(p[i])}; a parent must be -1 (the root) "
                         f"or an earlier node (0..{i - 1})")
    depth = np.zeros(p.size, np.int64)
    rank = np.zeros(p.size, np.int64)
    seen = np.zeros(p.size + 1, np.int64)   # children so far, per [root, node 0, ...]
    for i, q in enumerate(p):
        depth[i] = depth[q] + 1 if q >= 0 else 1
        rank[i] = seen[q + 1]
        seen[q + 1] += 1
    return Tree(p, depth, rank)


def from_choices(choices: Iterable[Sequence[int]], max_nodes: int | None = None) -> Tree:
    """The tree of a set of rank paths (prefix-closed, rank-contiguous), numbered by depth, then path."""
    try:
        paths = sorted({tuple(int(r) for r in c) for c in choices}, key=lambda c: (len(c), c))
    except (TypeError, ValueError):
        raise ValueError(f"tree choices must be lists of integer ranks, got {choices!r}") from None
    _cap(len(paths), max_nodes)
    index = {(): -1}
    for i, c in enumerate(paths):
        if not c or min(c) < 0:
            raise ValueError(f"tree choices: {list(c)} is not a path of ranks >= 0")
        if c[:-1] not in index:
            raise ValueError(f"tree choices: {list(c)} has no parent {list(c[:-1])}")
        if c[-1] and c[:-1] + (c[-1] - 1,) not in index:
            raise ValueError(f"tree choices: {list(c)} without its sibling {list(c[:-1] + (c[-1] - 1,))}")
        index[c] = i
    return from_parents([index[c[:-1]] for c in paths])


def check_widths(widths: Sequence[int], max_nodes: int | None = None) -> list[int]:
    """widths as ints, trailing zeros dropped; ValueError on a negative width, a nonzero width after a zero,
    or more nodes than max_nodes."""
    try:
        w = [int(x) for x in widths]
    except (TypeError, ValueError):
        raise ValueError(f"tree widths must be a list of integers, got {widths!r}") from None
    if any(x != y for x, y in zip(w, widths)):
        raise ValueError(f"tree widths must be integers, got {list(widths)!r}")
    if any(x < 0 for x in w):
        raise ValueError(f"tree widths must be >= 0, got {w}")
    k = w.index(0) if 0 in w else len(w)
    if any(w[k:]):
        raise ValueError(f"tree widths: level {k} has width 0 but a later level does not ({w})")
    _cap(widths_nodes(w[:k]), max_nodes)
    return w[:k]


def widths_nodes(widths: Sequence[int]) -> int:
    """The node count of a product tree: sum over levels of the product of the widths down to it."""
    return int(np.cumprod(np.asarray(widths, np.int64)).sum()) if len(widths) else 0


def from_widths(widths: Sequence[int], max_nodes: int | None = None) -> Tree:
    """The product tree of widths per level (see the module docstring)."""
    w = check_widths(widths, max_nodes)
    parents: list[int] = []
    level = [-1]   # the previous level's nodes
    for width in w:
        start = len(parents)
        parents += [q for q in level for _ in range(width)]
        level = list(range(start, len(parents)))
    return from_parents(parents)


def chain(k: int) -> Tree:
    """A chain of k drafts (widths [1] * k)."""
    return from_parents(np.arange(k) - 1)


EAGLE_TREE = from_choices(EAGLE_CHOICES)


# ---- the verifier's batch -------------------------------------------------------------------------
def rows(trees: Tree | Sequence[Tree], n: int | None = None) -> list[Tree]:
    """One tree per row: a single tree stands for all n rows."""
    if isinstance(trees, Tree):
        if n is None:
            raise ValueError("one tree for all rows needs the row count")
        return [trees] * n
    return list(trees)


def node_bucket(queries: int, buckets: Sequence[int]) -> int:
    """The smallest bucket that holds `queries` verify tokens (root + nodes); ValueError if none does."""
    fit = [b for b in buckets if b >= queries]
    if not fit:
        raise ValueError(f"a tree of {queries} verify tokens exceeds the largest node bucket "
                         f"({max(buckets, default=0)})")
    return min(fit)


def _queries(trees: Sequence[Tree], bucket: int | None) -> int:
    """The padded query count: bucket, or 1 + the most nodes when None; ValueError if a tree does not fit."""
    Q = 1 + max((t.nodes for t in trees), default=0)
    if bucket is None:
        return Q
    if bucket < Q:
        raise ValueError(f"node bucket {bucket} is smaller than a row's tree ({Q} verify tokens)")
    return bucket


def children_table(trees: Sequence[Tree], queries: int | None = None) -> np.ndarray:
    """int64 [n, Q, W]: Tree.children of each row, padded to Q queries (default 1 + the most nodes) and W
    ranks (the widest node's children, at least 1) with -1."""
    Q = _queries(trees, queries)
    W = max([int(t.rank.max(initial=-1)) + 1 for t in trees] + [1])
    out = np.full((len(trees), Q, W), -1, np.int64)
    for i, t in enumerate(trees):
        out[i, t.parent + 1, t.rank] = np.arange(1, t.nodes + 1)
    return out


def pack(trees: Sequence[Tree], bucket: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rows' trees padded to Q = bucket queries (default: 1 + the most nodes): (parent query int64
    [n, Q] (-1 for the root and padding), depth int64 [n, Q] (0 for the root and padding), real bool [n, Q])."""
    Q = _queries(trees, bucket)
    n = len(trees)
    par = np.full((n, Q), -1, np.int64)
    depth = np.zeros((n, Q), np.int64)
    real = np.zeros((n, Q), bool)
    real[:, 0] = True
    for i, t in enumerate(trees):
        par[i, 1:t.nodes + 1] = t.parent + 1
        depth[i, 1:t.nodes + 1] = t.depth
        real[i, 1:t.nodes + 1] = True
    return par, depth, real


def positions(context: np.ndarray, trees: Tree | Sequence[Tree], bucket: int | None = None) -> np.ndarray:
    """int64 [n, Q]: query j of row i at context[i] + its depth (the root and padding at context[i])."""
    _, depth, _ = pack(rows(trees, len(context)), bucket)
    return np.asarray(context, np.int64)[:, None] + depth


def attention_mask(context: np.ndarray, trees: Tree | Sequence[Tree], bucket: int | None = None) -> np.ndarray:
    """bool [n, Q, max(context) + Q]: query j of row i (slot context[i] + j) attends to key slot s iff s is
    a prefix slot (s < context[i]) or the slot of j itself or of one of its ancestors (the root included);
    a padding query attends to the prefix and itself."""
    ctx = np.asarray(context, np.int64)
    par, _, real = pack(rows(trees, ctx.size), bucket)
    n, Q = par.shape
    L = int(ctx.max(initial=0)) + Q
    anc = np.broadcast_to(np.eye(Q, dtype=bool), (n, Q, Q)).copy()   # [row, query, query]: ancestor or self
    for j in range(1, Q):
        p = par[:, j]
        has = real[:, j] & (p >= 0)
        anc[has, j] |= anc[has, p[has]]
    slot = np.arange(L)[None, :] - ctx[:, None]                       # [n, L]: key slot's query index
    inside = (slot >= 0) & (slot < Q)
    rr = np.arange(n)[:, None]
    tree_part = anc[rr[:, :, None], np.arange(Q)[None, :, None], np.clip(slot, 0, Q - 1)[:, None, :]]
    return (slot < 0)[:, None, :] | (inside[:, None, :] & tree_part)


# ---- what a tree step costs ------------------------------------------------------------------------
def by_object(trees: Tree | Sequence[Tree], n: int) -> list:
    """The distinct Tree objects of n rows (one Tree: all rows), in first-row order, each with its rows (an index
    array, or a slice for all): work on a Tree shared by rows done once."""
    if isinstance(trees, Tree):
        return [(trees, slice(None))]
    ts = list(trees)
    if not ts or all(map(operator.is_, ts, repeat(ts[0]))):   # one object (the usual plan): all rows
        return [(ts[0], slice(None))] if ts else []
    ids = list(map(id, ts))
    distinct = dict.fromkeys(ids)   # in first-row order
    arr = np.array(ids, np.int64)
    return [(ts[ids.index(u)], np.flatnonzero(arr == u)) for u in distinct]


def level_counts(trees: Tree | Sequence[Tree], n: int | None = None) -> np.ndarray:
    """int64 [n, D]: row i's nodes at depths 1..D (D: the deepest tree; a chain of k: ones in its first k
    columns). One Tree stands for all n rows (rows that share a Tree object are counted once)."""
    ts = rows(trees, n)
    groups = by_object(ts, len(ts))
    out = np.zeros((len(ts), max((t.max_depth for t, _ in groups), default=0)), np.int64)
    for t, idx in groups:
        out[idx, :t.max_depth] = np.bincount(t.depth, minlength=t.max_depth + 1)[1:]
    return out


def parent_counts(trees: Tree | Sequence[Tree], n: int | None = None) -> np.ndarray:
    """int64 [n, D]: the tokens row i's draft forward at level d (1..D) feeds to propose its depth-d nodes:
    their distinct parents (the root, 1, at d = 1); 0 where the row has no depth-d node. Rows that share a
    Tree object are counted once."""
    ts = rows(trees, n)
    groups = by_object(ts, len(ts))
    out = np.zeros((len(ts), max((t.max_depth for t, _ in groups), default=0)), np.int64)
    for t, idx in groups:
        if t.nodes:
            out[idx, :t.max_depth] = t.level_parents()
    return out


def tree_draft(forward, ctx: np.ndarray, trees: Tree | Sequence[Tree]) -> tuple[float, float, int]:
    """Draft a tree plan level by level: forward(ctx_rows, q, level) -> (seconds, flops) is one draft forward
    over the rows that have nodes at `level` (0-based: level l proposes the depth-(l + 1) nodes), row i at
    context ctx[i] + l feeding q[i] tokens (parent_counts: the parents of those nodes; a chain feeds one token
    a level, as its draft_positions). Returns (seconds, flops, forwards)."""
    ctx = np.asarray(ctx, np.int64)
    q = parent_counts(trees, ctx.shape[0])
    qt, full = np.ascontiguousarray(q.T), (np.count_nonzero(q, axis=0) == q.shape[0]).tolist()
    seconds = flops = 0.0
    for lvl in range(q.shape[1]):
        if full[lvl]:   # every row feeds this level: all of ctx, the level's column as it is
            t, f = forward(ctx + lvl, qt[lvl], lvl)
        else:
            m = np.flatnonzero(qt[lvl])
            t, f = forward(ctx[m] + lvl, qt[lvl, m], lvl)
        seconds += float(t)
        flops += float(f)
    return seconds, flops, int(q.shape[1])


def tree_nodes(trees: Tree | Sequence[Tree], n: int | None = None) -> np.ndarray:
    """int64 [n]: each row's node count (its verify tokens are 1 + that)."""
    return np.array([t.nodes for t in rows(trees, n)], np.int64)


def tree_draft_time(cost, ctx: np.ndarray, trees: Tree | Sequence[Tree]) -> float:
    """Seconds of a tree plan's draft forwards under `cost` (view.cost's draft_forward), as tree_draft runs
    them, plus cost.position_overhead_s a level where the cost has it (the simulator's true cost); a chain of
    k costs what cost.draft_positions(ctx, k) does."""
    extra = float(getattr(cost, "position_overhead_s", 0.0))
    if hasattr(cost, "draft_level_times"):   # a CostModel: the same forwards' seconds in one call
        ctx = np.asarray(ctx, np.int64)
        seconds = 0.0
        for t in cost.draft_level_times(ctx, parent_counts(trees, ctx.shape[0])).tolist():
            seconds += t + extra
        return seconds
    return tree_draft(lambda c, q, lvl: (cost.draft_forward(c, q)[0] + extra, 0.0), ctx, trees)[0]


def tree_step_time(cost, ctx: np.ndarray, trees: Tree | Sequence[Tree]) -> float:
    """Seconds of one tree step under `cost`: tree_draft_time plus the verify, where a row's nodes count as
    its drafts (cost.verify_time(ctx, nodes): 1 + nodes verify tokens a row). The simulator's clock charges
    the same (SimExecutor.draft_tree, verify_tree)."""
    ctx = np.asarray(ctx, np.int64)
    return tree_draft_time(cost, ctx, trees) + float(cost.verify_time(ctx, tree_nodes(trees, ctx.shape[0])))


def path_probs(tree: Tree, table) -> np.ndarray:
    """float [N]: each node's path probability under a per-rank table (tree_acceptance.py): the product of
    table[rank] along its path, 0 past the table. A tree's expected accepted nodes is their sum."""
    t = np.asarray(table, float)
    pr = np.where(tree.rank < t.size, t[np.minimum(tree.rank, t.size - 1)], 0.0)
    reach = np.zeros(tree.nodes)
    for d in range(1, tree.max_depth + 1):   # parents sit one level up: one vector step per level
        at = tree.depth == d
        par = tree.parent[at]
        reach[at] = pr[at] * np.where(par >= 0, reach[np.maximum(par, 0)], 1.0)
    return reach
