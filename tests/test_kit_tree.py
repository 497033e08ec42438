"""The policy kit's tree blocks (specdepth.policies.kit.tree) on inputs whose answer is known: expected accepted
nodes against tree_acceptance, the best tree against brute force, the rank estimate against a known table, the
price against specdepth.tree.tree_step_time, and the plan search against an enumeration."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from specdepth import tree as T
from specdepth import tree_acceptance as TA
from specdepth.cost import Hardware, RooflineCost
from specdepth.models import ModelArch
from specdepth.policies.kit import tree as K

TABLES = [[0.6, 0.2, 0.1], [0.8, 0.1, 0.05, 0.02], [0.4, 0.3, 0.2], [0.5, 0.5]]
H100 = Hardware("h100", 989, 3.35, memory_gb=80, interconnect_gbs=450)
BIG = ModelArch(layers=32, hidden=4096, heads=32, kv_heads=8, intermediate=14336, vocab=128256, head_dim=128)
SMALL = ModelArch(layers=16, hidden=2048, heads=32, kv_heads=8, intermediate=8192, vocab=128256, head_dim=64)


@pytest.mark.parametrize("table", TABLES)
def test_expected_accepted_is_tree_acceptances_rule(table):
    trees = [T.EAGLE_TREE, T.chain(4), T.from_widths([3, 2, 1]), T.chain(0), T.from_choices([(0,), (1,), (0, 0)])]
    got = K.expected_accepted(trees, np.array(table))
    assert got == pytest.approx([TA.expected_accepted(t, table) for t in trees], abs=1e-12)
    assert K.expected_accepted(T.EAGLE_TREE, np.array(table), n=3).tolist() == [got[0]] * 3


def _all_trees(nodes: int, ranks: int, depth: int):
    """Every prefix-closed, rank-contiguous set of `nodes` rank paths (ranks < ranks, at most depth deep)."""
    seen, frontier = set(), {frozenset()}
    for _ in range(nodes):
        grown = set()
        for s in frontier:
            cands = [(r,) for r in range(ranks)] + [c + (r,) for c in s for r in range(ranks) if len(c) < depth]
            for c in cands:
                if c not in s and (len(c) == 1 or c[:-1] in s) and (c[-1] == 0 or c[:-1] + (c[-1] - 1,) in s):
                    grown.add(s | {c})
        frontier = grown
    return frontier - seen


@pytest.mark.parametrize("table", TABLES)
@pytest.mark.parametrize("depth", [2, 4])
def test_best_order_is_the_best_tree_of_every_size(table, depth):
    order = K.best_order(table, 6, depth)
    assert np.all(np.diff(order.prob) <= 1e-15)                       # best first
    for n in range(1, 7):
        tree = order.tree(n)
        assert tree.max_depth <= depth
        best = max(TA.expected_accepted(T.from_choices(s), table) for s in _all_trees(n, len(table), depth))
        assert TA.expected_accepted(tree, table) == pytest.approx(best, abs=1e-12)
        assert order.prob[:n].sum() == pytest.approx(best, abs=1e-12)
        assert K.best_tree(table, n, depth) == tree


def test_best_order_chain_and_caps():
    assert K.best_tree([0.9], 5, 8) == T.chain(5)                      # one rank: a chain
    assert K.best_order([0.9], 50, 3).parent.size == 3                 # at most depth x 1 nodes exist
    assert K.best_order([0.0, 0.0], 5, 3).parent.size == 0
    order = K.best_order([0.7, 0.2, 0.05], 40, 6)
    for n in (5, 17, 40):
        assert np.array_equal(order.levels()[n], T.parent_counts(order.tree(n), 1)[0].tolist() +
                              [0] * (order.levels().shape[1] - order.tree(n).max_depth))
        cut = order.tree(n, 2)   # the first n nodes above depth 3: the best tree of its size at depth 2
        assert cut == K.best_tree([0.7, 0.2, 0.05], cut.nodes, 2)


def test_rank_estimate_on_chains_counts_exactly():
    est = K.RankEstimate(ranks=3, prior=0.5, strength=2.0, memory=1e12)
    est.observe([T.chain(4), T.chain(4), T.chain(2)], np.array([4, 1, 0]))
    # rank 0: hits 4 + 1 + 0 = 5; trials 4 + (1 + 1 miss) + (0 + 1 miss) = 7
    assert est.hits[0] == pytest.approx(5) and est.trials[0] == pytest.approx(7)
    assert est.table[0] == pytest.approx((5 + 1) / (7 + 2))
    assert est.trials[1:].tolist() == [0.0, 0.0]


@pytest.mark.parametrize("tree,known", [(T.EAGLE_TREE, 3), (T.from_widths([4, 2, 1]), 3),
                                        (K.best_tree([0.55, 0.2, 0.1], 20, 8), 3), (T.from_widths([2, 2, 2]), None)])
def test_rank_estimate_recovers_the_table_from_path_lengths(tree, known):
    """Path lengths on a tree whose nodes try different widths tell the ranks apart; on a product tree of
    width 2 at every level they tell only P(R < 2)."""
    true = np.array([0.55, 0.2, 0.1, 0.05])
    rng = np.random.default_rng(0)
    est = K.RankEstimate(ranks=4, prior=0.7, strength=5.0, memory=1e9)
    for _ in range(150):
        ranks = TA.ranks_of(rng.random((200, tree.max_depth)), true)
        est.observe(tree, TA.walk(tree, ranks))
    if known:
        assert np.cumsum(est.table)[:known] == pytest.approx(np.cumsum(true)[:known], abs=0.025)
    else:
        assert est.table[:2].sum() == pytest.approx(0.75, abs=0.01)


def _cost():
    return RooflineCost(BIG, SMALL, hardware=H100)


@pytest.mark.parametrize("n", [1, 16, 200])
def test_price_is_tree_step_time_for_one_tree_a_batch(n):
    cost, ctx = _cost(), np.full(n, 700, np.int64)
    price = K.TreePrice().update(cost, ctx)
    order = K.best_order([0.6, 0.2, 0.1], 40, 6)
    L = order.levels()
    for N in (0, 1, 7, 25, 40):
        want = T.tree_step_time(cost, ctx, order.tree(N) if N else T.chain(0))
        assert price.seconds(np.array([N]), L[N][None])[0] == pytest.approx(want, rel=2e-3)


def test_price_applies_a_calibration():
    class Cal:
        def params(self, phase):
            return (2.0, 1e-3) if phase == "draft" else (1.5, 2e-3)
    cost, ctx = _cost(), np.full(8, 500, np.int64)
    plain, cal = K.TreePrice().update(cost, ctx), K.TreePrice(Cal()).update(cost, ctx)
    lv = np.array([[1, 2, 2]])
    d = sum(cost.draft_forward(np.full(8, 500.0), np.full(8, q))[0] for q in (1, 2, 2))
    v = cost.verify_time(np.full(8, 500.0), np.full(8, 9))
    assert plain.seconds(np.array([9]), lv)[0] == pytest.approx(d + v)
    assert cal.seconds(np.array([9]), lv)[0] == pytest.approx(2 * d + 3e-3 + 1.5 * v + 2e-3)


@pytest.mark.parametrize("n", [1, 32, 256])
def test_plan_trees_is_the_best_uniform_plan(n):
    """steps=1: every row the same tree; the search's choice is the best (depth cap, node count) pair by
    expected tokens / tree_step_time, enumerated."""
    table, cost, ctx = [0.7, 0.15, 0.05], _cost(), np.full(n, 600, np.int64)
    plan = K.plan_trees(table, K.TreePrice().update(cost, ctx), n, 24, 6, steps=1)
    best = n / T.tree_step_time(cost, ctx, T.chain(0))
    for D, N in itertools.product(range(1, 7), range(1, 25)):
        t = K.best_tree(table, N, D)
        best = max(best, n * (1 + TA.expected_accepted(t, table)) / T.tree_step_time(cost, ctx, t))
    assert plan.goodput == pytest.approx(best, rel=5e-3)
    trees = K.plan_rows(plan, np.full(n, 6))
    got = n * (1 + K.expected_accepted(trees, np.array(table)).mean()) / T.tree_step_time(cost, ctx, trees)
    assert got == pytest.approx(best, rel=5e-3)


def test_plan_rows_fractions_and_caps():
    order = K.best_order([0.6, 0.3], 10, 4)
    plan = K.TreePlan(depth=4, nodes=3.5, tokens=0.0, goodput=0.0, order=order)
    cache = {}
    trees = K.plan_rows(plan, np.array([4, 4, 1, 0]), cache)
    assert [t.nodes for t in trees] == [4, 4, 2, 0]   # two rows 4 nodes, two 3: (0,), (0, 0), (1,) cut at depth 1
    assert trees[2].max_depth == 1 and trees[3].nodes == 0
    again = K.plan_rows(plan, np.array([4, 4, 1, 0]), cache)
    assert all(a is b for a, b in zip(trees, again))                   # the same objects from the cache
    assert K.plan_trees([0.6], K.TreePrice().update(_cost(), np.full(2, 10)), 2, 0, 4).nodes == 0.0


def test_rank_estimate_prior_table_and_confidence_means():
    est = K.RankEstimate(ranks=3, strength=1e9)
    est.start(np.array([0.6, 0.2, 0.1]))
    assert est.table == pytest.approx([0.6, 0.2, 0.1])                 # a strong prior is the table
    est.start(0.5)
    assert est.table == pytest.approx([0.5, 0.25, 0.125])              # a rate: the geometric table
    conf = K.RankConfidence(ranks=3, memory=1e12)
    tree = T.from_choices([(0,), (1,), (0, 0)])                          # ranks 0, 1, 0
    conf.observe([tree, T.chain(0)], np.array([[0.8, 0.1, 0.6], [np.nan] * 3]))
    # ranks 0, 1 drafted (0.7, 0.1); rank 2 by rank 1's hazard, 0.1 / 0.3: a third of the 0.2 left
    assert conf.table(np.array([0.5, 0.3, 0.05])) == pytest.approx([0.7, 0.1, 0.2 / 3])
    assert K.RankConfidence(ranks=2).table(np.array([0.5, 0.3])).tolist() == [0.5, 0.3]   # nothing drafted


def test_compiled_interp_and_pairwise_are_numpys():
    from specdepth.policies.kit import kernels as KT
    rng = np.random.default_rng(3)
    for size in (1, 2, 5, 40):
        fp = np.cumsum(rng.uniform(0, 1, size)) * 10.0 ** rng.integers(-6, 3)
        xs = np.concatenate([rng.uniform(-1, size + 1, 50), np.arange(size + 1.0), [-0.0]])
        assert np.array_equal(np.array([KT.interp(x, fp, 0, size) for x in xs]), np.interp(xs, np.arange(size), fp))
    for cols in range(1, 40):
        A = rng.standard_normal((20, cols)) * 10.0 ** rng.integers(-8, 8, (20, cols))
        assert np.array_equal(np.array([0.0 + KT.pairwise(r, 0, cols) for r in A]), A.sum(axis=1))


def test_compiled_plan_trees_is_the_numpy_search(monkeypatch):
    """The compiled search (kit/kernels.py) chooses the plan the numpy loop does, to the bit, with and without a
    calibration and a per-level overhead, from fresh tables and from kept ones."""
    class Cal:
        def __init__(self, p):
            self.p = p

        def params(self, phase):
            return self.p[:2] if phase == "draft" else self.p[2:]

    class Overhead:
        position_overhead_s = 3e-5

        def __getattr__(self, name):
            return getattr(_cost(), name)

    rng = np.random.default_rng(11)
    cases = []
    for _ in range(24):
        t = np.sort(rng.dirichlet(np.ones(rng.integers(1, 6))) * rng.uniform(0.5, 1.0))[::-1]
        n = int(rng.integers(1, 300))
        cal = Cal(tuple(rng.uniform(-0.5, 2.0, 4) * [1, 1e-4, 1, 1e-3])) if rng.random() < 0.6 else None
        depths = None if rng.random() < 0.7 else list(rng.integers(0, 9, 4))
        cases.append((np.round(t * 200) / 200, n, cal, rng.random() < 0.5, int(rng.integers(0, 40)),
                      int(rng.integers(0, 12)), depths, int(rng.integers(1, 9)), rng.integers(100, 2000, n)))

    def plans():
        out = []
        for t, n, cal, oh, N, D, depths, steps, ctx in cases:
            price = K.TreePrice(cal).update(Overhead() if oh else _cost(), ctx)
            for _ in range(2):
                p = K.plan_trees(t, price, n, N, D, depths=depths, steps=steps)
                parents = None if p.order is None else p.order.parent.tolist()
                out.append((p.depth, p.nodes, p.tokens, p.goodput, parents))
        return out
    got = plans()
    monkeypatch.setattr(K, "COMPILED", False)
    assert got == plans()


def test_compiled_candidates_are_the_numpy_prices():
    """Every candidate's parts from the compiled loops (tokens, summed draft seconds, forwards, verify seconds) are what
    plan_trees' numpy form computes from the same tables, to the bit."""
    rng = np.random.default_rng(4)
    for _ in range(12):
        t = np.sort(rng.dirichlet(np.ones(rng.integers(1, 6))) * rng.uniform(0.5, 1.0))[::-1]
        n, steps, oh = int(rng.integers(1, 300)), int(rng.integers(1, 9)), float(rng.choice([0.0, 3e-5]))
        pack = K._orders((t.tobytes(), int(rng.integers(1, 70)), int(rng.integers(1, 20)), None))
        price = K.TreePrice().update(_cost(), rng.integers(100, 2000, n))
        v, dr = price._tables(80.0, 80.0)
        price.cost = type("C", (), {"position_overhead_s": oh, "__getattr__": lambda s, k: getattr(_cost(), k)})()
        want = []
        for o in pack.orders:
            N = o.parent.size
            x = np.arange(N * steps + 1) / steps
            lo = np.minimum(np.floor(x).astype(np.int64), N - 1)
            f = x - lo
            E, L = np.concatenate([[0.0], np.cumsum(o.prob)]), o.levels()
            lv = L[lo] + f[:, None] * (L[lo + 1] - L[lo])
            draft = np.interp(lv, np.arange(dr.size), dr) + (lv > 0) * oh
            want.append(np.stack([n * (1.0 + E[lo] + f * (E[lo + 1] - E[lo])), draft.sum(axis=1),
                                  (lv > 0).sum(axis=1), np.interp(x, np.arange(v.size), v)]))
        assert np.array_equal(price.candidates(pack, n, steps)[1], np.concatenate(want, axis=1))


