"""Helpers shared by the zoo's policies: per-request state that follows rows through admission and
retirement, and step-time tables built from the view's cost model. Policy API and numpy only."""
from __future__ import annotations

import math

import numpy as np


class PerRequest:
    """Per-request float columns that follow `view.request_ids` (rows come and go between steps).

        st = PerRequest(n=2, init=(4.0, 0.0)); cols = st.align(view.request_ids)  # [batch, n]
    Rows of requests never seen before start at `init`; requests that left the batch are dropped.
    """

    def __init__(self, n: int, init=0.0):
        self.init = np.broadcast_to(np.asarray(init, dtype=float), (n,)).copy()
        self.reset()

    def reset(self):
        self.ids = np.empty(0, np.int64)
        self.cols = np.empty((0, self.init.size))

    def align(self, ids: np.ndarray) -> np.ndarray:
        """The columns, row-aligned with `ids` (the same array object across calls until ids change)."""
        if ids.shape == self.ids.shape and np.array_equal(ids, self.ids):
            return self.cols
        new = np.tile(self.init, (ids.size, 1))
        if self.ids.size:
            order = np.argsort(self.ids, kind="stable")
            sorted_ids = self.ids[order]
            at = np.minimum(np.searchsorted(sorted_ids, ids), sorted_ids.size - 1)
            found = sorted_ids[at] == ids
            new[found] = self.cols[order[at[found]]]
        self.ids, self.cols = np.array(ids, np.int64), new
        return self.cols


def _grid(n: int, dense: int = 32, points: int = 40) -> np.ndarray:
    """0..n exactly when small, else 0..dense plus a geometric grid up to n (for interpolation)."""
    if n <= dense + points:
        return np.arange(n + 1, dtype=float)
    g = np.unique(np.rint(np.geomspace(dense, n, points)))
    return np.concatenate([np.arange(dense, dtype=float), g])


class StepCost:
    """Predicted step time pieces for the current batch, from `view.cost`, as lookup tables:

      verify[x]  seconds of the verify forward carrying x draft tokens in total (plus one token per row)
      draft[m]   seconds of one draft forward over m rows
    Built at the batch's mean context (KV reads and attention are sums over the batch, so the mean is
    nearly exact) on a grid of x and m, interpolated in between (a roofline is piecewise linear). Tables
    are cached per (batch size, depth cap, mean context in 2% buckets), `cache` of them at most.
    """

    def __init__(self, cache: int = 512):
        self.key = None
        self.cache = cache
        self._tables = {}

    def update(self, view, kmax: int) -> "StepCost":
        ctx = view.context_lens
        n = ctx.size
        cbar = float(ctx.sum()) / n if n else 0.0
        key = (n, kmax, int(math.log1p(cbar) * 50.0), id(view.cost))
        if key == self.key:
            return self
        self.key = key
        hit = self._tables.get(key)
        if hit is not None:
            self.verify, self.draft = hit
            return self
        if len(self._tables) >= self.cache:
            self._tables.clear()
        cost = view.cost
        X = n * kmax
        xs = _grid(X)
        vt = np.array([cost.verify_time(ctx, np.full(n, x / n)) for x in xs])
        self.verify = np.interp(np.arange(X + 1), xs, vt) if xs.size != X + 1 else vt
        ms = _grid(n)
        dt = np.array([cost.draft_time(np.full(int(m), cbar)) if m else 0.0 for m in ms])
        self.draft = np.interp(np.arange(n + 1), ms, dt) if ms.size != n + 1 else dt
        self._tables[key] = (self.verify, self.draft)
        return self


def best_prefix(n_rows: int, rows: np.ndarray, pos: np.ndarray, value: np.ndarray, costs: StepCost,
                base_value: float):
    """Goodput of every prefix of a ranked slot list; returns (best prefix length, its goodput).

    Slot s drafts row rows[s] at position pos[s] (0-based) and is worth value[s] expected tokens. Prefix M
    predicts (base_value + sum of its values) / (verify[M] + sum over positions p of draft[m_p]), m_p the
    prefix's slots at position p: each slot adds one verify token and one row to its position's forward.
    """
    L = value.size
    if L == 0:
        return 0, base_value / costs.verify[0]
    # occurrence index of each slot within its position, in ranked order
    by_pos = np.argsort(pos, kind="stable")
    sp = pos[by_pos]
    starts = np.searchsorted(sp, sp, side="left")
    k = np.empty(L, np.int64)
    k[by_pos] = np.arange(L) - starts
    d_draft = costs.draft[k + 1] - costs.draft[k]
    t = costs.verify[:L + 1] + np.concatenate([[0.0], np.cumsum(d_draft)])
    e = base_value + np.concatenate([[0.0], np.cumsum(value)])
    g = e / t
    m = int(np.argmax(g))
    return m, float(g[m])


def fit_token_cap(depths: np.ndarray, view) -> np.ndarray:
    """Clip depths at the largest c with batch + sum(min(depths, c)) <= view.max_num_batched_tokens (the
    engine's hard cap), so that a policy's plan is valid at any batch size."""
    room = view.max_num_batched_tokens - view.batch_size
    if int(depths.sum()) <= room:
        return depths
    if room <= 0:
        return np.zeros_like(depths)
    srt = np.sort(depths)
    # total(c) = sum(min(d, c)) is nondecreasing in c: largest c with total(c) <= room
    lo, hi = 0, int(srt[-1])
    while lo < hi:
        c = (lo + hi + 1) // 2
        if int(np.minimum(srt, c).sum()) <= room:
            lo = c
        else:
            hi = c - 1
    return np.minimum(depths, lo)
