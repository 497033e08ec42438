import numpy as np

from specdepth.errors import as_float, as_int
from specdepth.policy import Policy
from specdepth.tree import by_object, chain

from .kit import PerRequest, best_order, draft_caps, kernels
from .kit import tree as kit_tree


class TreeConfidence(Policy):
    """Per sequence, a draft tree shaped by the draft's confidence: deep where the draft is sure, wide where
    it is unsure.

    Rule: each sequence's confidence c is an average (weight `memory` steps) of the draft's probability of
    its top-ranked tokens (the rank-0 nodes' view.node_confidences; view.confidences on a chain step), starting
    at view.acceptance_prior. Its tree is the best tree of N nodes under the geometric table c (1 - c)^r
    (`kit.best_order`): near c = 1 a chain of N, at small c mostly siblings near the root. Rounded to
    `resolution`, so sequences of like confidence share a tree.
    Budget: the token budget, as the seed's rule: N = (token_budget - batch_size) // batch_size nodes a
    sequence, at least 1, at most `max_nodes`, within the engine's hard cap; depth at most `max_depth` and the
    sequence's remaining tokens - 1.
    Parameters: `max_nodes`, `max_depth`, `memory`, `resolution`.
    """

    name = "tree_confidence"
    depth_param = "max_depth"

    def __init__(self, max_nodes: int = 16, max_depth: int = 8, memory: float = 4.0, resolution: float = 0.05):
        self.max_nodes = as_int(max_nodes, "policy.max_nodes", min=0)
        self.max_depth = as_int(max_depth, "policy.max_depth", min=0)
        self.memory = as_float(memory, "policy.memory", min=1)
        self.resolution = as_float(resolution, "policy.resolution", min=0, max=0.5, min_open=True)
        self.reset()

    def reset(self):
        self._conf = PerRequest(conf=np.nan)
        self._trees, self._chains = {}, {}

    def plan(self, view):
        n = view.batch_size
        room = (view.max_num_batched_tokens - n) // n
        N = min(self.max_nodes, room, max(1, (view.token_budget - n) // n))
        D = min(self.max_depth, view.max_depth)
        if N <= 0 or D <= 0:
            return np.zeros(n, np.int64)
        rows = self._conf.align(view.request_ids)
        c = np.where(np.isnan(rows.conf), view.acceptance_prior, rows.conf)
        level = np.clip(np.round(c / self.resolution) * self.resolution, self.resolution, 1.0)
        keys = list(zip(level.tolist(), draft_caps(view, D).tolist()))
        trees = dict.fromkeys(keys)   # each (level, cap) once, in first-row order
        for a, cap in trees:
            trees[a, cap] = self._tree(a, N, cap)
        return [trees[k] for k in keys]

    def _tree(self, c: float, N: int, cap: int):
        key = (round(c, 6), N, cap)
        t = self._trees.get(key)
        if t is None:
            table = c * (1.0 - c) ** np.arange(N)
            order = best_order(table, N, cap)
            t = self._trees[key] = order.tree(order.parent.size) if cap else chain(0)
        return t

    def observe(self, view, accepted):
        seen = self._top_confidence(view)
        rows = self._conf.align(view.request_ids)
        has = ~np.isnan(seen)
        old = rows.conf[has]
        rows.conf[has] = np.where(np.isnan(old), seen[has], old + (seen[has] - old) / self.memory)

    def _top_confidence(self, view) -> np.ndarray:
        """Per row, the mean confidence of this step's top-ranked drafts (NaN where it drafted none)."""
        trees, out = view.trees, np.full(view.batch_size, np.nan)
        if trees is None:   # a chain step: every draft is its parent's top-ranked token
            conf = view.confidences
            fast = kit_tree.COMPILED and conf is not None and conf.dtype == np.float64 and conf.shape[1] <= 128
            if fast and conf.size:
                kernels.row_means(conf, out)   # the numpy form's arithmetic, below
            elif conf is not None and conf.size:
                seen = ~np.isnan(conf)
                cnt = seen.sum(axis=1)
                out[cnt > 0] = np.where(seen, conf, 0.0).sum(axis=1)[cnt > 0] / cnt[cnt > 0]
            return out
        nc = view.node_confidences
        for t, idx in by_object(trees, view.batch_size):   # each Tree object once
            idx = np.arange(view.batch_size) if isinstance(idx, slice) else idx
            if t.nodes and kit_tree.COMPILED and nc.dtype == np.float64 and t.nodes <= 128:
                kernels.picked_means(nc, idx, np.flatnonzero(t.rank == 0), out)   # the numpy form's arithmetic
            elif t.nodes:
                out[idx] = nc[idx, :t.nodes][:, t.rank == 0].mean(axis=1)
        return out