def test_compiled_rank_estimate_is_the_numpy_em(monkeypatch):
    """RankEstimate's compiled refresh (kernels.expected_counts) keeps the groups and the hits and trials the
    numpy EM step does, to the bit."""
    rng = np.random.default_rng(6)
    shapes = [T.chain(3), T.from_widths([2, 2]), T.EAGLE_TREE, K.best_tree([0.5, 0.3, 0.1], 20, 7), T.chain(0),
              T.from_widths([4, 1, 1])]
    steps = []
    for _ in range(40):
        n = int(rng.integers(1, 40))
        trees = [shapes[i] for i in rng.integers(0, len(shapes), n)] if rng.random() < 0.8 else shapes[2]
        acc = np.array([int(rng.integers(0, t.max_depth + 1)) for t in T.rows(trees, n)])
        steps.append((trees, acc))

    def run():
        est = K.RankEstimate(ranks=3, memory=30.0, every=0.05)
        out = []
        for trees, acc in steps:
            est.observe(trees, acc)
            out.append((est.hits.tolist(), est.trials.tolist(), list(est._groups)))
        return out
    got = run()
    monkeypatch.setattr(K, "COMPILED", False)
    assert got == run()


def test_compiled_row_means_are_numpys():
    """kernels.row_means (tree_confidence's chain-step means) is the numpy form's arithmetic, to the bit."""
    from specdepth.policies.kit import kernels as KT
    rng = np.random.default_rng(8)
    for K in (1, 3, 8, 13, 16, 40):
        conf = rng.uniform(0, 1, (50, K)) * 10.0 ** rng.integers(-5, 1, (50, K))
        conf[rng.random((50, K)) < 0.3] = np.nan
        got = np.full(50, np.nan)
        KT.row_means(conf, got)
        seen = ~np.isnan(conf)
        cnt = seen.sum(axis=1)
        want = np.full(50, np.nan)
        want[cnt > 0] = np.where(seen, conf, 0.0).sum(axis=1)[cnt > 0] / cnt[cnt > 0]
        assert np.array_equal(got, want, equal_nan=True)


