"""Draft trees for policies: a tree's expected accepted nodes under a per-rank table, the best tree for a node
budget, an online estimate of the table, a tree step's price, and each row's node count under the shared budget.

A per-rank table t[r] is the probability that the target's token is the draft's rank-r candidate at a position
(specdepth.tree_acceptance). A node's path probability is the product of t[rank] along its path; a tree's
expected accepted nodes is the sum of its nodes' path probabilities. For a non-increasing table the best tree of
N nodes is the N nodes of highest path probability (`best_order`: best-first, prefix-closed), and the best trees
are nested: the tree of N + 1 nodes is the tree of N plus one node.

    order = best_order(table, 64, max_depth=8)         # node parents, ranks, depths, path probabilities
    tree = order.tree(10)                               # the best 10-node tree (a specdepth.tree.Tree)
    est = RankEstimate(ranks=8); est.observe(trees, accepted)   # in observe: the table from outcomes
    price = TreePrice(); price.update(view.cost, view.context_lens)
    plan = plan_trees(est.table, price, view.batch_size, caps, max_nodes=64, max_depth=8)
"""
from __future__ import annotations

import functools
import heapq
import math
from dataclasses import dataclass, field

import numpy as np

from specdepth.tree import Tree, by_object, chain, from_parents, path_probs, rows

from . import kernels

COMPILED = True   # the compiled loops (kit/kernels.py); False: their numpy form, which they equal (tests compare)


# ---- a tree's expected accepted nodes -------------------------------------------------------------------------
def expected_accepted(trees, table: np.ndarray, n: int | None = None) -> np.ndarray:
    """float [n]: each row's expected accepted nodes (tree_acceptance.expected_accepted's rule; a Tree shared by
    rows is computed once)."""
    ts = rows(trees, n)
    memo: dict[int, float] = {}
    for t in ts:
        if id(t) not in memo:
            memo[id(t)] = float(path_probs(t, table).sum())
    return np.array([memo[id(t)] for t in ts])


# ---- the best tree for a node budget --------------------------------------------------------------------------
@dataclass(frozen=True)
class Order:
    """Nodes in best-first order: parent (-1: the root), rank, depth (1 below the root) and path probability;
    its first N nodes are the best N-node tree."""
    parent: np.ndarray
    rank: np.ndarray
    depth: np.ndarray
    prob: np.ndarray
    memo: dict = field(default_factory=dict, compare=False, repr=False)

    def tree(self, nodes: int, max_depth: int | None = None) -> Tree:
        """The first `nodes` nodes as a Tree; `max_depth`: without the nodes deeper than it (their subtrees are
        deeper too, so the rest is the best tree of its size at that depth)."""
        keep = np.arange(nodes) if max_depth is None else np.flatnonzero(self.depth[:nodes] <= max_depth)
        if keep.size == nodes:
            return from_parents(self.parent[:nodes])
        new = np.full(nodes, -1, np.int64)
        new[keep] = np.arange(keep.size)
        par = self.parent[keep]
        return from_parents(np.where(par >= 0, new[np.maximum(par, 0)], -1))

    def levels(self) -> np.ndarray:
        """int64 [N + 1, D]: the draft's tokens per level (specdepth.tree.parent_counts) of the first N nodes:
        a node's rank-0 child opens its parent's slot in the level below it (computed once, read-only)."""
        if "levels" not in self.memo:
            D = int(self.depth.max(initial=0))
            out = np.zeros((self.parent.size + 1, max(D, 1)), np.int64)
            first = np.flatnonzero(self.rank == 0)
            out[first + 1, self.depth[first] - 1] = 1
            self.memo["levels"] = out = np.cumsum(out, axis=0)
            out.flags.writeable = False
        return self.memo["levels"]


def best_order(table, max_nodes: int, max_depth: int) -> Order:
    """The `max_nodes` nodes of highest path probability under `table` (non-increasing), at most `max_depth`
    deep, best first: a heap of candidates, where taking a node offers its rank-0 child and its next sibling.
    Each node comes after its parent and its lower-ranked siblings, so every prefix is a valid tree; ties go to
    the shallower, then the earlier node. Cached (the last 256 tables; the arrays are read-only)."""
    return _best_order(np.asarray(table, float).tobytes(), int(max_nodes), int(max_depth))


@functools.lru_cache(maxsize=256)
def _best_order(key: bytes, max_nodes: int, max_depth: int) -> Order:
    t = np.frombuffer(key, float)
    R = t.size
    parent, rank, depth, prob = [], [], [], []
    heap = [(-t[0], 1, 0, -1, 0)] if R and max_depth >= 1 and t[0] > 0 else []   # (-prob, depth, seq, par, rank)
    seq = 1
    while heap and len(parent) < max_nodes:
        p, d, _, par, r = heapq.heappop(heap)
        i = len(parent)
        parent.append(par), rank.append(r), depth.append(d), prob.append(-p)
        base = 1.0 if par < 0 else prob[par]
        offers = [(-p * t[0], d + 1, i, 0)] if d < max_depth else []   # -p: this node's path probability
        if r + 1 < R:
            offers.append((base * t[r + 1], d, par, r + 1))
        for q, dd, pp, rr in offers:
            if q > 0:
                heapq.heappush(heap, (-q, dd, seq, pp, rr))
                seq += 1
    arrays = [np.array(a, dtype) for a, dtype in ((parent, np.int64), (rank, np.int64), (depth, np.int64),
                                                  (prob, float))]
    for a in arrays:
        a.flags.writeable = False
    return Order(*arrays)


