"""goodput's compiled loops (kit/kernels.py) against their numpy form: the same numbers, bit for bit, on
random inputs with ties, and the same runs end to end (`kit.search.COMPILED = False`: the numpy form)."""
from __future__ import annotations

import numpy as np
import pytest

from specdepth.policies import goodput_evidence as ge
from specdepth.policies import goodput_gates as gg
from specdepth.policies import goodput_weights as gw
from specdepth.policies import kit
from specdepth.policies.kit import kernels as kg
from specdepth.policies.kit import search
from test_policies_zoo import drafting, make_view


def _both(monkeypatch, fn):
    """fn() compiled, then in its numpy form."""
    got = fn()
    monkeypatch.setattr(search, "COMPILED", False)
    want = fn()
    monkeypatch.setattr(search, "COMPILED", True)
    return got, want


def _same(a, b) -> bool:
    a, b = np.asarray(a, float), np.asarray(b, float)
    return a.shape == b.shape and a.tobytes() == b.tobytes()


def test_pairwise_and_argsort2_are_numpys_sum_and_lexsort():
    rng = np.random.default_rng(0)
    for n in list(range(0, 300)) + [1024, 1031, 4096]:
        x = rng.standard_normal(n) * 10.0 ** rng.uniform(-6, 6, n)
        assert kg.pairwise(x, 0, n) == x.sum() or n == 0
        if n > 3:
            assert kg.pairwise(x, 3, n - 3) == x[3:].sum()
        k1 = np.round(rng.random(n), 1)
        k1[rng.random(n) < 0.1] = np.nan
        k2 = rng.integers(0, 4, n)
        assert np.array_equal(kg.argsort2(k1, k2), np.lexsort((k2, k1)))


def test_int_mean_is_numpys_mean():
    rng = np.random.default_rng(8)
    for n in list(range(1, 300)) + [4096]:
        x = rng.integers(0, 10 ** int(rng.integers(1, 12)), n)
        m, ok = kg.int_mean(x)
        assert ok and m == float(x.mean())
    assert not kg.int_mean(np.zeros(0, np.int64))[1] and not kg.int_mean(np.array([2 ** 41]))[1]


def test_tie_bands_and_the_estimates_are_the_numpy_forms(monkeypatch):
    rng = np.random.default_rng(1)
    for _ in range(300):
        n = int(rng.integers(1, 80))
        a = np.round(rng.choice(rng.uniform(0.001, 0.999, 6), n) + rng.normal(0, 0.003, n) * (rng.random(n) < .5), 4)
        tol = float(rng.choice([0.0, 0.001, 0.01, 0.05]))
        got, ok = kg.tie_bands(a, tol)
        assert ok and _same(got, kit.tie_bands(a, tol))
        st = kit.PerRequest(accepted=0.0, rejected=0.0, conf_sum=0.0, drafted=0.0, verified_conf=0.0, verified=0.0)
        rows = st.align(np.arange(n))
        rows.array[:] = rng.integers(0, 30, (n, 6)) * rng.random((n, 6)) ** 2
        rows.verified[rng.random(n) < 0.2] = 0.0
        pool = ge.Evidence(accepted=7.0, rejected=3.0, conf_sum=6.0, drafted=10.0, mixture=bool(rng.random() < 0.7),
                           cal_accepted=float(rng.uniform(1, 50)), cal_conf=float(rng.uniform(1, 50)))
        cal = rng.uniform(0.3, 3, n)
        for est in ("counts", "confidence"):
            z = float(rng.choice([0.0, 0.5, 3.0]))
            got, want = _both(monkeypatch, lambda: (ge.row_calibration(rows, pool.calibration, z),
                                                    ge.row_estimates(rows, pool, cal, est, 8.0, tol)))
            assert _same(got[0], want[0]) and _same(got[1], want[1])