def test_compiled_candidates_on_any_levels():
    """kernels.candidates on levels where a node moves several levels, or a level by more than one token, or one
    level anywhere in rows of up to 44 levels (numpy's pairwise sum past its 8 accumulators), is the numpy form's
    arithmetic too."""
    from specdepth.policies.kit import kernels as KT
    rng = np.random.default_rng(9)
    for case in range(80):
        N, cols, steps, n = int(rng.integers(1, 30)), int(rng.integers(1, 45)), int(rng.integers(1, 12)), 37
        moves = rng.random((N + 1, cols)) < 0.3
        if case % 2:   # one level a node, at any column
            moves = np.arange(cols) == rng.integers(0, cols, (N + 1, 1))
        L = np.cumsum(rng.integers(0, 3, (N + 1, cols)) * moves, axis=0)
        prob = rng.uniform(0, 0.5, N)
        ver, dr = np.cumsum(rng.uniform(0, 1, N + 3)), np.cumsum(rng.uniform(0, 1, int(L.max()) + 3))
        oh = float(rng.choice([0.0, 0.25]))
        flat, off, Ns, cs = L.ravel(), np.zeros(1, np.int64), np.array([N]), np.array([cols])
        got = KT.candidates(prob, off, flat, off, Ns, cs, *KT.level_moves(flat, off, Ns, cs), steps, n, ver, dr, oh)
        x = np.arange(N * steps + 1) / steps
        lo = np.minimum(np.floor(x).astype(np.int64), N - 1)
        f = x - lo
        E = np.concatenate([[0.0], np.cumsum(prob)])
        lv = L[lo] + f[:, None] * (L[lo + 1] - L[lo])
        draft = np.interp(lv, np.arange(dr.size), dr) + (lv > 0) * oh
        want = np.stack([n * (1.0 + E[lo] + f * (E[lo + 1] - E[lo])), draft.sum(axis=1), (lv > 0).sum(axis=1),
                         np.interp(x, np.arange(ver.size), ver)])
        assert np.array_equal(got, want)