def best_tree(table, nodes: int, max_depth: int) -> Tree:
    """The N-node tree with the most expected accepted nodes under a non-increasing table."""
    return best_order(table, nodes, max_depth).tree(nodes)


def chain_groups(drafted: np.ndarray, chains: dict) -> list:
    """specdepth.tree.by_object's groups for rows whose trees are chains of `drafted` nodes: (chain(k), rows) in
    first-row order (rows: an index array, or a slice where every row has the same k). `chains`: the chains by k,
    kept by the caller (one Tree object per k; the missing ones are added)."""
    d = np.asarray(drafted)
    if COMPILED and d.dtype == np.int64 and d.ndim == 1:
        ks, starts, rws = kernels.first_groups(d)
        ks, at = ks.tolist(), starts.tolist()
        groups = [(k, rws[at[g]:at[g + 1]]) for g, k in enumerate(ks)]
    else:
        ks = list(dict.fromkeys(d.tolist()))
        groups = [(k, np.flatnonzero(d == k)) for k in ks]
    for k in set(ks).difference(chains):
        chains[k] = chain(k)
    if len(groups) == 1:
        return [(chains[ks[0]], slice(None))]
    return [(chains[k], idx) for k, idx in groups]


# ---- the per-rank table, online ----------------------------------------------------------------------------
class RankEstimate:
    """The per-rank table estimated from what every engine sees after a step: each row's tree and its accepted
    path length. The table is kept as hazards h[r] = P(R = r | R >= r) (t[r] = h[r] prod_{s<r} (1 - h[s])),
    each the ratio of hits (the accepted path took rank r) to trials (R >= r was known, and whether R = r). A
    path of length a gives an accepted node at depths 1..a and, past it, a miss of every child rank of its last
    node. Which path of length a it was is not seen: EM weighs each by its probability under the table. The
    observations are kept as row counts per (tree shape, a), decayed (`memory`: observed rows remembered), and one
    EM iteration over all of them runs once the rows observed since the last grew by `every` x the rows kept
    (at least one step apart; a chain's path is exact). The prior, worth
    `strength` trials per rank: a rate (the geometric table of it: hazard `prior` at every rank) or a table
    (e.g. the draft's mean confidence per rank, `RankConfidence`). The table is made non-increasing over ranks.
    Path lengths tell ranks apart only where the tree tries different widths: under a product tree of width w
    at every level only P(R < w) is learnt (the prior keeps the split)."""

    def __init__(self, ranks: int = 8, prior: float = 0.7, strength: float = 10.0, memory: float = 5000.0,
                 every: float = 0.0):
        self.ranks, self.strength, self.memory, self.every = int(ranks), float(strength), float(memory), float(every)
        self._new = self._kept = 0.0   # rows observed since the last EM iteration; rows kept
        self.hits = np.zeros(self.ranks)
        self.trials = np.zeros(self.ranks)
        self._groups: dict[bytes, list] = {}   # tree shape (parents) -> [tree, decayed rows per path length]
        self._cnt, self._coff = np.zeros(0), np.zeros(1, np.int64)   # the groups' rows end to end (views), offsets
        self._packed = None   # the groups' trees end to end, for the compiled refresh
        self._slots = self._decay = None   # chains' offsets in _cnt (observe_chains); (rows, exp(-rows / memory))
        self._chains: dict = {}   # chain Trees by node count (observe_chains)
        self._start = self._tab = None   # the last start's prior and hazards; the last table and its inputs
        self.start(prior)

    def start(self, prior) -> None:
        """Set the prior, kept until the next call: a rate (view.acceptance_prior) or a table [ranks] (the same
        prior as the last call's keeps its hazards)."""
        key = float(prior) if np.ndim(prior) == 0 else np.asarray(prior, float)[:self.ranks].tobytes()
        if self._start is not None and self._start[0] == key and self._start[1] is self.prior:
            return
        if np.ndim(prior) == 0:
            self.prior = np.full(self.ranks, float(prior))
        elif COMPILED and np.ndim(prior) == 1:   # a table's hazards, as below
            t = np.asarray(prior, float)[:self.ranks]
            self.prior = kernels.hazards(t, np.empty(t.size))
        else:   # a table's hazards
            t = np.asarray(prior, float)[:self.ranks]
            left = 1.0 - np.concatenate([[0.0], np.cumsum(t)[:-1]])
            self.prior = np.clip(t / np.maximum(left, 1e-12), 0.0, 1.0)
        self._start = (key, self.prior)

    def start_rounded(self, prior, scale: float) -> np.ndarray:
        """start(prior), then `table` rounded to 1 / scale: np.round(table x scale) / scale (a new array; compiled
        for a table prior: kernels.started_table)."""
        R = self.ranks
        if COMPILED and np.ndim(prior) == 1 and self.hits.shape == self.trials.shape == (R,):
            t = np.asarray(prior, float)[:R]
            if t.size == R:
                self.prior, table, out = np.empty(R), np.empty(R), np.empty(R)
                kernels.started_table(t, self.hits, self.trials, self.strength, float(scale), self.prior, table, out)
                self._start = self._tab = None   # their keys made when next asked
                return out
        self.start(prior)
        return np.round(self.table * scale) / scale

    @property
    def table(self) -> np.ndarray:
        key = (self.hits.tobytes(), self.trials.tobytes(), self.prior.tobytes(), self.strength)
        if self._tab is None or self._tab[0] != key:   # computed once per hits, trials and prior
            if COMPILED and self.hits.shape == self.trials.shape == self.prior.shape == (self.ranks,):
                self._tab = (key, kernels.rank_table(self.hits, self.trials, self.prior, self.strength,
                                                     np.empty(self.ranks)))   # the numpy form's arithmetic
            else:
                h = (self.hits + self.strength * self.prior) / (self.trials + self.strength)
                t = h * np.concatenate([[1.0], np.cumprod(1.0 - h)[:-1]])
                self._tab = (key, np.minimum.accumulate(t))
        return self._tab[1].copy()

    def observe(self, trees, accepted: np.ndarray) -> None:
        """Add one step's rows: their trees (a Tree for all, or one per row) and accepted path lengths."""
        acc = np.asarray(accepted, np.int64)
        self.observe_groups(by_object(trees, acc.size), acc)

    def observe_chains(self, drafted: np.ndarray, accepted: np.ndarray) -> None:
        """`observe` where row i's tree is a chain of drafted[i] nodes (a step where no row drafted is not
        observed): observe_groups over chain_groups' groups (compiled: kernels.chain_add once every chain has its
        group)."""
        d, acc = np.asarray(drafted), np.asarray(accepted, np.int64)
        if COMPILED and d.dtype == np.int64 and d.ndim == 1 and d.shape == acc.shape:
            keep = self._keep(acc.size)
            done = kernels.chain_add(d, acc, self._chain_slots(), self._cnt, keep)
            if done >= 0:
                return self._counted(acc.size, keep) if done else None
        groups = chain_groups(d, self._chains)
        if any(t.nodes for t, _ in groups):
            self.observe_groups(groups, acc)

    def _keep(self, rows: int):
        """np.exp(-rows / memory): what the kept rows decay by in a step of `rows` rows (kept per row count)."""
        if self._decay is None or self._decay[0] != rows:
            self._decay = (rows, np.exp(-rows / self.memory))
        return self._decay[1]

    def _chain_slots(self) -> np.ndarray:
        """int64 [K + 1]: the offset in _cnt of the rows of the chain of k nodes (-1: no group), kept until the
        groups are repacked."""
        if self._slots is None:
            chains = {g[0].nodes: o for g, o in zip(self._groups.values(), self._coff.tolist())
                      if g[0].nodes and g[0].is_chain}
            self._slots = np.full(max(chains, default=0) + 1, -1, np.int64)
            for k, o in chains.items():
                self._slots[k] = o
        return self._slots

    def observe_groups(self, groups: list, accepted: np.ndarray) -> None:
        """`observe` with the rows' trees grouped as specdepth.tree.by_object groups them: (Tree, rows) pairs."""
        acc = np.asarray(accepted, np.int64)
        keep = self._keep(acc.size)
        self._cnt *= keep   # every group's rows (views of it)
        for t, idx in groups:
            if t.nodes:   # nothing drafted, nothing learnt
                g = self._groups.get(key := t.parent.tobytes())
                if g is None:
                    self._groups[key] = [t, np.zeros(t.max_depth + 1)]
                    g = self._repack()[key]
                if not (COMPILED and kernels.add_ones(g[1], acc[idx])):
                    np.add.at(g[1], acc[idx], 1.0)   # one row at a time, in row order
        self._counted(acc.size, keep)

    def _counted(self, rows: int, keep) -> None:
        """A step of `rows` rows observed: the rows kept and since the last EM iteration; refresh when due."""
        self._new += rows
        self._kept = self._kept * keep + rows
        if self._new >= self.every * self._kept:
            self.refresh()

    def refresh(self) -> None:
        """One EM iteration over the kept observations (tree shapes that decayed below 1e-3 rows are dropped)."""
        self._new = 0.0
        if COMPILED and self._groups:
            return self._refresh_compiled()
        self._groups = {k: g for k, g in self._groups.items() if g[1].sum() >= 1e-3}
        self._repack()
        table = self.table
        hits, trials = np.zeros(self.ranks), np.zeros(self.ranks)
        for t, counts in self._groups.values():
            h, tr = self._expected_counts(t, counts, table)
            hits += h
            trials += tr
        self.hits, self.trials = hits, trials

    def _refresh_compiled(self) -> None:
        """refresh by kernels.expected_counts (the groups' trees end to end, kept while the shapes hold)."""
        if self._packed is None:   # until the groups are repacked
            ts = [g[0] for g in self._groups.values()]
            (par, noff), (dep, _), (rnk, _) = (_flat([getattr(t, a) for t in ts], np.int64)
                                               for a in ("parent", "depth", "rank"))
            self._packed = (par, dep, rnk, np.append(noff, par.size))
        par, dep, rnk, noff = self._packed
        R = self.ranks
        hits, trials, keep = np.zeros(R), np.zeros(R), np.zeros(len(self._groups), bool)
        if self.hits.shape == self.trials.shape == self.prior.shape == (R,):   # `table`'s compiled form, uncached
            table = kernels.rank_table(self.hits, self.trials, self.prior, self.strength, np.empty(R))
        else:
            table = self.table
        kept = kernels.expected_counts(par, dep, rnk, noff, self._cnt, self._coff, table, R, hits, trials, keep)
        if kept < keep.size:
            self._groups = {k: g for (k, g), kp in zip(self._groups.items(), keep.tolist()) if kp}
            self._repack()
        self.hits, self.trials = hits, trials

    def _repack(self) -> dict:
        """The groups' rows end to end in one array (each group's a view of it, decayed by one product) and their
        offsets; returns the groups."""
        rows = [g[1] for g in self._groups.values()]
        self._cnt, off = _flat(rows, float) if rows else (np.zeros(0), np.zeros(0, np.int64))
        self._coff = np.append(off, self._cnt.size)
        self._slots = self._packed = None
        for g, o in zip(self._groups.values(), off.tolist()):
            g[1] = self._cnt[o:o + g[1].size]
        return self._groups

    def _expected_counts(self, tree: Tree, counts: np.ndarray, table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Expected hits and trials per rank of the rows whose paths on `tree` accepted a nodes (counts[a] rows)."""
        R = self.ranks
        kids = np.bincount(tree.parent + 1, minlength=tree.nodes + 1)   # [root, node 0, ...]
        reach = path_probs(tree, table)
        t = np.concatenate([table, [0.0]])
        miss = 1.0 - np.bincount(tree.parent + 1, weights=t[np.minimum(tree.rank, table.size)],
                                 minlength=tree.nodes + 1)   # P(no child rank matches), per [root, node 0, ...]
        end = reach * np.maximum(miss[1:], 0.0)                  # a path ends at the node: its weight
        level = np.bincount(tree.depth, weights=end, minlength=counts.size)
        size = np.bincount(tree.depth, minlength=counts.size)
        post = np.where(level[tree.depth] > 0, end / np.where(level > 0, level, 1.0)[tree.depth], 1.0 / size[tree.depth])
        W = np.concatenate([[counts[0]], counts[tree.depth] * post])   # rows ending at [root, node 0, ...]
        mass = W.copy()
        for d in range(tree.max_depth, 1, -1):   # a path through a node: the rows ending below it
            at = np.flatnonzero(tree.depth == d)
            np.add.at(mass, tree.parent[at] + 1, mass[at + 1])
        full = np.bincount(np.minimum(tree.rank, R), weights=mass[1:], minlength=R + 1)   # [R]: past the table
        hits, trials = full[:R], np.cumsum(full[::-1])[::-1][:R]   # an accepted rank r: a trial at ranks 0..r
        k = np.minimum(kids, R)                                      # a miss of ranks 0..k-1 where a path ends
        trials = trials + np.cumsum(np.bincount(k, weights=W, minlength=R + 1)[::-1])[::-1][1:]
        return hits, trials


class RankConfidence:
    """The draft's mean confidence (its probability of the token it proposed) per rank, over the tree steps'
    nodes (view.node_confidences, with each Tree's ranks), decayed (`memory`: nodes remembered per rank), extended
    past the ranks drafted by their trend (`table`). A draft that is calibrated gives the per-rank table (the
    simulator's confidences are the table's entries); RankEstimate takes it as a prior."""

    def __init__(self, ranks: int = 8, memory: float = 5000.0):
        self.ranks, self.memory = int(ranks), float(memory)
        self.sums, self.counts = np.zeros(self.ranks), np.zeros(self.ranks)
        self.version = 0   # observe_groups' calls that changed sums and counts
        self._tab = None   # the last table and its inputs
        self._decay: dict = {}   # np.exp(-(seen / memory)) by seen
        self._rows = np.zeros(0, np.int64)   # np.arange(n) for the last n
        self._bins = (np.zeros(self.ranks + 1), np.zeros(self.ranks + 1, np.int64))   # kernels.rank_bins' scratch
        self._steps = [np.arange(self.ranks - k) for k in range(self.ranks)]   # np.arange(ranks - k) by k

    def observe(self, trees, confidences: np.ndarray) -> None:
        """Add one tree step's nodes: the rows' trees (a Tree for all, or one per row) and their confidences."""
        self.observe_groups(by_object(trees, confidences.shape[0]), confidences)

    def observe_groups(self, groups: list, confidences: np.ndarray) -> None:
        """`observe` with the rows' trees grouped as specdepth.tree.by_object groups them: (Tree, rows) pairs."""
        n = confidences.shape[0]
        fast = COMPILED and confidences.dtype == np.float64 and confidences.ndim == 2
        for t, idx in groups:
            if not t.nodes:
                continue
            self.version += 1
            rws = self._all_rows(n) if isinstance(idx, slice) else np.asarray(idx)
            ok_rows = fast and rws.dtype == np.int64 and rws.ndim == 1
            ok_rows = ok_rows and self.sums.shape == self.counts.shape == (self.ranks,)
            b, k = self._bins
            seen = kernels.rank_bins(confidences, rws, t.nodes, t.rank, self.ranks, b, k) if ok_rows else -1
            if seen >= 0:   # the numpy form's arithmetic (-1: out of range)
                e = self._decay.get(seen)
                if e is None:
                    if len(self._decay) >= 4096:
                        self._decay.clear()
                    e = self._decay[seen] = np.exp(-(float(seen) / self.memory))
                kernels.rank_means_add(e, b, k, self.sums, self.counts)
                continue
            c = confidences[idx, :t.nodes]
            ok = ~np.isnan(c)
            r = np.broadcast_to(np.minimum(t.rank, self.ranks), c.shape)
            w = float(ok.sum()) / self.memory
            self.sums *= np.exp(-w)
            self.counts *= np.exp(-w)
            self.sums += np.bincount(r[ok], weights=c[ok], minlength=self.ranks + 1)[:self.ranks]
            self.counts += np.bincount(r[ok], minlength=self.ranks + 1)[:self.ranks]

    def _all_rows(self, n: int) -> np.ndarray:
        """np.arange(n) (kept per n; read-only)."""
        if self._rows.size != n:
            self._rows = np.arange(n)
            self._rows.flags.writeable = False
        return self._rows

    def table(self, fallback: np.ndarray) -> np.ndarray:
        """The mean confidence per rank over the ranks drafted so far (0..k-1: trees are rank-contiguous), and past
        them the last one's hazard kept (each further rank takes that share of what is left): a rank never drafted
        is priced as likely as the trend says, so that a tree may try it. `fallback` where nothing was drafted.
        Computed once per sums, counts and fallback."""
        key = (self.sums.tobytes(), self.counts.tobytes(), np.asarray(fallback, float).tobytes())
        if self._tab is None or self._tab[0] != key:
            self._tab = (key, self._table(fallback))
        return self._tab[1].copy()

    def table_now(self, fallback: np.ndarray) -> np.ndarray:
        """`table`, computed now (no cache: for a caller that keeps it while sums and counts hold); a new array or
        fallback's first ranks."""
        return self._table(fallback)

    def _table(self, fallback: np.ndarray) -> np.ndarray:
        if COMPILED and self.sums.shape == self.counts.shape == (self.ranks,):   # the numpy form's arithmetic
            out = np.empty(self.ranks)
            k, left, h = kernels.confidence_head(self.sums, self.counts, out)
            if k == 0:
                return np.asarray(fallback, float)[:self.ranks]
            if k < self.ranks:   # left * h * (1.0 - h) ** np.arange(ranks - k), into out[k:]
                np.multiply(left * h, (1.0 - h) ** self._steps[k], out=out[k:])
            return out
        drafted = self.counts > 0
        k = self.ranks if drafted.all() else int(np.argmin(drafted))   # the ranks 0..k-1 drafted
        if k == 0:
            return np.asarray(fallback, float)[:self.ranks]
        t = self.sums[:k] / self.counts[:k]
        left = 1.0 - t.sum()
        h = min(max(t[-1] / max(left + t[-1], 1e-12), 0.0), 1.0)   # the last drafted rank's hazard
        more = left * h * (1.0 - h) ** np.arange(self.ranks - k)
        return np.concatenate([t, more])


# ---- a tree step's price ---------------------------------------------------------------------------------
class TreePrice:
    """A tree step's predicted seconds for the current batch, from a cost model (view.cost), as
    specdepth.tree.tree_step_time prices it: one draft forward per level over the rows' parent tokens there,
    then the verify with the nodes as drafts (plus `cost.position_overhead_s` a level where the cost has one, as
    the simulator's true cost does). Priced at the batch's mean context, every row alike (rows may have
    fractional token counts: a fraction of the rows one token more), in tables cached per batch size and mean
    context (2% buckets). `calibration` (a kit.CostCalibration, optional): its fitted scale and fixed part per
    phase correct the model (draft: a fixed part per forward; verify: per step)."""

    def __init__(self, calibration=None):
        self.calibration = calibration
        self._key = None
        self._memo: dict = {}   # plan_trees' candidate parts under the current tables

    def update(self, cost, ctx: np.ndarray) -> "TreePrice":
        n = int(ctx.size)
        if COMPILED and n and ctx.dtype == np.int64 and ctx.ndim == 1:
            cbar = float(kernels.int_stats(ctx)[2]) / n   # ctx.mean(): its float sum of integers is exact
        else:
            cbar = float(ctx.mean()) if n else 0.0
        key = (n, int(np.log1p(cbar) * 50.0), id(cost))
        if key != self._key:
            self._key, self.cost, self.n, self.cbar = key, cost, n, cbar
            self._verify = np.zeros(0)
            self._draft = np.zeros(1)   # q = 0: no forward
            self._memo = {}
        return self

    def _tables(self, nodes: float, q: float) -> tuple[np.ndarray, np.ndarray]:
        """verify[x]: x nodes a row; draft[q]: one forward of q tokens a row; grown to cover the arguments."""
        n, X, Q = self.n, math.ceil(nodes) + 1, math.ceil(q) + 1
        if self._verify.size >= X + 1 and self._draft.size >= Q + 1:
            return self._verify, self._draft
        c = np.full(n, self.cbar)
        if hasattr(self.cost, "tree_tables"):   # a CostModel: both tables in one call, the same values
            X, Q = max(X, self._verify.size - 1), max(Q, self._draft.size - 1)
            self._verify, self._draft = self.cost.tree_tables(c, X, Q)
            self._memo = {}
            return self._verify, self._draft
        if self._verify.size < X + 1:
            xs = np.arange(X + 1, dtype=float)
            if hasattr(self.cost, "verify_times"):
                self._verify = np.asarray(self.cost.verify_times(c, xs * n), float)
            else:
                self._verify = np.array([self.cost.verify_time(c, np.full(n, x)) for x in xs])
            self._memo = {}
        if self._draft.size < Q + 1:
            qs = range(self._draft.size, Q + 1)
            if hasattr(self.cost, "draft_forward_times"):   # a CostModel: the same values in one call
                more = self.cost.draft_forward_times(c, np.arange(qs.start, qs.stop))
            else:
                more = [self.cost.draft_forward(c, np.full(n, qq, np.int64))[0] for qq in qs]
            self._draft = np.concatenate([self._draft, more])
            self._memo = {}
        return self._verify, self._draft

    def candidates(self, pack: "_Orders | None", n: int, steps: int) -> tuple[float, np.ndarray, np.ndarray]:
        """plan_trees' candidates priced by parts, as `seconds` prices them, the tables grown at once to the
        plan's largest demand (an entry does not depend on the table's size): the zero plan's seconds, float
        [4, candidates] (tokens, summed draft seconds, forwards, verify seconds) and each depth cap's first
        candidate (and the end); kept while the tables hold."""
        hit = self._heads(pack, n, steps)
        if hit[3] is not None:   # the blocks not filled yet
            kernels.fill_blocks(hit[1], *hit[3][:5], float(n), pack.levels, pack.loff, pack.Ns, pack.cols, pack.fw,
                                pack.moved, steps, *hit[4])
        return self._zero(*hit[0]), hit[1], hit[2]

    def _heads(self, pack: "_Orders | None", n: int, steps: int) -> tuple:
        """`candidates`' parts to be filled block by block (kernels.fill_block): (zero plan's parts, parts, first
        candidates, (block_heads' parts, block_seconds', the blocks filled, xs, verify table, bounds hold) or
        None, (draft table, oh)); kept while the tables hold, the blocks filled in place."""
        key = (None if pack is None else pack.key, n, steps)
        hit = self._memo.get(key)
        if hit is None:
            some = pack is not None and pack.Ns.size > 0
            v, dr = self._tables(pack.most[0] if some else 0.0, pack.most[1] if some else 0.0)
            oh = float(getattr(self.cost, "position_overhead_s", 0.0))
            zero = (0.0, float(v[0]))   # the plan without nodes: no draft forward, a verify of one token a row
            if some:
                base, coff, xs, ok = pack.heads(n, steps)
                sec = np.empty((2, base.shape[1]))
                ok = kernels.block_seconds(pack.levels, pack.loff, pack.Ns, pack.cols, pack.moved, steps, v, dr, oh,
                                           sec) and ok
                parts, lazy = np.empty((4, int(coff[-1]))), (base, sec, np.zeros(base.shape[1], bool), xs, v, ok)
            else:
                parts, coff, lazy = np.zeros((4, 0)), np.zeros(1, np.int64), None
            if len(self._memo) >= 64:
                self._memo.clear()
            hit = self._memo[key] = (zero, parts, coff, lazy, (dr, oh))
        return hit

    def _zero(self, draft: float, verify: float, params=None) -> float:
        """`seconds` of the plan without nodes from its summed draft and verify seconds (`params`: the
        calibration's draft and verify params, where read already)."""
        if self.calibration is not None:
            (sd, cd), (sv, cv) = params or (self.calibration.params("draft"), self.calibration.params("verify"))
            return float(sd * draft + cd * 0.0 + sv * verify + cv)
        return float(draft + verify)

    def seconds(self, nodes: np.ndarray, levels: np.ndarray) -> np.ndarray:
        """Step seconds of plans where every row has `nodes[j]` nodes and `levels[j, d]` draft tokens at level d
        (fractional: interpolated), for each plan j."""
        nodes = np.asarray(nodes, float)
        levels = np.asarray(levels, float).reshape(nodes.size, -1)
        v, dr = self._tables(float(nodes.max(initial=0)), float(levels.max(initial=0)))
        verify = np.interp(nodes, np.arange(v.size), v)
        draft = np.interp(levels, np.arange(dr.size), dr)
        forwards = (levels > 0).sum(axis=1)
        draft = draft + (levels > 0) * float(getattr(self.cost, "position_overhead_s", 0.0))   # the clock's a level
        if self.calibration is not None:
            (sd, cd), (sv, cv) = self.calibration.params("draft"), self.calibration.params("verify")
            return sd * draft.sum(axis=1) + cd * forwards + sv * verify + cv
        return draft.sum(axis=1) + verify


# ---- each row's tree under the shared budget ---------------------------------------------------------------
@dataclass
class TreePlan:
    """A plan_trees answer: the depth cap and nodes per row (fractional: that fraction of the rows one node
    more), its expected tokens per step and per second, and the order its trees come from."""
    depth: int
    nodes: float
    tokens: float
    goodput: float
    order: Order


def _flat(arrays: list, dtype) -> tuple[np.ndarray, np.ndarray]:
    """The arrays end to end (one new array of `dtype`) and each one's offset there."""
    sizes = np.array([a.size for a in arrays], np.int64)
    buf = np.concatenate(arrays).astype(dtype, copy=False) if arrays else np.zeros(1, dtype)
    return buf, np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)


@dataclass(frozen=True)
class _Orders:
    """plan_trees' depth caps with nodes and their orders, flat for the compiled search: node probabilities and
    levels end to end (offsets poff, loff), node counts Ns, level columns and each cap's most draft tokens,
    and per node count its levels with tokens and the level its next node moves (kernels.level_moves)."""
    key: tuple
    depths: list
    orders: list
    probs: np.ndarray
    poff: np.ndarray
    levels: np.ndarray
    loff: np.ndarray
    Ns: np.ndarray
    cols: np.ndarray
    lmax: np.ndarray
    fw: np.ndarray
    moved: np.ndarray
    most: tuple = (0.0, 0.0)   # the most nodes of a cap and the most draft tokens of a level
    memo: dict = field(default_factory=dict, compare=False, repr=False)   # `heads` by (n, steps)

    def heads(self, n: int, steps: int) -> tuple:
        """The candidates' parts that no price enters (n rows, `steps` a node): kernels.block_heads' [5, blocks]
        and whether the probabilities are finite and >= 0 (n > 0), each cap's first candidate (and the end) and
        xs[i] = i / steps; computed once (read-only)."""
        hit = self.memo.get((n, steps))
        if hit is None:
            base = np.empty((5, int(self.Ns.sum())))
            ok = kernels.block_heads(self.probs, self.poff, self.Ns, self.fw, steps, float(n), base)
            coff = np.concatenate([[0], np.cumsum(self.Ns * steps + 1)])
            xs = np.arange(int((self.Ns * steps + 1).max(initial=1))) / steps
            for a in (base, coff, xs):
                a.flags.writeable = False
            if len(self.memo) >= 16:
                self.memo.clear()
            hit = self.memo[n, steps] = (base, coff, xs, bool(ok))
        return hit


@functools.lru_cache(maxsize=64)
def _orders(key: tuple) -> _Orders:
    """The depth caps plan_trees searches for (table bytes, max_nodes, max_depth, depths) and their orders."""
    table, max_nodes, max_depth, depths = key
    deepest = int(best_order(np.frombuffer(table, float), max_nodes, max_depth).depth.max(initial=0))
    Ds = range(1, deepest + 1) if depths is None else [d for d in depths if 1 <= d <= deepest]
    pairs = [(D, o) for D, o in ((D, best_order(np.frombuffer(table, float), max_nodes, D)) for D in Ds)
             if o.parent.size]
    orders = [o for _, o in pairs]
    Ls = [o.levels() for o in orders]
    probs, poff = _flat([o.prob for o in orders], float)
    levels, loff = _flat([L.ravel() for L in Ls], np.int64)
    Ns, cols = np.array([o.parent.size for o in orders], np.int64), np.array([L.shape[1] for L in Ls], np.int64)
    lmax = np.array([L[-1].max() for L in Ls], float)
    most = (float(Ns.max()), float(lmax.max())) if Ns.size else (0.0, 0.0)
    return _Orders(key, [D for D, _ in pairs], orders, probs, poff, levels, loff, Ns, cols, lmax,
                   *kernels.level_moves(levels, loff, Ns, cols), most)


def _plan_compiled(table, price: TreePrice, n: int, max_nodes: int, max_depth: int, depths, steps: int) -> TreePlan:
    """plan_trees by the compiled loops (kit/kernels.py): the candidates' parts (kept by `price` while its tables
    hold) and the best."""
    steps = max(1, min(int(steps), n))
    ok = max_nodes > 0 and max_depth > 0
    pack = _orders((np.asarray(table, float).tobytes(), int(max_nodes), int(max_depth),
                    None if depths is None else tuple(int(d) for d in depths))) if ok else None
    zero, parts, coff, lazy, (dr, oh) = price._heads(pack, n, steps)
    cal = price.calibration
    params = (cal.params("draft"), cal.params("verify")) if cal is not None else ((1.0, 0.0), (1.0, 0.0))
    g0 = float(n) / price._zero(*zero, params)
    if not parts.shape[1]:
        return TreePlan(0, 0.0, float(n), g0, None)
    (sd, cd), (sv, cv) = params
    s, j, g = kernels.best_pruned(parts, coff, *lazy[:5], float(n), lazy[5], pack.levels, pack.loff, pack.Ns,
                                  pack.cols, pack.fw, pack.moved, steps, dr, oh, cal is not None, float(sd),
                                  float(cd), float(sv), float(cv), g0)
    if s < 0:
        return TreePlan(0, 0.0, float(n), g0, None)
    return TreePlan(pack.depths[s], float((j - coff[s]) / steps), float(parts[0, j]), float(g), pack.orders[s])


def plan_trees(table, price: TreePrice, n: int, max_nodes: int, max_depth: int, depths=None,
               steps: int = 8) -> TreePlan:
    """The tree plan with the most expected tokens per second (n rows, each emitting 1 + its expected accepted
    nodes) over the candidates: each depth cap D in `depths` (default 1..max_depth; caps deeper than the best
    max_nodes nodes reach give the same trees and are skipped) and each node count per row 0..max_nodes in
    `steps` fractions (a fraction f of the rows one node more than the rest, whose trees are the next in the
    best-first order). Every row shares `table`; `plan_rows` cuts the trees of rows that end early."""
    if COMPILED and max_depth <= 128:   # the compiled pairwise sum covers rows of up to 128 levels
        return _plan_compiled(table, price, n, max_nodes, max_depth, depths, steps)
    best = TreePlan(0, 0.0, float(n), float(n) / float(price.seconds(np.zeros(1), np.zeros((1, 1)))[0]), None)
    steps = max(1, min(int(steps), n))
    if max_nodes <= 0 or max_depth <= 0:
        return best
    deepest = int(best_order(table, max_nodes, max_depth).depth.max(initial=0))   # caps past it: the same order
    for D in (range(1, deepest + 1) if depths is None else [d for d in depths if 1 <= d <= deepest]):
        order = best_order(table, max_nodes, D)
        N = order.parent.size
        if N == 0:
            continue
        x = np.arange(N * steps + 1) / steps   # nodes per row
        lo = np.minimum(np.floor(x).astype(np.int64), N - 1)
        f = x - lo
        E = np.concatenate([[0.0], np.cumsum(order.prob)])
        L = order.levels()
        tokens = n * (1.0 + E[lo] + f * (E[lo + 1] - E[lo]))
        G = tokens / price.seconds(x, L[lo] + f[:, None] * (L[lo + 1] - L[lo]))
        j = int(np.argmax(G))
        if G[j] > best.goodput * (1 + 1e-12):
            best = TreePlan(D, float(x[j]), float(tokens[j]), float(G[j]), order)
    return best


def plan_rows(plan: TreePlan, caps: np.ndarray, cache: dict | None = None, pairs: list | None = None) -> list:
    """Each row's Tree for a TreePlan: round(f n) rows (those with the most room, `caps`: each row's depth cap,
    e.g. kit.draft_caps) get one node more, and a row's tree is cut at its cap. `cache`: Trees by shape, kept
    by the caller so that equal trees are the same object across steps. `pairs` (a list, optional): set to
    [Trees, index]: the distinct (nodes, depth cap) pairs' Trees in first-row order and each row's among them
    (int64 [n]; None: every row the first), for `pair_groups`."""
    n = caps.size
    base = math.floor(plan.nodes)
    extra = int(round((plan.nodes - base) * n))
    cache = {} if cache is None else cache
    if n and COMPILED and caps.dtype == np.int64 and caps.ndim == 1 and 0 <= extra <= n:
        if not extra:
            lo, hi, _ = kernels.int_stats(caps)
            if lo >= plan.depth or lo == hi:   # every row the same tree
                return _paired([_cached_tree(plan.order, base, min(int(lo), plan.depth), cache)], n, pairs)
        out = np.empty((3, n), np.int64)
        G = kernels.row_plan(caps, base, extra, plan.depth, out)   # the numpy form's pairs, below
        trees = [_cached_tree(plan.order, c, dc, cache) for c, dc in zip(out[0, :G].tolist(), out[1, :G].tolist())]
        return _paired(trees, n, pairs, out[2] if G > 1 else None)
    counts = np.full(n, base, np.int64)
    if extra:
        counts[np.argsort(-caps, kind="stable")[:extra]] += 1
    d = np.minimum(caps.astype(np.int64), plan.depth)
    if n and not extra and d.min() == d.max():   # every row the same tree
        return _paired([_cached_tree(plan.order, base, int(d[0]), cache)], n, pairs)
    each = list(zip(counts.tolist(), d.tolist()))
    trees = dict.fromkeys(each)   # each (nodes, depth cap) once, in first-row order
    for c, dc in trees:
        trees[c, dc] = _cached_tree(plan.order, c, dc, cache)
    at = {p: i for i, p in enumerate(trees)}
    return _paired(list(trees.values()), n, pairs, np.array([at[p] for p in each], np.int64))


def _paired(trees: list, n: int, pairs: list | None, index: np.ndarray | None = None) -> list:
    """The rows' Trees (row i: trees[index[i]]; index None: trees[0] for all), with `pairs` set to [trees, index]
    where given."""
    if pairs is not None:
        pairs[:] = [trees, index]
    return [trees[0]] * n if index is None else [trees[g] for g in index.tolist()]


def pair_groups(trees: list, index: np.ndarray | None) -> list:
    """specdepth.tree.by_object's groups of the rows [trees[i] for i in index] (plan_rows' `pairs`: trees in
    first-row order; index None: every row trees[0]): (Tree, rows) in trees' order, rows an index array (a slice
    for all)."""
    if index is not None and index.size == 0:
        return []
    if index is None or len(trees) == 1:
        return [(trees[0], slice(None))]
    if not COMPILED or len(set(map(id, trees))) < len(trees) or index.dtype != np.int64:
        return by_object([trees[g] for g in index.tolist()], index.size)
    n, G = index.size, len(trees)
    out = np.empty(n + G + 1, np.int64)
    if not kernels.group_rows(index, G, out):
        raise ValueError(f"pair_groups: an index outside 0..{G - 1}")
    at = out[n:].tolist()
    return [(t, out[at[g]:at[g + 1]]) for g, t in enumerate(trees)]


def _cached_tree(order: Order, c: int, d: int, cache: dict) -> Tree:
    """order's first c nodes cut at depth d (no nodes: chain(0)), from `cache` by shape; a shape not there is
    added, the order's Tree of it (the shape's key and its Tree kept by the order: each built once)."""
    key = order.memo.get(("key", c, d))
    if key is None:
        key = order.memo["key", c, d] = tuple(order.parent[:c].tolist()) + (d,) if c and d else ()
    t = cache.get(key)
    if t is None:
        t = order.memo.get(("tree", c, d))
        if t is None:
            t = order.memo["tree", c, d] = order.tree(c, d) if key else chain(0)
        cache[key] = t
    return t