def test_the_rounded_order_is_argsorts():
    """kernels.rounded_order (row_estimates' counting sort of its 1e4 multiples) orders as np.argsort, and
    tie_means on it gives tie_bands' values."""
    rng = np.random.default_rng(14)
    for n in list(range(0, 70)) + [200, 1000]:
        q = rng.choice(rng.integers(10, 9991, max(1, n // 3)), n)
        order = kg.rounded_order(q)
        assert np.array_equal(np.sort(order), np.arange(n)) and np.array_equal(q[order], np.sort(q))
        if n >= 2:
            a = q / 1e4
            assert _same(kg.tie_means(a, order, 0.01), kit.tie_bands(a, 0.01))


def test_the_estimates_weights_and_values_are_the_numpy_forms(monkeypatch):
    rng = np.random.default_rng(2)
    for _ in range(200):
        n, K = int(rng.integers(1, 70)), int(rng.integers(1, 17))
        a = np.round(rng.choice(rng.uniform(0.05, 0.999, 5), n), 4)
        f = rng.uniform(0.6, 1.3, K)
        view = make_view(n, remaining=rng.integers(1, 30, n))
        cal = rng.uniform(0.3, 3, n)
        pool = ge.Evidence(accepted=7.0, rejected=3.0, conf_sum=6.0, drafted=10.0)
        st = kit.PerRequest(accepted=0.0, rejected=0.0, conf_sum=0.0, drafted=0.0, verified_conf=0.0, verified=0.0)
        rows = st.align(np.arange(n))
        rows.array[:] = rng.integers(0, 30, (n, 6)) * rng.random((n, 6))
        est = ge.row_estimates(rows, pool, cal, "confidence", 8.0, 0.01)
        dbar = None if rng.random() < 0.2 else float(rng.uniform(0.5, K + 2))
        depths = rng.integers(0, K + 1, n) * (rng.random(n) < 0.8)
        w = None if rng.random() < 0.3 else rng.uniform(0.1, 1, n)

        def run():
            S0, S, cap = ge.survivals(a, f, view, K, view.remaining)
            out = [S0, S, cap, ge.row_estimates(rows, pool, cal, "counts", 8.0, 0.01), est,
                   gw.tokens_per_step(S, dbar), gw.slot_weights(S0, dbar), gg.plan_value(S, depths, w),
                   gg.extended(depths, 16, cap), *gg.ratio_extended(S, depths, w, 1.5, 3, cap), gg.drafts(depths),
                   gg.drafts(depths * 0)]
            tw = gw.time_weights(S, a, dbar, rows.drafted, 8.0, view.remaining, 1e-4, 0.02)
            return out + [tw[0], tw[1], tw[2]]
        got, want = _both(monkeypatch, run)
        assert all(_same(x, y) for x, y in zip(got, want))


def test_the_mixture_calibration_is_the_numpy_form(monkeypatch):
    rng = np.random.default_rng(4)
    for _ in range(300):
        A, E = float(rng.uniform(0, 1e4) ** rng.uniform(0, 1)), float(rng.uniform(0, 1e4) ** rng.uniform(0, 1))

        def cal():
            p = ge.Evidence(mixture=True, cal_accepted=A, cal_conf=E)
            return p.calibration
        got, want = _both(monkeypatch, cal)
        assert got == want


def test_the_nested_plan_is_the_numpy_form_with_ties(monkeypatch):
    rng = np.random.default_rng(5)
    for _ in range(300):
        n, K = int(rng.integers(2, 150)), int(rng.integers(1, 17))   # (up to search._SMALL rows: _SmallColumns)
        a = rng.choice(rng.uniform(0.3, 0.99, 4), n)
        S = np.cumprod(np.minimum(a[:, None] * rng.uniform(0.8, 1.2, K), 0.999), axis=1)
        S[np.arange(K)[None, :] >= rng.integers(0, K + 1, n)[:, None]] = 0.0
        if rng.random() < 0.05:   # (NaN: kernels.weighted_plan leaves it to the numpy form)
            S[int(rng.integers(n)), int(rng.integers(K))] = np.nan
        w = rng.choice([0.5, 1.0], n) if rng.random() < 0.7 else rng.uniform(0.1, 1, n)
        _plan_both_ways(monkeypatch, rng, S, w, 5)


def _plan_both_ways(monkeypatch, rng, S, w, most_left):
    """gg.plan_positions on S, w and random step-time tables (a pad in 30 % of cases), ties from tokens left below
    most_left: the compiled plan is the numpy form's."""
    n, K = S.shape
    ver = np.cumsum(rng.uniform(0, 1e-4, n * K + 1)) + 0.01
    dr = np.concatenate([[0.0], np.cumsum(rng.uniform(0, 1e-4, n)) + 0.002])
    costs = kit.Tables(ver, dr, rng.uniform(0, 1e-3, K) if rng.random() < 0.3 else None)
    rem, G0 = rng.integers(1, most_left, n), float(rng.uniform(0, 3) * n / ver[0])
    got, want = _both(monkeypatch, lambda: gg.plan_positions(S, costs, G0, rem, w))
    assert np.array_equal(got[0], want[0]) and got[1] == want[1]


def test_the_nested_plan_is_the_numpy_form_where_the_columns_rank_apart(monkeypatch):
    """kernels.weighted_plan ranks each later column over the rows it reads, by insertion or a merge sort, and
    keeps those rankings across Dinkelbach's plans: the numpy form's plan where weights falling with the estimate
    turn the ranking around between positions (the rows' ties kept: equal estimates, equal tokens left)."""
    rng = np.random.default_rng(13)
    for _ in range(300):
        n, K = int(rng.integers(2, 200)), int(rng.integers(1, 17))
        a = rng.choice(rng.uniform(0.3, 0.99, int(rng.integers(1, 12))), n)
        S = np.cumprod(np.minimum(a[:, None] * rng.uniform(0.8, 1.2, K), 0.999), axis=1)
        S[np.arange(K)[None, :] >= rng.integers(0, K + 1, n)[:, None]] = 0.0
        w = 1.0 / (1.0 + S.sum(axis=1)) if rng.random() < 0.8 else rng.uniform(0.1, 1, n)
        w = np.round(w / w.max(), int(rng.integers(1, 4))) if rng.random() < 0.5 else w / w.max()
        _plan_both_ways(monkeypatch, rng, S, w, 6)
    for m in (0, 1, 2, 7, 64, 100):   # the merge sort alone, from the reversed order (rows with their values)
        v, k = rng.random(m).round(1), rng.integers(0, 3, m).astype(float)
        rows = np.arange(m)[::-1].copy()
        vals, keys = v[rows], k[rows]
        kg.merge_rows(rows, vals, keys, m, np.empty(m, np.int64), np.empty(m), np.empty(m))
        assert np.array_equal(rows, np.lexsort((np.arange(m), k, -v))) and _same(vals, v[rows])
    for m in (0, 1, 2, 7, 64, 128, 129, 200):   # the ranking by counting (and merged past 128), distinct int keys
        v, k = np.where(rng.random(m) < 0.1, -0.0, rng.random(m).round(1)), rng.permutation(m) * 3 - m
        rows = np.arange(m)[::-1].copy()
        vals, keys = v[rows], k[rows]
        kg.rank_some(rows, vals, keys, m, np.empty(m, np.int64), np.empty(m), np.empty(m, np.int64))
        assert np.array_equal(rows, np.lexsort((k, -v))) and _same(vals, v[rows])


def test_keep_by_margin_and_drafting_keep_are_the_numpy_forms(monkeypatch):
    rng = np.random.default_rng(6)
    for _ in range(150):
        n = int(rng.integers(1, 70))
        view = drafting(make_view(n, remaining=rng.integers(1, 6, n)), rng.integers(0, 5, n))
        costs = kit.Tables(np.cumsum(rng.uniform(0, 1e-4, 8 * n + 1)) + 0.01,
                           np.concatenate([[0.0], np.cumsum(rng.uniform(0, 1e-4, n + 1)) + 0.002]),
                           rng.uniform(0, 1e-3, 8) if rng.random() < 0.3 else None)
        a, cal = np.round(rng.choice([0.5, 0.7, 0.9], n), 4), rng.uniform(0.5, 2, n)
        w = None if rng.random() < 0.3 else rng.choice([0.5, 1.0], n)
        G = float(rng.uniform(0.2, 2) * n / costs.verify[0])
        conf = np.where(rng.random((3, n)) < 0.8, np.round(rng.random((3, n)), 1), np.nan)
        idx = np.flatnonzero(rng.random(n) < 0.6)
        vals = np.round(rng.random(idx.size), 2) + rng.choice([0.0, 1e-8, 4e-7], idx.size)   # ties at 6 decimals
        vals *= 3.0 if rng.random() < 0.2 else 1.0   # (values past 2: the compiled ranking's general sort)
        past = rng.random() < 0.5
        fs = None if rng.random() < 0.5 else rng.uniform(0.8, 1.1, int(rng.integers(1, 4)))   # (short: the rest
        rem = None if rng.random() < 0.5 else view.remaining.copy()                       # from PositionFactors)

        def run():
            ratio = [float(n), float(n) / G] if past else None
            d = gg.Drafting(n, a, cal, w, costs, G, view.depths, ratio, rem, fs)
            out = [d.keep(view, p, conf[p], kit.PositionFactors()) for p in range(3)] + [d.s, ratio]
            r2 = [float(n), float(n) / G]
            if idx.size > 1:
                out += [kit.keep_by_margin(view, 1, idx, vals, costs, G), kit.keep_by_margin(view, 0, idx, vals, costs,
                                                                                               G, r2), r2]
            return out
        got, want = _both(monkeypatch, run)
        assert all(_same(x, y) for x, y in zip(got, want))


def test_the_ranking_is_lexsorts_and_a_held_mask_is_not_written_again():
    """kernels._rank_values: np.lexsort((-remaining[idx], -np.round(v, 6))) with ties, counted and sorted (past
    `_RANK_COUNTED` keys) and out of its keys' range; Drafting.keep writes a new mask where the last one is held."""
    rng = np.random.default_rng(8)
    for m in [2, 3, 17, 64, 255, 256, 257, 300] * 12:
        v = np.round(rng.random(m), int(rng.choice([1, 2, 6]))) + rng.choice([0.0, 1e-8, 4e-7, 5e-7], m)
        v[0] = 2.5 if rng.random() < 0.1 else v[0]
        rem = rng.integers(0, int(rng.choice([3, 1000, 2 ** 21])), m + 5)
        idx = np.sort(rng.choice(m + 5, m, replace=False))
        assert np.array_equal(kg._rank_values(v, rem, idx), np.lexsort((-rem[idx], -np.round(v, 6))))
    n = 6
    view = drafting(make_view(n, remaining=np.arange(1, n + 1)), np.full(n, 4))
    costs = kit.Tables(np.linspace(0.01, 0.02, 8 * n + 1), np.linspace(0.0, 0.001, n + 2), None)
    d = gg.Drafting(n, np.full(n, 0.9), np.ones(n), None, costs, 1.0, view.depths)
    held = d.keep(view, 0, np.full(n, 0.9), kit.PositionFactors())
    before = held.copy()
    again = d.keep(view, 1, np.zeros(n), kit.PositionFactors())
    assert again is not held and np.array_equal(held, before) and before.any() and not again.any()


@pytest.mark.filterwarnings("ignore:invalid value encountered in sqrt")   # (a negative estimate, in numpy)
def test_evidence_observe_is_the_numpy_form(monkeypatch):
    rng = np.random.default_rng(7)
    for _ in range(100):
        n = int(rng.integers(1, 70))
        depths = rng.integers(0, int(rng.choice([2, 6, 12, 18, 131])), n)   # (1 to 130 positions: numpy's sums)
        depths[0] = max(depths[0], 1)
        view = drafting(make_view(n), depths, conf=None)
        view._s.confidences[:] = np.where(np.arange(view._s.confidences.shape[1])[None, :] < depths[:, None],
                                          rng.random(view._s.confidences.shape), np.nan)
        accepted = np.minimum(rng.integers(0, 6, n), depths)
        est = [np.full(n, 0.7), rng.uniform(0.1, 0.99, n)]
        est[1][0] = rng.choice([0.5, 0.0, -0.3, np.nan])   # (a negative or NaN estimate: the kernel's mask form)
        paired, memory = bool(rng.random() < 0.5), float(rng.choice([2000.0, 3.0]))
        idle = drafting(make_view(n), np.zeros(n, np.int64), conf=None)

        def run():
            p = ge.Evidence(position_paired=paired, mixture=True)
            st = kit.PerRequest(accepted=0.0, rejected=0.0, conf_sum=0.0, drafted=0.0, verified_conf=0.0, verified=0.0)
            rows = st.align(np.arange(n))
            for e in est:
                p.observe(view, accepted, rows, e, memory)
                p.observe(idle, np.zeros(n, np.int64), rows, e, memory, only_drafted=True)   # (not observed)
            pos = p.positions
            return [rows.array, pos.accepted, pos.expected, pos.first_acc, pos.first_exp, pos.factor(40), p.dbar,
                    [p.accepted, p.rejected, p.conf_sum, p.drafted, p.cal_accepted, p.cal_conf, p.verified]]
        got = run()
        with monkeypatch.context() as m:   # the numpy form: Evidence's and PositionFactors'
            m.setattr(search, "COMPILED", False)
            m.setattr(kit.acceptance, "COMPILED", False)
            want = run()
        assert all(_same(x, y) for x, y in zip(got, want))


@pytest.mark.parametrize("extra", [["workload.batch_size=24"], ["workload.batch_size=20", "policy.estimator=counts"],
                                   ["workload=poisson", "workload.rate=1e9", "workload.num_requests=60",
                                    "engine.max_batch_size=20", "workload.max_concurrency=20"]])
def test_goodput_runs_alike_compiled_and_in_numpy(monkeypatch, extra):
    from sdtest import engine

    def run():
        res = engine("policy=goodput", "workload.output_len=48", "engine.progress=false", *extra).run()
        return repr(res.steps) + repr(res.requests)
    got, want = _both(monkeypatch, run)
    assert got == want


def test_evidence_observe_leaves_the_factors_it_returned_as_they_are():
    """The compiled observe writes the new factors into a new array: the factors a plan read stay as they were
    through every later observe."""
    n = 8
    view = drafting(make_view(n), np.full(n, 3, np.int64), conf=np.full(3, 0.8))
    p = ge.Evidence(position_paired=True, mixture=True)
    rows = kit.PerRequest(accepted=0.0, rejected=0.0, conf_sum=0.0, drafted=0.0, verified_conf=0.0,
                          verified=0.0).align(np.arange(n))
    seen = []
    for step in range(5):
        f = p.positions.factor(3)
        seen.append((f, f.copy()))
        p.observe(view, np.full(n, step % 3, np.int64), rows, np.full(n, 0.7), 2000.0)
        assert all(np.array_equal(*s) for s in seen)   # (the factors each step's plan read)
    assert not np.array_equal(seen[0][1], seen[-1][1])


def test_position_factors_forget_add_is_forget_then_add():
    rng = np.random.default_rng(9)
    for _ in range(100):
        n, k = int(rng.integers(1, 70)), int(rng.integers(1, 9))
        one, two = kit.PositionFactors(paired=True), kit.PositionFactors(paired=True)
        for step in range(3):   # (the first grows the sums: forget, then add)
            ver = np.arange(k)[None, :] < rng.integers(0, k + 1, n)[:, None]
            acc = ver & (rng.random((n, k)) < 0.7)
            est, drafted, keep = rng.uniform(0.1, 0.99, n), rng.integers(0, k + 1, n), float(rng.uniform(0.9, 1))
            one.forget_add(keep, ver, acc, est, drafted)
            two.forget(keep)
            two.add(ver, acc, est, drafted)
            assert all(_same(getattr(one, f), getattr(two, f)) for f in ("accepted", "expected", "first_acc",
                                                                         "first_exp"))
            assert _same(one.factor(k), two.factor(k)) and _same(one.factor(40), two.factor(40))


def test_the_mixture_and_row_calibrations_are_the_numpy_form(monkeypatch):
    rng = np.random.default_rng(10)
    for _ in range(200):
        n = int(rng.integers(1, 70))
        st = kit.PerRequest(accepted=0.0, rejected=0.0, conf_sum=0.0, drafted=0.0, verified_conf=0.0, verified=0.0)
        rows = st.align(np.arange(n))
        rows.array[:] = rng.integers(0, 30, (n, 6)) * rng.random((n, 6)) ** 2
        A, E = float(rng.uniform(0, 1e3) ** rng.uniform(0, 1)), float(rng.uniform(0, 1e3) ** rng.uniform(0, 1))
        z = float(rng.choice([0.0, 0.5, 3.0]))

        def run():
            p = ge.Evidence(mixture=True, cal_accepted=A, cal_conf=E)
            out = p.calibrations(rows, z)
            return [out, p.calibration, ge.row_calibration(rows, p.calibration, z), p.calibrations(rows, z)]
        got, want = _both(monkeypatch, run)
        assert all(_same(x, y) for x, y in zip(got, want))


def test_the_fused_estimate_chain_is_its_blocks(monkeypatch):
    """goodput_evidence.estimates (one compiled call: calibrations, row_estimates, survivals, slot_weights,
    time_weights' spread) against those blocks in their numpy form."""
    rng = np.random.default_rng(11)
    for _ in range(200):
        n, K = int(rng.integers(1, 70)), int(rng.integers(1, 17))
        st = kit.PerRequest(accepted=0.0, rejected=0.0, conf_sum=0.0, drafted=0.0, verified_conf=0.0, verified=0.0)
        rows = st.align(np.arange(n))
        rows.array[:] = rng.integers(0, 30, (n, 6)) * rng.random((n, 6)) ** 2
        view = make_view(n, remaining=rng.integers(1, 30, n))
        f = rng.uniform(0.6, 1.3, K + int(rng.integers(0, 3)))
        est, z, tol = str(rng.choice(["counts", "confidence"])), float(rng.choice([0.0, 0.5, 3.0])), 0.01
        A, E, mix = float(rng.uniform(0, 1e3)), float(rng.uniform(1, 1e3)), bool(rng.random() < 0.7)
        dbar = None if rng.random() < 0.2 else float(rng.uniform(0.5, K + 2))

        def pool():
            p = ge.Evidence(accepted=7.0, rejected=3.0, conf_sum=6.0, drafted=10.0, mixture=mix, cal_accepted=A,
                            cal_conf=E)
            p.dbar = dbar
            return p
        p, kept = pool(), ge.Kept(n, K)
        assert ge.estimates(p, rows, f, view.remaining, K, z, est, 8.0, tol, kept, spread=n >= 2)
        monkeypatch.setattr(search, "COMPILED", False)
        q = pool()
        cal = q.calibrations(rows, z)
        a = ge.row_estimates(rows, q, cal, est, 8.0, tol)
        S0, S, cap = ge.survivals(a, f[:K], view, K, view.remaining)
        want = [cal, a, S0, S, cap]
        if n >= 2:
            d = K if dbar is None else min(dbar, K)
            want += [gw.slot_weights(S0, dbar), gw.time_weights(S, a, dbar, rows.drafted, 8.0, view.remaining, 1e-4,
                                                                0.02)[0]]
        monkeypatch.setattr(search, "COMPILED", True)
        got = [kept.cal, kept.a, kept.S0, kept.S, kept.rowcap]
        if n >= 2:
            e, u = kept.est.spread
            got += [kept.slot, gw.time_weights(S, a, dbar, rows.drafted, 8.0, view.remaining, 1e-4, 0.02,
                                               spread=(e, u))[0]]
            out = (np.empty(n), np.empty(n))   # the weights into kept arrays: the same
            tw = gw.time_weights(S, a, dbar, rows.drafted, 8.0, view.remaining, 1e-4, 0.02, spread=(e, u), out=out)
            assert tw[0] is out[1] and _same(tw[0], got[-1])
            assert _same(e, kg.tokens_per_step(S, int(d), float(d - int(d))))
        assert all(_same(x, y) for x, y in zip(got, want)) and p._mix == q._mix


def test_the_search_with_its_extension_is_its_blocks(monkeypatch):
    """goodput_gates.plan_extend (one compiled call) against plan_positions, ratio_extended and the gates' flags
    in their numpy form."""
    rng = np.random.default_rng(12)
    for _ in range(300):
        n, K = int(rng.integers(2, 150)), int(rng.integers(1, 17))
        a = rng.choice(rng.uniform(0.3, 0.99, 4), n)
        S = np.cumprod(np.minimum(a[:, None] * rng.uniform(0.8, 1.2, K), 0.999), axis=1)
        cap = rng.integers(0, K + 1, n)
        S[np.arange(K)[None, :] >= cap[:, None]] = 0.0
        w = rng.choice([0.5, 1.0], n) if rng.random() < 0.7 else rng.uniform(0.1, 1, n)
        ver = np.cumsum(rng.uniform(0, 1e-4, n * K + 1)) + 0.01
        dr = np.concatenate([[0.0], np.cumsum(rng.uniform(0, 1e-4, n)) + 0.002])
        costs = kit.Tables(ver, dr, rng.uniform(0, 1e-3, K) if rng.random() < 0.3 else None)
        rem, G0 = rng.integers(1, 5, n), float(rng.uniform(0, 3) * n / ver[0])
        lag, extend = rng.integers(0, 5, n), int(rng.integers(0, 4))
        depths, G, x = gg.plan_extend(S, costs, G0, rem, w, lag, extend, cap)
        assert x is not None and x.planned is depths
        late, any_, E, out, late_out, any_out = x.late, x.drafts, x.value, x.depths, x.late_out, x.drafts_out
        assert gg.flags(depths, x) == (any_, late) and gg.flags(out, x) == (any_out, late_out)
        assert gg.flags(depths.copy(), x) == (any_, True)   # another array: the gate tests the lag itself
        monkeypatch.setattr(search, "COMPILED", False)
        d, g = gg.plan_positions(S, costs, G0, rem, w)
        (E2, _), out2 = gg.ratio_extended(S, d, w, g, extend, cap)
        monkeypatch.setattr(search, "COMPILED", True)
        assert np.array_equal(depths, d) and G == g and E == E2 and np.array_equal(out, out2)
        assert (late, any_, late_out, any_out) == (bool(((d > 0) & (lag > 2)).any()), bool(d.any()),
                                                   bool(((out > 0) & (lag > 2)).any()), bool(out.any()))
        assert x.full == bool(d.all())


def test_the_search_writes_only_depths_nobody_holds():
    """goodput_gates.plan_extend with `kept`: its two buffers take turns; a plan held (or a view of it) is never
    written again, and the older buffer is reused where nobody holds it."""
    import weakref
    from types import SimpleNamespace
    rng = np.random.default_rng(3)
    n, K = 8, 4
    kept, held, reused = SimpleNamespace(two=None), [], 0
    ver = np.cumsum(rng.uniform(0, 1e-4, n * K + 1)) + 0.01
    dr = np.concatenate([[0.0], np.cumsum(rng.uniform(0, 1e-4, n)) + 0.002])
    costs, rem, lag, cap = kit.Tables(ver, dr, None), rng.integers(1, 9, n), np.zeros(n, np.int64), np.full(n, K)
    for step in range(12):
        S = np.cumprod(np.minimum(rng.uniform(0.3, 0.99, n)[:, None] * np.ones(K), 0.999), axis=1)
        older = None if kept.two is None or kept.two[1] is None else weakref.ref(kept.two[1])
        free = older is not None and (step - 2) % 3 != 0   # (the plan of step - 2: held where step - 2 % 3 == 0)
        depths, G, x = gg.plan_extend(S, costs, 0.0, rem, np.ones(n), lag, 2, cap, kept)
        want = gg.plan_extend(S, costs, 0.0, rem, np.ones(n), lag, 2, cap)
        assert np.array_equal(depths, want[0]) and np.array_equal(x.depths, want[2].depths)
        assert (depths.base is older()) == free if older is not None else True
        reused += free
        if step % 3 == 0:
            held.append((x.depths, x.depths.copy()))   # held: its buffer is not written again
        del depths, x
    assert all(np.array_equal(h, c) for h, c in held) and reused > 0


def test_one_row_searches_alike_weighted_by_one(monkeypatch):
    """goodput_gates.plan_extend for one row without weights (compiled, weighted by 1) against plan_positions'
    unweighted plan and ratio_extended in their numpy form."""
    rng = np.random.default_rng(21)
    for _ in range(400):
        K = int(rng.integers(1, 17))
        S = np.cumprod(np.minimum(rng.uniform(0.2, 1.0) * rng.uniform(0.7, 1.3, K), 0.999))[None, :]
        cap = rng.integers(0, K + 1, 1)
        S[0, cap[0]:] = 0.0
        ver = np.cumsum(rng.uniform(0, 1e-3, K + 2)) + rng.uniform(0.001, 0.03)
        dr = np.concatenate([[0.0], np.cumsum(rng.uniform(0, 1e-3, 2)) + rng.uniform(0.0, 0.01)])
        costs = kit.Tables(ver, dr, rng.uniform(0, 1e-3, K) if rng.random() < 0.3 else None)
        rem, lag, extend = rng.integers(1, 50, 1), rng.integers(0, 5, 1), int(rng.integers(0, 4))
        G0 = float(rng.choice([0.0, rng.uniform(0, 2) / ver[0]]))
        depths, G, x = gg.plan_extend(S, costs, G0, rem, None, lag, extend, cap)
        assert x is not None and x.planned is depths
        monkeypatch.setattr(search, "COMPILED", False)
        d, g = gg.plan_positions(S, costs, G0, rem, None)
        (E2, _), out2 = gg.ratio_extended(S, d, None, g, extend, cap) if g > 0 else ((x.value, 0), x.depths)
        monkeypatch.setattr(search, "COMPILED", True)
        assert np.array_equal(depths, d) and G == g and x.value == E2 and np.array_equal(x.depths, out2)
        assert (x.drafts, x.full) == (bool(d.any()), bool(d.all()))