def test_compiled_picked_means_are_numpys():
    """kernels.picked_means (tree_confidence's tree-step means) is the numpy form's arithmetic, to the bit."""
    from specdepth.policies.kit import kernels as KT
    rng = np.random.default_rng(10)
    for K, m in itertools.product((1, 2, 5, 8, 9, 16, 17, 60), (1, 2, 3, 7, 30)):
        x = rng.uniform(0, 1, (30, 70)) * 10.0 ** rng.integers(-5, 1, (30, 70))
        x[rng.random((30, 70)) < 0.05] = np.nan
        rows, nodes = np.sort(rng.choice(30, m, replace=False)), int(rng.integers(K, 71))
        mask = np.zeros(nodes, bool)
        mask[rng.choice(nodes, K, replace=False)] = True
        got, want = np.full(30, np.nan), np.full(30, np.nan)
        KT.picked_means(x, rows, np.flatnonzero(mask), got)
        want[rows] = x[rows, :nodes][:, mask].mean(axis=1)   # tree_confidence's numpy form
        assert np.array_equal(got, want, equal_nan=True)


def test_compiled_rank_table_and_chain_groups_are_numpys(monkeypatch):
    """RankEstimate.table by kernels.rank_table and chain_groups by kernels.first_groups give what their numpy
    forms give (the table to the bit, NaN kept; the groups as specdepth.tree.by_object makes them), and
    observe_groups on those groups learns what observe on the rows' chains does."""
    rng = np.random.default_rng(12)
    for R in (1, 3, 8):
        est = K.RankEstimate(ranks=R)
        for _ in range(20):
            est.hits, est.trials = rng.uniform(0, 50, R), rng.uniform(0, 80, R)
            est.prior = rng.uniform(0, 1, R)
            if rng.random() < 0.2:
                est.hits[rng.integers(0, R)] = np.nan
            got = est.table
            monkeypatch.setattr(K, "COMPILED", False)
            est._tab = None
            assert np.array_equal(got, est.table, equal_nan=True)
            monkeypatch.setattr(K, "COMPILED", True)
            est._tab = None
    chains = {}
    for n in (0, 1, 5, 64, 300):
        d = rng.integers(0, 6, n) if n != 5 else np.full(5, 3)
        got = K.chain_groups(d, chains)
        want = T.by_object([chains.get(k) or T.chain(k) for k in d.tolist()], n) if n else []
        want = [(chains[t.nodes], idx) for t, idx in want]
        assert [(t, np.arange(n)[idx].tolist()) for t, idx in got] == \
            [(t, np.arange(n)[idx].tolist()) for t, idx in want]
        monkeypatch.setattr(K, "COMPILED", False)
        slow = K.chain_groups(d, chains)
        monkeypatch.setattr(K, "COMPILED", True)
        assert [(t, np.arange(n)[idx].tolist()) for t, idx in got] == \
            [(t, np.arange(n)[idx].tolist()) for t, idx in slow]
    a, b = K.RankEstimate(ranks=3, memory=50.0, every=0.1), K.RankEstimate(ranks=3, memory=50.0, every=0.1)
    for _ in range(30):
        d = rng.integers(0, 5, 40)
        acc = np.minimum(d, rng.integers(0, 5, 40))
        a.observe([chains.setdefault(k, T.chain(k)) for k in d.tolist()], acc)
        b.observe_groups(K.chain_groups(d, chains), acc)
        assert a.hits.tolist() == b.hits.tolist() and a.trials.tolist() == b.trials.tolist()
        assert [g[1].tolist() for g in a._groups.values()] == [g[1].tolist() for g in b._groups.values()]


