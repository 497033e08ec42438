"""The simulator's acceptance model for draft trees: at which rank the target's token sits among the draft's
candidates.

At output position m of request r the target's token is the draft's rank-R candidate there, with
P(R = r) = table[r] (a per-rank table; 1 - sum(table): none of the tabled ranks). Under greedy decoding
the prefix before m is the target's own output whichever tree a policy drafted, so R is one draw per
(request, position) for the whole run, the same for every policy: the uniform u of that pair picks the
rank r with cum[r - 1] <= u < cum[r] (cum: the table's running sum). It is the very uniform the chain
models of acceptance.py draw (stream 0 of the keyed hash), so with table[0] = alpha a chain accepts
exactly where acceptance=iid with alpha and the same key does.

A tree drafted at a row's next position pos accepts its path greedily: at depth d (output position
pos + d) the current node's child of rank R, if it has one, is accepted and becomes the current node; the
first missing rank ends the path. The expected accepted length of a tree is the sum over its nodes of the
probability that the path reaches them: the product of table[rank] along the node's path (the ranks at
one position are exclusive events, the positions independent); for the chain [1] * k it is
sum_{j=1..k} table[0] ** j.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .tree import Tree, children_table, path_probs, rows

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLD = np.uint64(0x9E3779B97F4A7C15)


def _mix(x: np.ndarray) -> np.ndarray:
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def keyed_uniforms(key: int, request_ids: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """The uniform in [0, 1) of each (request id, output position) under `key`: _kernels.keyed_uniform on
    stream 0, in numpy (broadcast over the two arrays)."""
    rid = np.asarray(request_ids, np.int64).astype(np.uint64)
    pos = np.asarray(positions, np.int64).astype(np.uint64)
    with np.errstate(over="ignore"):
        base = _mix(np.uint64(key) ^ _mix(rid * _GOLD))
        h = _mix(base + (pos + np.uint64(1)) * _GOLD)
    return (h >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)


def check_table(table: Sequence[float]) -> np.ndarray:
    """The per-rank table as float64 [R]: entries in [0, 1] summing to at most 1; ValueError otherwise."""
    try:
        t = np.asarray(table, np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"rank table must be a list of probabilities, got {table!r}") from None
    if t.ndim != 1 or t.size == 0 or not np.all(np.isfinite(t)) or np.any(t < 0) or np.any(t > 1):
        raise ValueError(f"rank table must be a non-empty list of probabilities in [0, 1], got {table!r}")
    if t.sum() > 1 + 1e-9:
        raise ValueError(f"rank table sums to {t.sum():.6g} > 1")
    return t


def rank_table(alpha: float, decay: float | None = None, ranks: int = 8) -> np.ndarray:
    """Geometric per-rank probabilities: table[r] = alpha * decay ** r for r < ranks; decay defaults to
    1 - alpha (every rank's share of what the ranks above it missed is alpha)."""
    d = 1.0 - alpha if decay is None else decay
    if not 0 <= alpha <= 1 or not 0 <= d <= 1 or ranks < 1:
        raise ValueError(f"rank table: alpha and decay in [0, 1] and ranks >= 1 expected, got {alpha}, {d}, {ranks}")
    return check_table(alpha * d ** np.arange(ranks))


def ranks_of(u: np.ndarray, table: np.ndarray) -> np.ndarray:
    """The rank each uniform picks (cum[r - 1] <= u < cum[r]); -1 for u >= sum(table)."""
    cum = np.cumsum(table)
    r = np.searchsorted(cum, u, side="right")
    return np.where(r < table.size, r, -1)


def walk(trees: Tree | Sequence[Tree], ranks: np.ndarray, path: bool = False):
    """Accepted nodes per row of its tree (one Tree: the same for every row), given ranks [n, D] (the
    target token's rank at depths 1..D; D >= the deepest tree): the path follows the child of each depth's
    rank while there is one. path=True: (accepted, the path's node indices int64 [n, D] with -1 past its end,
    each row's last accepted query: 0 the root, 1 + i node i)."""
    n = ranks.shape[0]
    if isinstance(trees, Tree):
        kids, sel, D = trees.children()[None], np.zeros(n, np.int64), trees.max_depth
    else:
        kids, sel, D = children_table(trees), np.arange(n), max((t.max_depth for t in trees), default=0)
    W = kids.shape[2]
    cur = np.zeros(n, np.int64)   # the current query (0: the root)
    alive = np.ones(n, bool)
    a = np.zeros(n, np.int64)
    nodes = np.full((n, D), -1, np.int64) if path else None
    for d in range(D):
        r = ranks[:, d]
        ch = np.where((r >= 0) & (r < W), kids[sel, cur, np.clip(r, 0, W - 1)], -1)
        alive &= ch > 0
        cur = np.where(alive, ch, cur)
        a += alive
        if path:
            nodes[alive, d] = cur[alive] - 1
    return (a, nodes, cur) if path else a


def expected_accepted(tree: Tree, table: Sequence[float]) -> float:
    """The expected accepted nodes: sum over nodes of the product of table[rank] along the node's path."""
    return float(path_probs(tree, check_table(table)).sum())


class TreeAcceptance:
    """Per-rank acceptance keyed by (request id, output position); `key` as acceptance.Keyed draws it."""

    def __init__(self, table: Sequence[float]):
        self.table = check_table(table)

    def reset(self, rng: np.random.Generator) -> None:
        self.key = int(rng.integers(0, 1 << 63))

    def ranks(self, request_ids: np.ndarray, positions: np.ndarray, depth: int) -> np.ndarray:
        """int64 [n, depth]: the target token's rank at output positions positions[i] + 0..depth-1 of
        request request_ids[i] (-1: beyond the table)."""
        pos = np.asarray(positions, np.int64)[:, None] + np.arange(depth)[None, :]
        return ranks_of(keyed_uniforms(self.key, np.asarray(request_ids, np.int64)[:, None], pos), self.table)

    def accepted(self, trees: Tree | Sequence[Tree], request_ids: np.ndarray, positions: np.ndarray,
                 path: bool = False):
        """Accepted nodes per row for its tree (one Tree: every row's) drafted at its next output position;
        path=True: walk's (accepted, path, last query)."""
        ids = np.asarray(request_ids, np.int64)
        if not isinstance(trees, Tree):
            trees = rows(trees, ids.size)
            if trees and all(t is trees[0] for t in trees):   # one Tree for every row: one children table
                trees = trees[0]
        depth = trees.max_depth if isinstance(trees, Tree) else max((t.max_depth for t in trees), default=0)
        return walk(trees, self.ranks(ids, positions, depth), path)

    def confidences(self, trees: Sequence[Tree]) -> np.ndarray:
        """float [n, most nodes]: each node's table entry of its rank (0 past the table), NaN padding: the
        confidence a simulated draft reports for a node."""
        conf = np.full((len(trees), max((t.nodes for t in trees), default=0)), np.nan)
        padded = np.append(self.table, 0.0)
        for i, t in enumerate(trees):
            conf[i, :t.nodes] = padded[np.minimum(t.rank, self.table.size)]
        return conf