def test_start_rounded_is_start_then_the_rounded_table(monkeypatch):
    """RankEstimate.start_rounded (kernels.started_table) gives np.round(table x scale) / scale after start, to
    the bit (NaN, ties to even, tables past 1), and leaves the prior and table that start leaves."""
    rng = np.random.default_rng(16)
    for i in range(40):
        R = int(rng.integers(1, 9))
        prior = rng.uniform(-0.1, 0.8, R) if i % 3 else np.round(rng.uniform(0, 1, R) * 8) / 400 + 0.0025
        if i % 7 == 5:
            prior[rng.integers(0, R)] = np.nan
        prior = prior if i % 11 != 4 else float(rng.uniform(0, 1))
        est = K.RankEstimate(ranks=R, strength=float(rng.uniform(1, 50)))
        est.hits, est.trials = rng.uniform(0, 50, R), rng.uniform(0, 80, R)
        got = est.start_rounded(prior, 200.0)
        state = (est.prior.copy(), est.table)
        monkeypatch.setattr(K, "COMPILED", False)
        est._start = est._tab = None
        est.start(prior)
        want = np.round(est.table * 200.0) / 200.0
        monkeypatch.setattr(K, "COMPILED", True)
        assert np.array_equal(got, want, equal_nan=True)
        assert np.array_equal(state[0], est.prior, equal_nan=True)
        assert np.array_equal(state[1], est.table, equal_nan=True)


def test_observe_chains_is_observe_on_the_chains(monkeypatch):
    """RankEstimate.observe_chains (kernels.chain_add once each chain has its group) learns what observe on the
    rows' chains learns, to the bit, with tree steps between (groups added, dropped and repacked), steps where
    nothing was drafted (not observed) and an accepted length past a chain (raises as observe does)."""
    rng = np.random.default_rng(15)
    steps = []
    for i in range(80):
        n = int(rng.integers(1, 70))
        d = rng.integers(0, 7, n) if i % 9 != 4 else np.zeros(n, np.int64)
        tree = K.best_tree([0.5, 0.3, 0.1], int(rng.integers(2, 9)), 4) if i % 5 == 2 else None
        steps.append((d, np.minimum(d, rng.integers(0, 7, n)), tree))

    def run(fast):
        est, chains, out = K.RankEstimate(ranks=3, memory=60.0, every=0.05), {}, []
        for d, acc, tree in steps:
            if tree is not None:
                est.observe(tree, np.minimum(acc, tree.max_depth))
            elif fast:
                est.observe_chains(d, acc)
            elif d.any():
                est.observe([chains.setdefault(k, T.chain(k)) for k in d.tolist()], acc)
            out.append((est.hits.tolist(), est.trials.tolist(), est._cnt.tolist(), est._kept, est._new))
        return out
    want = run(False)
    assert run(True) == want
    monkeypatch.setattr(K, "COMPILED", False)
    assert run(True) == want
    monkeypatch.setattr(K, "COMPILED", True)
    est = K.RankEstimate(ranks=3)
    est.observe_chains(np.array([2, 3]), np.array([1, 2]))
    with pytest.raises(IndexError):
        est.observe_chains(np.array([2, 3]), np.array([3, 2]))


def test_compiled_plan_rows_are_the_numpy_rows(monkeypatch):
    """plan_rows by kernels.row_plan gives every row the Tree object its numpy form gives (the same shapes from
    the same cache, in the same order)."""
    rng = np.random.default_rng(13)
    order = K.best_order([0.6, 0.25, 0.1], 40, 12)
    for _ in range(60):
        n = int(rng.integers(1, 90))
        caps = rng.integers(0, 14, n) if rng.random() < 0.7 else np.full(n, int(rng.integers(0, 14)))
        plan = K.TreePlan(int(rng.integers(1, 13)), float(rng.integers(0, 39 * 8) / 8), 0.0, 0.0, order)
        cache, pairs, slow_pairs = {}, [], []
        got = K.plan_rows(plan, caps, cache, pairs)
        monkeypatch.setattr(K, "COMPILED", False)
        want = K.plan_rows(plan, caps, cache, slow_pairs)
        gs_numpy = K.pair_groups(*pairs)
        monkeypatch.setattr(K, "COMPILED", True)
        assert len(got) == n and all(a is b for a, b in zip(got, want))
        # pair_groups of `pairs`: by_object's groups of the rows returned (the same objects and rows)
        ref = T.by_object(got, n)
        for gs in (K.pair_groups(*pairs), K.pair_groups(*slow_pairs), gs_numpy):
            assert len(gs) == len(ref) and all(t is u for (t, _), (u, _) in zip(gs, ref))
            assert all(np.array_equal(np.arange(n)[i], np.arange(n)[j]) for (_, i), (_, j) in zip(gs, ref))
        fresh = {}
        monkeypatch.setattr(K, "COMPILED", False)
        slow = K.plan_rows(plan, caps, fresh)
        monkeypatch.setattr(K, "COMPILED", True)
        assert [t.parent.tolist() for t in slow] == [t.parent.tolist() for t in got]


def test_pair_groups_checks_its_index():
    """pair_groups raises a clear ValueError for an index outside its Trees (the compiled loop reads nothing)."""
    a, b = T.chain(1), T.chain(2)
    assert [i.tolist() for _, i in K.pair_groups([a, b], np.array([0, 1, 0]))] == [[0, 2], [1]]
    with pytest.raises(ValueError, match="outside"):
        K.pair_groups([a, b], np.array([0, 2, 1]))


def test_compiled_confidence_means_and_hazards_are_numpys(monkeypatch):
    """RankConfidence.observe and table (kernels.rank_bins, rank_means_add, confidence_head) and RankEstimate.start's
    hazards (kernels.hazards) give what their numpy forms give, to the bit (NaN entries, zeros, tables past 1)."""
    rng = np.random.default_rng(14)
    shapes = [T.chain(3), T.from_widths([2, 2]), T.EAGLE_TREE, K.best_tree([0.5, 0.3, 0.1], 20, 7), T.chain(0)]
    steps = []
    for _ in range(30):
        n = int(rng.integers(1, 40))
        trees = [shapes[i] for i in rng.integers(0, len(shapes), n)] if rng.random() < 0.7 else shapes[2]
        conf = rng.uniform(0, 1, (n, 30))
        conf[rng.random((n, 30)) < 0.2] = np.nan
        steps.append((trees, conf))

    def run():
        rc = K.RankConfidence(ranks=4, memory=40.0)
        out = []
        for trees, conf in steps:
            rc.observe(trees, conf)
            out.append((rc.sums.tolist(), rc.counts.tolist(), rc.table(np.full(4, 0.3)).tolist()))
        return out
    got = run()
    monkeypatch.setattr(K, "COMPILED", False)
    assert got == run()
    tables = [rng.uniform(-0.2, 0.7, 5) for _ in range(30)] + [np.array([0.0, -0.0, 0.5, np.nan, 0.9, 0.3])]
    want = []
    for t in tables:
        est = K.RankEstimate(ranks=6, prior=t)
        want.append(est.prior.copy())
    monkeypatch.setattr(K, "COMPILED", True)
    for t, w in zip(tables, want):
        got = K.RankEstimate(ranks=6, prior=t).prior
        assert np.array_equal(got, w, equal_nan=True) and np.signbit(got).tolist() == np.signbit(w).tolist()


def test_confidence_means_refuse_rows_past_the_confidences():
    """RankConfidence.observe with more rows or nodes than the confidences have raises as numpy does (the
    compiled loop reads nothing past the array)."""
    rc = K.RankConfidence(ranks=3)
    with pytest.raises(IndexError):
        rc.observe([T.chain(2), T.chain(3), T.chain(2)], np.full((2, 4), 0.5))
    with pytest.raises(ValueError):
        rc.observe(T.chain(6), np.full((2, 4), 0.5))


def test_sum_swap_is_numpys_sum():
    """kernels._sum_init and _sum_swap (one entry changed at a time) give np.sum's value of the row, to the bit."""
    from specdepth.policies.kit import kernels as KT
    rng = np.random.default_rng(17)
    for C in list(range(0, 41)) + [127, 128]:
        row, acc = rng.uniform(0, 1, C) * 10.0 ** rng.integers(-8, 8, C), np.empty(16)
        assert KT._sum_init(row, C, acc) == row.sum()
        for m in rng.integers(0, max(C, 1), 3 * C):
            row[m] = rng.uniform(0, 1) * 10.0 ** rng.integers(-8, 8)
            assert KT._sum_swap(row, C, m, acc) == row.sum()


def test_pruned_best_is_best_candidate():
    """kernels.block_heads + block_seconds + fill_blocks give kernels.candidates' parts, and best_pruned (filling
    blocks as it goes, called again on the same parts) answers what best_candidate answers over every candidate,
    under tables and calibrations where its bounds hold and where they do not (a falling table, negative
    scales)."""
    from specdepth.policies.kit import kernels as KT
    rng = np.random.default_rng(10)
    for case in range(60):
        S, steps, n = int(rng.integers(1, 5)), int(rng.integers(1, 9)), int(rng.integers(1, 80))
        Ls, probs, Ns, cs = [], [], [], []
        for _ in range(S):
            N, cols = int(rng.integers(1, 25)), int(rng.integers(1, 20))
            moves = np.arange(cols) == rng.integers(0, cols, (N + 1, 1))   # one level a node
            if case % 3:
                moves = rng.random((N + 1, cols)) < 0.3
            Ls.append(np.cumsum(rng.integers(0, 3, (N + 1, cols)) * moves, axis=0).ravel())
            probs.append(np.sort(rng.uniform(0, 0.6, N))[::-1])
            Ns.append(N), cs.append(cols)
        flat, loff = np.concatenate(Ls), np.concatenate([[0], np.cumsum([a.size for a in Ls])[:-1]]).astype(np.int64)
        prob, poff = np.concatenate(probs), np.concatenate([[0], np.cumsum(Ns)[:-1]]).astype(np.int64)
        Ns, cs = np.array(Ns, np.int64), np.array(cs, np.int64)
        fw, moved = KT.level_moves(flat, loff, Ns, cs)
        ver = np.cumsum(rng.uniform(0, 1, Ns.max() + 3)) + 1.0
        dr = np.concatenate([[0.0], np.cumsum(rng.uniform(0, 1, int(flat.max()) + 3))])
        if case % 7 == 3:
            dr[2:] = dr[2:][::-1]   # not monotone: no bounds
        oh = float(rng.choice([0.0, 0.25]))
        want = KT.candidates(prob, poff, flat, loff, Ns, cs, fw, moved, steps, n, ver, dr, oh)
        coff = np.concatenate([[0], np.cumsum(Ns * steps + 1)]).astype(np.int64)
        base, sec = np.empty((5, Ns.sum())), np.empty((2, Ns.sum()))
        ok = KT.block_heads(prob, poff, Ns, fw, steps, float(n), base)
        ok = KT.block_seconds(flat, loff, Ns, cs, moved, steps, ver, dr, oh, sec) and ok
        parts, done, xs = np.full((4, coff[-1]), np.nan), np.zeros(Ns.sum(), bool), np.arange(coff[-1]) / steps
        for _ in range(4):
            sd, cd, sv, cv = rng.uniform(-0.2, 2.0, 4) * [1, 0.1, 1, 1]
            cal, g0 = bool(rng.random() < 0.7), float(rng.uniform(0, 3)) * n / (ver[0] + 1)
            got = KT.best_pruned(parts, coff, base, sec, done, xs, ver, float(n), ok, flat, loff, Ns, cs, fw, moved,
                                 steps, dr, oh, cal, sd, cd, sv, cv, g0)
            assert got == KT.best_candidate(want, coff, cal, sd, cd, sv, cv, g0)
        KT.fill_blocks(parts, base, sec, done, xs, ver, float(n), flat, loff, Ns, cs, fw, moved, steps, dr, oh)
        assert np.array_equal(parts, want) and done.all()
