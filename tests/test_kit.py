"""The policy kit (specdepth.policies.kit): each block on small hand-made inputs whose answer is known."""
from __future__ import annotations

import functools
import math
import warnings
from types import SimpleNamespace

import numpy as np
import pytest

from specdepth.policies import kit
from test_policies_zoo import LinearCost, drafting, make_view


# ---- state -----------------------------------------------------------------------------------------

def test_per_request_fields_follow_requests_by_id():
    st = kit.PerRequest(accepted=0.0, depth=4.0)
    rows = st.align(np.array([7, 3]))
    assert rows.fields == ("accepted", "depth") and len(rows) == 2
    assert rows.depth.tolist() == [4.0, 4.0]
    rows.accepted += np.array([2, 5])
    rows.depth[1] = 9.0
    assert st.align(np.array([7, 3])) is rows   # the same ids: the same object
    moved = st.align(np.array([3, 11]))   # 7 left, 11 joined
    assert moved.accepted.tolist() == [5.0, 0.0] and moved.depth.tolist() == [9.0, 4.0]
    assert moved.array.shape == (2, 2)
    st.reset()
    assert st.align(np.array([3])).accepted.tolist() == [0.0]
    with pytest.raises(AttributeError):
        moved.unknown  # noqa: B018


def _align_run(seed, reuse=False):
    """A PerRequest aligned to random id sequences (rows leaving, joining, reordered, repeated ids, one id
    replaced at the same size), its fields written between steps: the rows after each step, as bytes."""
    rng = np.random.default_rng(seed)
    st, out, ids = kit.PerRequest(a=0.5, b=-1.0), [], np.arange(int(rng.integers(0, 40)), dtype=np.int64)
    st.reuse = reuse
    for _ in range(60):
        if ids.size and rng.random() < 0.4:
            ids = ids.copy()
            ids[int(rng.integers(0, ids.size))] = int(rng.integers(0, 120))
        else:
            keep = ids[rng.random(ids.size) < 0.8]
            ids = np.concatenate([keep, rng.integers(0, 120, int(rng.integers(0, 6)))]).astype(np.int64)
        if rng.random() < 0.3:
            ids = rng.permutation(ids)
        rows = st.align(ids if rng.random() < 0.9 else ids.copy())
        assert st.top is None or st.top == int(ids.max(initial=-1))   # (None: the numpy form)
        rows.a += rng.random(len(rows))
        rows.b -= 1.0
        out.append(rows.array.tobytes())
    return out


def test_the_compiled_alignment_is_its_numpy_form(monkeypatch):
    from specdepth.policies.kit import state
    compiled = [_align_run(seed) for seed in range(20)]
    assert compiled == [_align_run(seed, reuse=True) for seed in range(20)]   # the tables taking turns: the same
    monkeypatch.setattr(state, "COMPILED", False)
    assert compiled == [_align_run(seed) for seed in range(20)]
    assert compiled == [_align_run(seed, reuse=True) for seed in range(20)]


def test_the_old_private_module_warns_and_names_the_kit():
    import importlib
    import sys
    sys.modules.pop("specdepth.policies._common", None)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        old = importlib.import_module("specdepth.policies._common")
    assert any(issubclass(w.category, DeprecationWarning) and "specdepth.policies.kit" in str(w.message)
               for w in seen)
    assert old.StepCost is kit.StepCost
    st = old.PerRequest(2, (4.0, 0.0))   # the old form still works for this release
    cols = st.align(np.array([5, 6]))
    cols[:, 1] += 3
    assert st.align(np.array([6])).tolist() == [[4.0, 3.0]]


# ---- cost ------------------------------------------------------------------------------------------

def test_step_cost_tables_are_the_cost_models_prices():
    cost = LinearCost(v0=10e-3, v1=2e-4, d0=1e-3, d1=1e-5)
    view = make_view(4, cost=cost)
    t = kit.StepCost().update(view, 3)
    assert t.verify.size == 4 * 3 + 1 and t.draft.size == 4 + 1
    assert t.verify[0] == pytest.approx(10e-3 + 2e-4 * 4)   # one token a row
    assert t.verify[5] == pytest.approx(10e-3 + 2e-4 * 9)
    assert t.draft[0] == 0.0 and t.draft[3] == pytest.approx(1e-3 + 3e-5)


@functools.lru_cache(maxsize=1)
def _roofline():
    from sdtest import engine
    return engine("cost=roofline", "hardware=h100_sxm").cost


def _tables_run(seed):
    """as_padded, pad_extra (with and without a view), CostCalibration.correct and the catch-up's lag test on random
    tables and rows, as bytes and floats."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(60):
        n, K = int(rng.integers(1, 70)), int(rng.integers(1, 9))
        verify = np.cumsum(rng.uniform(0, 1e-4, n * K + 1)) + 0.01
        costs = kit.Tables(verify, np.concatenate([[0.0], np.cumsum(rng.uniform(0, 1e-4, n)) + 2e-3]))
        padded = kit.as_padded(costs, n)
        out.append((padded.verify.tobytes(), padded.pad.tobytes()))
        drafted = rng.integers(0, K + 1, n) * (rng.random() < 0.9)
        ctx = rng.integers(100, 110, n) if rng.random() < 0.7 else np.full(n, 105)
        view = SimpleNamespace(predicted_verify_s=float(verify[0] * 1.1), context_lens=ctx, cost=LinearCost(v1=1e-5))
        c1 = float(rng.choice([1e-5, 2e-5]))   # (a new cost model each time, some pricing alike: pad_extra's cache)
        by_ctx = SimpleNamespace(verify_time=lambda c, d: 1e-3 + 1e-7 * float(np.sum(c)) + c1 * float(np.sum(d + 1)))
        roof = SimpleNamespace(predicted_verify_s=1e-3, context_lens=ctx, cost=_roofline())   # (padded_verify_time)
        out.append((kit.pad_extra(costs, drafted), kit.pad_extra(costs, drafted, view),
                    kit.pad_extra(costs, drafted, SimpleNamespace(predicted_verify_s=1e-3, context_lens=ctx,
                                                                  cost=by_ctx)),
                    kit.pad_extra(costs, np.zeros(0, np.int64)), kit.pad_extra(costs, drafted, roof)))
        cal = kit.CostCalibration()
        for _ in range(3):
            cal.update("verify", float(rng.uniform(0.01, 0.02)), 1.0, float(rng.uniform(0.01, 0.03)))
            cal.update("draft", float(rng.uniform(1e-3, 2e-3)), 2.0, float(rng.uniform(1e-3, 5e-3)))
        t = cal.correct(costs)
        out.append((t.verify.tobytes(), t.draft.tobytes()))
        pt = kit.PolicyTime(memory=2.0)   # correct with a policy time: policy_time.apply(correct(costs)), kept or not
        for _ in range(int(rng.integers(0, 3))):
            pt.observe(SimpleNamespace(measured_policy_s=float(rng.uniform(1e-5, 1e-4)),
                                       draft_forwards=int(rng.integers(0, 2))))
        want = pt.apply(cal.correct(costs))
        for keep in (False, True, True):
            t = cal.correct(costs, pt, keep=keep)
            out.append((t.verify.tobytes(), t.draft.tobytes(), None if t.pad is None else t.pad.tobytes()))
            assert out[-1] == (want.verify.tobytes(), want.draft.tobytes(),
                               None if want.pad is None else want.pad.tobytes())
        cal.update("verify", float(rng.uniform(0.01, 0.02)), 1.0, float(rng.uniform(0.01, 0.03)))
        for _ in range(2):   # kept tables corrected again after the fit moved, and after a policy time was measured
            t = cal.correct(costs, None if rng.random() < 0.7 else pt, keep=True)
            out.append((t.verify.tobytes(), t.draft.tobytes(), None if t.pad is None else t.pad.tobytes()))
        ctx64 = rng.integers(0, 10 ** int(rng.integers(1, 7)), n).astype(np.int64)
        ctx64[0] = -1 if n > 1 and rng.random() < 0.1 else ctx64[0]   # (a negative context: the Python form's keys)
        sc, model = kit.StepCost(pad_context=True), LinearCost(v1=1e-5, d1=1e-6)
        for c in (ctx64, ctx64 + 1, ctx64 * 2):   # StepCost's keys held, then changed
            sc.update(SimpleNamespace(cost=model, context_lens=c), K)
            out.append((sc.key[:3], sc._vkey[:3], sc.verify.tobytes(), sc.draft.tobytes(), sc.vpad.tobytes()))
        lag, mask = rng.integers(0, 5, n), rng.random(n) < 0.5
        feed = SimpleNamespace(draft_forward=lambda c, q: np.array([1e-4 * q.sum() + 1e-7 * c.sum()]))
        out.append(kit.catch_up_s(SimpleNamespace(draft_lag=lag, context_lens=ctx, cost=feed), mask))
    return out


def test_the_compiled_table_loops_are_their_numpy_form(monkeypatch):
    from specdepth.policies.kit import calibration, cost, idle
    rng = np.random.default_rng(9)
    for start, num in ((32, 40), (8, 12), (100, 64)):   # the grid's geometric part, geomspace spelled out
        for stop in list(range(start + 1, start + 3000)) + rng.integers(10 ** 4, 10 ** 9, 300).tolist():
            assert np.array_equal(cost._geometric(start, stop, num),
                                  np.unique(np.rint(np.geomspace(start, stop, num)))), (start, stop, num)
    compiled = [_tables_run(seed) for seed in range(6)]
    monkeypatch.setattr(cost, "COMPILED", False)
    monkeypatch.setattr(calibration, "COMPILED", False)
    monkeypatch.setattr(idle, "COMPILED", False)
    assert compiled == [_tables_run(seed) for seed in range(6)]


def _cost_calibration_run(seed):
    """CostCalibration.observe over random steps (draft_clip and draft_fixed on and off, steps that caught up, a
    draft priced nearly alike per forward half the time, a padding feature on most steps of the odd seeds): its
    state and fits, and the padding fit's, after each step."""
    rng = np.random.default_rng(seed)
    out = []
    for clip, fixed in ((0.0, False), (3.0, False), (0.0, True), (3.0, True)):
        cal = kit.CostCalibration(memory=float(rng.integers(5, 300)), draft_clip=clip, draft_fixed=fixed)
        even = rng.random() < 0.5
        for _ in range(60):
            fw = int(rng.integers(0, 4))
            pv = float(rng.uniform(0.01, 0.02))
            pd = fw * 5e-4 * (1.0 + (0.01 if even else 0.5) * float(rng.normal()))
            view = SimpleNamespace(measured_verify_s=pv * float(rng.uniform(0.8, 1.5)), predicted_verify_s=pv,
                                   draft_forwards=fw, predicted_draft_s=pd,
                                   measured_draft_s=pd * float(rng.uniform(0.5, 3.0)) + fw * float(rng.uniform(0, 1e-4)))
            pad = float(rng.uniform(0.0, 5e-3)) if seed % 2 and rng.random() < 0.8 else None
            cal.observe(view, pad=pad, caught_up=bool(rng.random() < 0.1))
            out.append((cal._state.tobytes(), cal.params("draft"), cal.params("verify"), cal.pad, cal._padding.fit,
                        cal._padding._s.tobytes()))
    return out


def test_the_compiled_cost_calibration_is_its_python_form(monkeypatch):
    from specdepth.policies.kit import calibration
    compiled = [_cost_calibration_run(seed) for seed in range(8)]
    monkeypatch.setattr(calibration, "COMPILED", False)
    assert compiled == [_cost_calibration_run(seed) for seed in range(8)]


@pytest.mark.parametrize("policy", ["confidence", "batch_scaled"])
def test_cost_aware_depths_compiled_chains_are_its_blocks(policy, monkeypatch):
    """End to end, CostAwareDepth's chains in one compiled call each (`kit.depth.COMPILED`) against its blocks one by
    one: a closed batch that drains with the draft's catch-up and a padded engine, a steady run, both with the policy
    time priced (a fixed measurement: the simulator's wall time would differ between the runs)."""
    from specdepth.policies.kit import cost, depth
    monkeypatch.setattr(cost.PolicyTime, "terms", lambda self: (True, 2e-4, 5e-4))
    runs = _runs_both_ways(monkeypatch, depth, policy, [
        ["workload.batch_size=40", "workload.output_len={dist: uniform, low: 8, high: 120}",
         "backend.draft_catch_up=true", "backend.pad_ragged=true"],
        ["workload.batch_size=24", "workload.output_len={dist: uniform, low: 8, high: 60}",
         "backend.draft_catch_up=true"],
        STEADY_24])
    assert runs[0] == runs[1]


STEADY_24 = ["workload=poisson", "workload.rate=1e9", "workload.num_requests=96", "engine.max_batch_size=24",
             "workload.max_concurrency=24", "workload.output_len=48"]


def _runs_both_ways(monkeypatch, module, policy: str, overrides: list) -> list:
    """The steps and requests of `policy`'s runs under each override list, with `module.COMPILED` True, then False."""
    from sdtest import engine
    runs = []
    for compiled in (True, False):
        monkeypatch.setattr(module, "COMPILED", compiled)
        runs.append(repr([(r.steps, r.requests) for r in (engine(f"policy={policy}", *ov).run() for ov in overrides)]))
    return runs


def _depth_case(rng, cost):
    """A CostAwareDepth with random evidence (rows' counts, the pool, position sums, fits, policy time) and a view of
    random rows (remaining tokens, lags that may need a catch-up, draining or not)."""
    n, kmax = int(rng.integers(1, 48)), int(rng.integers(1, 9))
    view = make_view(n, remaining=rng.integers(1, 200, n), ctx=int(rng.integers(10, 4000)), cost=cost,
                     requests_left=int(rng.choice([0, 10])), max_depth=kmax)
    lag = np.where(rng.random(n) < 0.3, rng.integers(3, 40, n), rng.integers(1, 3, n)) if rng.random() < 0.6 else \
        rng.integers(1, 3, n)
    view._lag = lambda: lag
    d = kit.CostAwareDepth(catch_up=True, policy_time=bool(rng.random() < 0.7), probe=float(rng.choice([0.0, 2.0])))
    st = d._seq.align(view.request_ids)
    st.accepted[:] = rng.integers(0, 40, n)
    st.rejected[:] = rng.integers(0, 15, n)
    p, tokens = float(rng.uniform(0.01, 0.9)), float(rng.choice([5.0, 80.0, 3000.0]))
    d._pool = np.array([p, 1.0 - p]) * tokens
    verified = rng.integers(0, kmax + 1, n)
    d._pos.add_counts(kmax, verified, np.minimum(verified, rng.integers(0, kmax + 1, n)), np.full(n, p))
    for _ in range(int(rng.integers(0, 4))):
        d._calib.update("verify", 0.01, 1.0, float(rng.uniform(0.008, 0.02)))
        d._calib.update("draft", 1e-3, 2.0, float(rng.uniform(5e-4, 4e-2)))
    if rng.random() < 0.5:
        d._ptime.drafting, d._ptime.idle = float(rng.uniform(0, 1e-3)), float(rng.uniform(0, 5e-4))
    return d, view, kmax


def test_cost_aware_depths_compiled_plan_is_its_blocks(monkeypatch):
    """CostAwareDepth.depth with its chain in one compiled call (`kit.depth.COMPILED`) against the blocks one by one,
    on random evidence and rows (catch-ups, probes, drains, policy time): the same depth, held rows, margin and
    catch-up record."""
    import copy
    from specdepth.app import build
    from specdepth.policies.kit import depth
    from sdtest import cfg
    cost = build(cfg())["engine"].cost
    rng = np.random.default_rng(5)
    for _ in range(150):
        d0, view, kmax = _depth_case(rng, cost)
        got = []
        for compiled in (True, False):
            monkeypatch.setattr(depth, "COMPILED", compiled)
            d = copy.deepcopy(d0)
            k = d.depth(view, kmax)
            m = d.margin
            got.append(repr((k, None if d.held is None else d.held.tolist(), d._level, d._probes, d._pad.caught_up,
                             d._pad._est, None if m is None else (m[0].verify.tobytes(), m[0].draft.tobytes(),
                                                                   None if m[0].pad is None else m[0].pad.tobytes(),
                                                                   m[1], m[2].tobytes()))))
        assert got[0] == got[1]


def test_the_compiled_table_interpolation_and_roofline_tables_are_numpys(monkeypatch):
    """StepCost's np.interp of a grid (`kernels.interp_into`: NaN and infinite values included) and RooflineCost's
    compiled verify_time, verify_times, draft_times and row_verify_times (and kit.row_cost through it) against the
    numpy and base-class forms, to the bit."""
    from specdepth.app import build
    from specdepth.cost import CostModel
    from specdepth.policies.kit import cost as kcost
    from sdtest import cfg
    rng = np.random.default_rng(11)
    for t in range(400):
        X = int(rng.integers(1, 3000))
        xs = np.array(kcost._grid(X))
        fp = [np.cumsum(rng.uniform(0, 1e-4, xs.size)) + 0.01, rng.normal(size=xs.size) * 10.0 ** rng.integers(-8, 3),
              np.where(rng.random(xs.size) < 0.1, np.nan, np.where(rng.random(xs.size) < 0.05, np.inf, 0.3)),
              np.where(rng.random(xs.size) < 0.2, -np.inf, 0.3)][t % 4]
        with np.errstate(all="ignore"):
            assert kcost._interp(X + 1, xs, fp).tobytes() == np.interp(np.arange(X + 1), xs, fp).tobytes()
    for t in range(300):   # any ascending grid: points below, between (fractional) and past it
        xp = np.unique(np.concatenate([rng.uniform(-50, 350, int(rng.integers(1, 30))), rng.integers(-5, 320, 3)]))
        fp = np.where(rng.random(xp.size) < 0.1, [np.nan, np.inf][t % 2], rng.normal(size=xp.size))
        out = np.empty(int(rng.integers(0, 300)))
        with np.errstate(all="ignore"):
            assert kit.kernels.interp_into(xp, fp, out)
            assert out.tobytes() == np.interp(np.arange(out.size), xp, fp).tobytes()
    cm = build(cfg())["engine"].cost
    for _ in range(300):
        n = int(rng.integers(1, 300))
        ctx = rng.integers(0, 10 ** int(rng.integers(1, 7)), n).astype(np.int64)
        depths = rng.integers(0, 9, n).astype(np.int64)
        assert cm.verify_time(ctx, depths) == CostModel.verify_time(cm, ctx, depths)
        xs, ms, cbar = np.array(kcost._grid(int(rng.integers(0, 3000)))), np.array(kcost._grid(n)), float(ctx.mean())
        assert cm.verify_times(ctx, xs).tobytes() == CostModel.verify_times(cm, ctx, xs).tobytes()
        assert cm.draft_times(cbar, ms).tobytes() == CostModel.draft_times(cm, cbar, ms).tobytes()
        v, d = cm.step_tables(ctx, xs, cbar, ms)   # both in one pass: the base class's two calls
        assert (v.tobytes(), d.tobytes()) == tuple(t.tobytes() for t in CostModel.step_tables(cm, ctx, xs, cbar, ms))
        mean = cbar if rng.random() < 0.5 else float(rng.uniform(0, 1e6))   # row_verify_times: the base class's
        assert cm.row_verify_times(mean, n) == CostModel.row_verify_times(cm, mean, n)
        assert kcost.row_cost(cm, ctx) == kcost.row_cost(SimpleNamespace(verify_time=cm.verify_time), ctx)
        k = int(rng.integers(1, 9))   # StepCost's mean and padded-context verify: ctx.mean() and verify_times'
        sc = kcost.StepCost(pad_context=True).update(SimpleNamespace(cost=cm, context_lens=ctx), k)
        assert sc.mean == cbar and sc.model is cm and sc.ctx is ctx
        assert sc.vpad.tobytes() == cm.verify_times(np.full(n, ctx.max()), n * np.arange(k + 1.0)).tobytes()


def test_cost_aware_policys_finish_is_the_caps_and_the_token_cap():
    """CostAwarePolicy.finish and .uniform (one compiled loop each) against draft_caps and fit_token_cap, with the
    engine's token cap binding and not."""
    from specdepth.policies import BatchScaled
    from specdepth.policies.kit import depth
    rng = np.random.default_rng(12)
    for _ in range(300):
        n = int(rng.integers(1, 80))
        view = make_view(n, remaining=rng.integers(1, 12, n), cap=int(rng.integers(n - 3, n + 8 * n)),
                         max_depth=int(rng.integers(1, 9)))
        pol = BatchScaled(max_depth=int(rng.integers(0, 9)))
        depths = rng.integers(0, 9, n).astype(np.int64)
        cap = pol.cap(view)
        want = kit.fit_token_cap(np.minimum(depths, kit.draft_caps(view, cap)), view)
        assert pol.finish(depths, view).tolist() == want.tolist()
        k = int(rng.integers(0, 9))
        want = kit.fit_token_cap(np.minimum(np.full(n, k), kit.draft_caps(view, cap)), view)
        assert pol.uniform(view, k).tolist() == want.tolist()
        assert depth.COMPILED


def test_policy_time_prices_idle_seconds_on_every_plan_and_the_rest_on_the_first_position():
    pt = kit.PolicyTime(memory=1.0)
    tables = kit.Tables(np.array([1.0, 2.0, 3.0]), np.array([0.0, 0.5]))
    assert pt.apply(tables) is tables   # nothing measured: unchanged
    pt.observe(SimpleNamespace(measured_policy_s=0.1, draft_forwards=0))
    pt.observe(SimpleNamespace(measured_policy_s=0.3, draft_forwards=2))
    out = pt.apply(tables)
    assert out.verify.tolist() == pytest.approx([1.1, 2.1, 3.1]) and out.pad[0] == pytest.approx(0.2)


def test_as_padded_charges_a_whole_position_per_position_opened():
    v = np.array([1.0, 1.1, 1.2, 1.3, 1.4])   # 2 rows, 2 positions
    t = kit.as_padded(kit.Tables(v, np.array([0.0, 0.1, 0.2])), 2)
    assert t.verify.tolist() == [1.0] * 5 and t.pad.tolist() == pytest.approx([0.2, 0.2])


# ---- calibration ---------------------------------------------------------------------------------

def _steps(n, verify_scale, draft_fixed):
    for i in range(n):
        pv, pd, fw = 0.01 + 0.001 * (i % 5), 0.002 + 0.0005 * (i % 3), 1 + i % 4
        yield SimpleNamespace(measured_verify_s=verify_scale * pv, predicted_verify_s=pv, draft_forwards=fw,
                              measured_draft_s=pd + draft_fixed * fw, predicted_draft_s=pd)


def test_cost_calibration_learns_a_verify_scale_and_a_draft_fixed_cost():
    cal = kit.CostCalibration(prior=0.1)
    for view in _steps(400, 2.0, 1e-3):
        cal.observe(view)
    assert cal.params("verify")[0] == pytest.approx(2.0, rel=0.02)
    scale, fixed = cal.params("draft")
    assert scale == pytest.approx(1.0, rel=0.05) and fixed == pytest.approx(1e-3, rel=0.05)
    t = cal.correct(kit.Tables(np.array([1.0, 2.0]), np.array([0.0, 1.0])))
    assert t.verify[0] == pytest.approx(2.0, rel=0.03) and t.draft[0] == 0.0


# ---- acceptance ------------------------------------------------------------------------------------

def _padding_run(seed):
    """PaddingFit fed steps of random regimes (padded or not, a fixed cost or not, a constant padding feature,
    noise): its pad and fit after each step."""
    rng = np.random.default_rng(seed)
    fit = kit.PaddingFit(float(rng.choice([20.0, 200.0])), sticky=bool(rng.random() < 0.7),
                         cautious=bool(rng.random() < 0.7))
    out = []
    for step in range(300):
        if step % 60 == 0:
            scale, fixed, padded = rng.uniform(0.5, 2), rng.choice([0.0, 1e-3, -1e-3]), rng.choice([0.0, 0.5, 1.0])
            const, noise = rng.random() < 0.3, rng.choice([0.0, 1e-5, 1e-3])
        predicted = rng.uniform(0.01, 0.03)
        pad = 0.004 if const else rng.uniform(0, 0.01) * (rng.random() < 0.6)
        measured = scale * predicted + fixed + padded * pad + noise * rng.normal()
        fit.update(predicted, pad, measured)
        out.append((fit.pad, fit.fit, fit.xx, fit.xy, fit.yy, fit.w))
    return out


def test_the_compiled_padding_fit_is_its_python_form(monkeypatch):
    from specdepth.policies.kit import calibration
    compiled = [_padding_run(seed) for seed in range(30)]
    assert {f[0] > 0 for run in compiled for f in run} == {True, False}   # padding found and not
    monkeypatch.setattr(calibration, "COMPILED", False)
    assert compiled == [_padding_run(seed) for seed in range(30)]


def test_expected_tokens_is_leviathans_formula():
    a, ks = np.array([0.5, 0.9]), np.arange(4)
    want = (1.0 - a[None, :] ** (ks[:, None] + 1)) / (1.0 - a[None, :])
    assert np.allclose(kit.expected_tokens(a, ks), want)
    halved = kit.expected_tokens(a, ks, factors=np.array([1.0, 0.5, 0.5]))
    assert halved[2, 0] == pytest.approx(1.0 + 0.5 + 0.5 * 0.25)


def test_position_factors_find_a_later_position_accepted_less_often():
    pf = kit.PositionFactors(prior=1.0, optimism=0.0)
    verified = np.ones((200, 2), bool)
    accepted = np.zeros((200, 2), bool)
    accepted[:, 0] = True
    accepted[:100, 1] = True   # position 1: half as often as the estimate 1.0 says
    pf.add(verified, accepted, np.ones(200))
    f = pf.factor(3)
    assert f[0] == pytest.approx(1.0) and f[1] == pytest.approx(101 / 201) and f[2] == 1.0


def test_shrunk_rates_ignore_chance_and_follow_real_spread():
    level = np.full(2, 0.6)
    alike = kit.shrunk_rates(np.array([6.0, 5.0]), np.array([4.0, 5.0]), level)
    assert alike.tolist() == [0.6, 0.6]
    apart = kit.shrunk_rates(np.array([950.0, 50.0]), np.array([50.0, 950.0]), level)
    assert apart[0] > 0.9 and apart[1] < 0.3


def _rates_and_tokens(seed):
    """shrunk_rates and expected_tokens (per position: factors and/or trials) on random rows, as bytes."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(30):
        rows = int(rng.integers(1, 300))
        acc = np.floor(rng.uniform(0, 40, rows) * (rng.random(rows) < 0.8))
        rej = np.floor(rng.uniform(0, 40, rows) * (rng.random(rows) < 0.8) * rng.choice([0.0, 1.0, 3.0]))
        level = np.full(rows, rng.uniform(0, 1)) if rng.random() < 0.7 else rng.uniform(-0.1, 1.1, rows)
        out.append(kit.shrunk_rates(acc, rej, level).tobytes())
        a = rng.uniform(-0.1, 1.1, rows)
        a[rng.random(rows) < 0.05] = rng.choice([0.0, -0.0, 0.999, 1.0])
        K = int(rng.integers(0, 12))
        ks = np.arange(K + 1) if rng.random() < 0.7 else np.array([K])
        f = rng.uniform(0.3, 1.6, K + int(rng.integers(0, 3)))
        for factors, trials in ((f, None), (None, float(rng.uniform(1, 100))), (f, 7.0)):
            out.append(kit.expected_tokens(a, ks, factors, trials).tobytes())
    return out


def test_the_compiled_rates_tokens_and_bands_are_their_numpy_form(monkeypatch):
    from specdepth.policies.kit import acceptance
    compiled = [_rates_and_tokens(seed) for seed in range(8)] + [_bands(seed) for seed in range(8)]
    monkeypatch.setattr(acceptance, "COMPILED", False)
    assert compiled == [_rates_and_tokens(seed) for seed in range(8)] + [_bands(seed) for seed in range(8)]


def _bands(seed):
    """tie_bands on random estimates (rounded: ties; a zero, a NaN, one value), as bytes."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(40):
        a = np.round(rng.uniform(0, 1, int(rng.integers(1, 300))) ** rng.uniform(0.2, 3), int(rng.integers(1, 5)))
        if rng.random() < 0.1:
            a[0] = rng.choice([0.0, -0.0, np.nan, a[-1]])
        if rng.random() < 0.05:
            a[:] = a[0]
        with np.errstate(invalid="ignore"):
            try:
                out.append(kit.tie_bands(a, float(rng.choice([0.0, 0.001, 0.01, 0.1]))).tobytes())
            except ValueError as e:   # a NaN: no band (np.bincount of -1)
                out.append(str(e).encode())
    return out


def _position_run(seed, counts):
    """PositionFactors (plain and paired) fed random masks (one column included) or counts: their sums and
    factors after each step, as bytes."""
    rng = np.random.default_rng(seed)
    pfs = [kit.PositionFactors(prior=float(rng.uniform(0, 30)), optimism=float(rng.choice([0.0, 2.0])), paired=p)
           for p in (False, True)]
    out = []
    for _ in range(40):
        rows, k = int(rng.integers(1, 200)), int(rng.choice([1, 1, 2, 5, 9]))
        drafted = rng.integers(0, k + 1, rows)
        accepted = np.minimum(rng.integers(0, k + 1, rows), drafted)
        verified = np.minimum(drafted, accepted + 1)
        estimate = rng.uniform(0, 1, rows) * 10.0 ** rng.integers(-3, 3, rows)
        cols = np.arange(k)[None, :]
        for pf in pfs:
            pf.forget(float(rng.uniform(0.9, 1.0)))
            if counts and pf.accepted.size >= k:
                pf.add_counts(k, verified, accepted, estimate, drafted)
            else:
                pf.add(cols < verified[:, None], (cols < accepted[:, None]) | (rng.random((rows, k)) < 0.05),
                       estimate, drafted)
            out.append(b"".join(a.tobytes() for a in (pf.accepted, pf.expected, pf.first_acc, pf.first_exp,
                                                     pf.factor(int(rng.integers(1, 40))))))
    return out


def test_the_compiled_position_factors_are_their_numpy_form(monkeypatch):
    import warnings
    from specdepth.policies.kit import acceptance
    with warnings.catch_warnings():   # no prior, a position never verified: 0 / 0 is NaN in both forms
        warnings.simplefilter("ignore", RuntimeWarning)
        degenerate = []
        for compiled in (True, False):
            monkeypatch.setattr(acceptance, "COMPILED", compiled)
            pf = kit.PositionFactors(prior=0.0)
            pf.add(np.zeros((3, 4), bool), np.zeros((3, 4), bool), np.ones(3))
            degenerate.append((pf.factor(5).tobytes(), kit.expected_tokens(np.array([0.5]), np.arange(3), None,
                                                                            0.0).tobytes()))
        assert degenerate[0] == degenerate[1]
    monkeypatch.setattr(acceptance, "COMPILED", True)
    compiled = [_position_run(seed, counts) for seed in range(10) for counts in (False, True)]
    monkeypatch.setattr(acceptance, "COMPILED", False)
    assert compiled == [_position_run(seed, counts) for seed in range(10) for counts in (False, True)]


def test_tie_bands_average_estimates_within_the_tolerance():
    out = kit.tie_bands(np.array([0.80, 0.805, 0.5]), 0.01)
    assert out.tolist() == pytest.approx([0.8025, 0.8025, 0.5])
    assert kit.tie_bands(np.array([0.8, 0.805]), 0.0).tolist() == [0.8, 0.805]


def test_confidence_calibration_learns_an_under_confident_draft():
    cal = kit.ConfidenceCalibration(prior=1.0)
    rng = np.random.default_rng(0)
    for _ in range(50):   # confidence 0.1, accepted 60 % of the time
        conf = np.full((32, 1), 0.1)
        acc = (rng.random(32) < 0.6).astype(np.int64)
        cal.add(conf, np.ones(32, np.int64), acc)
    assert float(cal(np.array([0.1]))[0]) == pytest.approx(0.6, abs=0.05)


def _calibration_run(rng, steps=120):
    """A ConfidenceCalibration fed random steps (NaN confidences, rows that drafted nothing, saturated confidences):
    its fit, counts and acceptance map after each step, as bytes."""
    cal = kit.ConfidenceCalibration(prior=float(rng.choice([0.01, 1.0, 20.0])), memory=float(rng.choice([50.0, 2e3])))
    skew, scale, out = rng.uniform(-3, 3), rng.uniform(0.1, 5), []
    for _ in range(steps):
        rows, k = int(rng.integers(1, 70)), int(rng.integers(1, 9))
        conf = rng.beta(rng.uniform(0.1, 3), rng.uniform(0.1, 3), (rows, k))
        conf[rng.random((rows, k)) < 0.1] = np.nan
        if rng.random() < 0.05:
            conf[:] = rng.choice([0.0, 1.0, 1e-9])
        drafted = rng.integers(0, k + 1, rows)
        with np.errstate(all="ignore"):
            p = np.nan_to_num(1 / (1 + np.exp(-(skew + scale * np.log(conf / (1 - conf))))), nan=0.5)
        accepted = np.argmin(np.concatenate([rng.random((rows, k)) < p, np.zeros((rows, 1), bool)], axis=1), axis=1)
        cal.add(conf, drafted, np.minimum(accepted, drafted))
        if rng.random() < 0.05:   # counts set from outside
            cal.n, cal.acc = cal.n * 0.5, cal.acc * 0.5
        c = rng.beta(0.5, 0.5, rows)
        c[rng.random(rows) < 0.2] = np.nan
        out.append((cal.a, cal.b, cal.n.tobytes(), cal.acc.tobytes(), cal(c).tobytes(), cal.odds(c).tobytes()))
    return out


def test_the_compiled_confidence_calibration_is_its_numpy_form_to_the_bit(monkeypatch):
    import warnings
    from specdepth.policies.kit import acceptance, kernels
    if not kernels.blas_dot_matches():   # the calibration then runs its numpy form: nothing compiled to compare
        pytest.skip("this machine's BLAS dot is not the one kernels._ddot emulates")
    compiled = [_calibration_run(np.random.default_rng(seed)) for seed in range(12)]
    cal = kit.ConfidenceCalibration()
    cal.a, cal.b = 3.0, 250.0   # exp's argument past its overflow: silenced as in the numpy form
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        steep = cal(np.array([0.001, 0.5, 0.999, np.nan])).tobytes()
    monkeypatch.setattr(acceptance, "COMPILED", False)   # the numpy form
    assert compiled == [_calibration_run(np.random.default_rng(seed)) for seed in range(12)]
    assert cal(np.array([0.001, 0.5, 0.999, np.nan])).tobytes() == steep


def _confidence_keeps(cases):
    """confidence's keep_drafting on each case (its plan's state set by hand): the masks and running products."""
    from specdepth.policies.confidence import ConfidenceThreshold
    from specdepth.policies.kit import search
    out = []
    for calibrate, ab, view, position, k, conf, margin, cum in cases:
        p = ConfidenceThreshold(calibrate=calibrate, use_budget=k == 5)
        if calibrate:
            p._cal.a, p._cal.b = ab
        p._k, p._margin, p._cum = k, margin, cum.copy()
        p._depths, p._tables = None, None if margin is None else p._drafting_tables(view, view.batch_size)
        p._compiled = search.COMPILED and (margin is None or p._tables is not None)   # as plan sets them
        out.append((p.keep_drafting(view, position, conf).tobytes(), p._cum.tobytes()))
    return out


def test_confidences_compiled_keep_drafting_is_its_numpy_form(monkeypatch):
    """confidence's keep_drafting in one compiled loop after the calibration's odds
    (`kernels.confidence_drafting`) gives its numpy form's masks and running products: NaN confidences, none, one
    and several rows past the cost rule's depth, padded and plain tables, calibrated and raw, with a budget."""
    from specdepth.policies.kit import acceptance, search
    rng = np.random.default_rng(13)
    cases = []
    for t in range(300):
        n = int(rng.integers(1, 30))
        view = drafting(make_view(n, remaining=rng.integers(1, 60, n), budget=n + int(rng.integers(0, 5 * n))),
                        rng.integers(0, 6, n))
        conf = rng.uniform(0, 1, n)
        conf[rng.random(n) < 0.2] = np.nan
        ver = np.cumsum(rng.uniform(0, 1e-4, n * 6 + 1)) + 0.01
        dr = np.concatenate([[0.0], np.cumsum(rng.uniform(0, 1e-4, n + 1)) + 0.002])
        tables = kit.Tables(ver, dr, rng.uniform(0, 1e-3, int(rng.integers(0, 8))) if t % 3 else None)
        margin = None if t % 4 == 0 else (tables, float(10 ** rng.uniform(1, 3.5)),
                                          rng.uniform(0.3, 0.99, int(rng.integers(1, 9))))
        cases.append((t % 5 != 0, (rng.normal(0, 2), rng.uniform(0.1, 3)), view, int(rng.integers(0, 5)),
                      int(rng.integers(0, 6)), conf, margin, rng.uniform(0.2, 1, n)))
    got = _confidence_keeps(cases)
    assert len({g[0] for g in got}) > 50   # varied masks
    monkeypatch.setattr(search, "COMPILED", False)
    monkeypatch.setattr(acceptance, "COMPILED", False)
    assert got == _confidence_keeps(cases)


def test_the_block_kernels_compute_numpys_sums_dots_and_libm_calls_to_the_bit():
    from numba import njit

    from specdepth.policies.kit import kernels as kb
    rng = np.random.default_rng(4)
    for n in list(range(0, 140)) + [300, 1001, 4099]:
        a, b = rng.normal(size=n) * 10.0 ** rng.integers(-4, 5, n), rng.normal(size=n)
        assert kb._sum(a) == float(a.sum()) and kb._ddot(a, b) == float(a @ b), n
    z = np.concatenate([rng.normal(size=20000) * 10, rng.uniform(-800, 800, 2000), rng.normal(size=2000) * 1e-17,
                        [0.0, -0.0, np.inf, -np.inf, 709.8, -745.2]])
    pairs = np.array([kb._neg_softplus_pair(float(v)) for v in z])
    assert np.array_equal(pairs[:, 0], -np.logaddexp(0.0, -z)) and np.array_equal(pairs[:, 1], -np.logaddexp(0.0, z))
    for lo, hi in ((0.0, 0.999), (-7.0, 7.0), (1e-6, 1.0 - 1e-6)):
        got = np.array([kb._clip(float(v), lo, hi) for v in z])
        want = np.clip(z, lo, hi)
        assert np.array_equal(got, want, equal_nan=True) and np.array_equal(np.signbit(got), np.signbit(want))
    power = njit(lambda v, e: v ** e)   # the kernels' `** 2` (as PaddingFit's Python form writes it)
    v = rng.normal(size=3000) * 10.0 ** rng.integers(-6, 3, 3000)
    assert [power(float(x), 2.0) for x in v] == [float(x) ** 2 for x in v]   # libm's pow, not x * x:
    assert any(float(x) ** 2 != float(x) * float(x) for x in v)                  # they differ on some of these


# ---- drain -----------------------------------------------------------------------------------------

def test_expected_max_of_normals():
    assert kit.expected_max(np.array([3.0, 1.0]), np.zeros(2)) == 3.0
    assert kit.expected_max(np.zeros(2), np.ones(2), points=4096) == pytest.approx(1 / math.sqrt(math.pi), abs=2e-3)
    mu, sd = np.array([0.0, 0.0, 0.3, -9.0]), np.array([1.0, 1.0, 0.5, 1.0])
    assert kit.expected_max(mu, sd, grouped=True) == pytest.approx(kit.expected_max(mu, sd), rel=1e-3)


def test_the_compiled_expected_max_is_its_numpy_form(monkeypatch):
    """expected_max (not grouped) in its compiled loops around numpy's tanh (`kernels.max_arguments` and
    `max_integral`, saturated arguments skipped) against the numpy form, to the bit: spreads of many scales, rows
    with none, all alike, degenerate and two-point grids, a value not finite."""
    from specdepth.policies.kit import search
    rng = np.random.default_rng(13)
    cases = [(np.array([1.0, np.nan]), np.ones(2)), (np.array([2.0, 2.0]), np.zeros(2)), (np.ones(1), np.ones(1))]
    for t in range(500):
        n = int(rng.integers(1, 80))
        mu = rng.uniform(0, 10 ** rng.uniform(0, 3), n) * (1.0 if t % 9 else 0.0) + float(rng.uniform(0, 9))
        sd = rng.uniform(0, 10 ** rng.uniform(-3, 2), n) * (rng.random(n) < [0.9, 0.0, 1.0][t % 3])
        cases.append((mu, sd))
    got = []
    for compiled in (True, False):
        monkeypatch.setattr(search, "COMPILED", compiled)
        got.append([repr(kit.expected_max(mu, sd, points)) for mu, sd in cases for points in (256, 2, 3, 17)])
    assert got[0] == got[1]


# ---- search ----------------------------------------------------------------------------------------

def test_expected_maxes_are_expected_max_per_row_to_the_bit():
    from specdepth.policies.kit.drain import expected_maxes
    rng = np.random.default_rng(3)
    for _ in range(60):
        D, n = int(rng.integers(1, 9)), int(rng.integers(1, 120))
        mu = rng.choice(rng.uniform(1, 400, 6), n)[None, :] / rng.uniform(1, 5, (D, 1))
        sd = np.sqrt(mu) * rng.choice([0.0, 1.0, 1.0], (D, n))
        mu[:, 1:4:2], sd[:, 1:4:2] = mu[:, :3:2], sd[:, :3:2]   # counts of 2 (numpy's power has a fast path)
        want = [kit.expected_max(mu[d], sd[d], grouped=True) for d in range(D)]
        assert expected_maxes(mu, sd).tolist() == want
    one = np.array([[5.0, 5.0, 1.0]])   # one pair of count 2 (power's fast path: a square) in its row
    assert expected_maxes(one, np.array([[1.0, 1.0, 0.0]]))[0] == kit.expected_max(one[0], np.array([1.0, 1.0, 0.0]),
                                                                                   grouped=True)


def test_the_compiled_drain_gives_the_numpy_form_to_the_bit(monkeypatch):
    from specdepth.policies.kit import drain, kernels, search
    rng = np.random.default_rng(4)
    cases = []
    for t in range(200):
        D, n = int(rng.integers(1, 10)), int(rng.integers(1, 80))
        levels = int(rng.integers(1, 6))   # few distinct (mu, sd): groups with counts
        mu = rng.choice(rng.uniform(10, 300, levels), (D, n)) * rng.uniform(0.5, 1.5, (D, 1))
        sd = rng.choice(rng.uniform(0.0 if t % 3 == 0 else 0.5, 20, levels), (D, n))
        if t % 5 == 0:
            sd[:, :int(rng.integers(0, n + 1))] = 0.0   # constant rows (the cut)
        if t % 7 == 0:   # one group of count 2 per row (numpy's power squares)
            mu, sd = np.repeat(mu[:, :1], 2, axis=1), np.repeat(sd[:, :1], 2, axis=1)
        if t % 11 == 0:   # degenerate and non-finite grids
            mu[0], sd[0] = 5.0, 0.0
            mu[-1, 0] = [np.nan, np.inf][t % 2]
        if t % 13 == 0:   # NaN anywhere in a row (np.max's NaN wins)
            [mu, sd][t % 2][int(rng.integers(D)), int(rng.integers(mu.shape[1]))] = np.nan
        cases.append((mu, sd))
    for n in (3, 70, 300):   # rows in random orders, many distinct pairs (the sort's fallback)
        mu = rng.uniform(10, 300, (5, n))
        cases.append((mu, np.sqrt(mu) * rng.choice([0.0, 1.0, 1.0, 2.0], (5, n))))
    for _ in range(8):   # bounds of either zero sign (no sum depends on the sign)
        row = rng.permutation([-0.0, 0.0, -3.0, 0.0, -0.0, -0.0, -2.0])   # lo = 0 or -0
        cases.append((np.array([row, row]), np.array([(row < 0) * 1.0, (row < 0) * 0.5])))
    with np.errstate(all="ignore"):
        got = [drain.expected_maxes(mu, sd) for mu, sd in cases]
    held = 0
    for (mu, sd), g in zip(cases, got):   # the bounds `kernels._drain_skips` rules depths out by hold
        for d in range(mu.shape[0]):
            lo, hi, step, odd = kernels._drain_bounds(mu, sd, d, 256)
            if not odd and lo > 0:
                floor = kernels._drain_floor(mu[d], sd[d], lo, step, 256)
                assert floor <= g[d] <= min(hi * (1.0 + 1e-12) + (hi - lo) * 1e-6,
                                            kernels._drain_top(mu[d], sd[d], lo, hi, step))
                held += floor > lo
    assert held
    with np.errstate(all="ignore"):
        monkeypatch.setattr(search, "COMPILED", False)
        for (mu, sd), g in zip(cases, got):
            assert np.array_equal(g, drain.expected_maxes(mu, sd), equal_nan=True)
    # the premises: numpy's tanh is exactly 1 from the saturation point up, the pairwise sum is np.sum's
    u = np.concatenate([np.linspace(kernels.SATURATED, 1e3, 100_001), np.logspace(3, 300, 1000)])
    assert (np.tanh(u) == 1.0).all() and (np.abs(np.tanh(np.linspace(-30, 30, 600_001))) <= 1.0).all()
    v = np.concatenate([np.linspace(-25.0, 0.0, 200_001), -np.logspace(-8, 1.4, 10_000)])   # `_drain_start`'s
    assert np.abs(np.tanh(v) - np.array([math.tanh(a) for a in v.tolist()])).max() <= 2.0 ** -50   # tanh within 2^-49
    for n in [0, 1, 7, 8, 9, 127, 128, 129, 255, 256, 1000]:
        v = rng.normal(0, 1, n) * 10 ** rng.uniform(-3, 3, n)
        assert kernels.pairwise(np.r_[7.0, v], 1, n) == v.sum()


def test_uniform_depth_drafts_where_drafts_are_cheap_and_not_where_they_are_dear():
    a = np.full(4, 0.8)
    cheap = kit.Tables(np.full(4 * 8 + 1, 10e-3), np.r_[0.0, np.full(4, 0.1e-3)])
    dear = kit.Tables(np.full(4 * 8 + 1, 10e-3), np.r_[0.0, np.full(4, 50e-3)])
    k, g = kit.uniform_depth(a, cheap, 8)
    assert k == 8 and g == pytest.approx(kit.expected_tokens(a, np.array([8])).sum() / (10e-3 + 8 * 0.1e-3))
    assert kit.uniform_depth(a, dear, 8)[0] == 0


def test_the_compiled_steps_to_finish_give_the_numpy_form_to_the_bit(monkeypatch):
    from specdepth.policies.kit import drain, kernels, search
    rng = np.random.default_rng(8)
    cases = []
    for _ in range(200):
        K, n = int(rng.integers(1, 10)), int(rng.integers(2, 100))
        steps = np.cumprod(np.vstack([np.ones(n), np.tile(rng.uniform(0, 0.99, n), (K - 1, 1))]), axis=0)
        e = np.cumsum(steps, axis=0)
        cases.append((e if len(cases) % 10 else np.asfortranarray(e), rng.integers(1, 500, n).astype(float)))
    cases.append((np.tile(cases[0][0], 2)[:, ::2], cases[0][1]))   # a strided view
    got = [search._steps_to_finish(e, rem, True) for e, rem in cases]
    work, T = drain.FinishWork(), rng.uniform(0.01, 0.02, 10)   # the drain's answer in kept buffers (one for all)
    best, skipped = [], 0
    for e, rem in cases:
        best.append(drain.finish_best(np.ascontiguousarray(e), rem, 3e4, T[:e.shape[0]], work))
        skipped += int(work.skip.sum())   # (depths whose ratio is sure to lose: not computed)
    assert skipped
    monkeypatch.setattr(search, "COMPILED", False)
    assert all(np.array_equal(g, search._steps_to_finish(e, rem, True)) for g, (e, rem) in zip(got, cases))
    for b, (e, rem) in zip(best, cases):
        assert b == kernels.ratio_best(3e4, search._steps_to_finish(e, rem, True), T[:e.shape[0]])


def test_the_compiled_uniform_depth_gives_the_numpy_form_to_the_bit(monkeypatch):
    from specdepth.policies.kit import search
    rng = np.random.default_rng(6)
    cases = []
    for t in range(300):
        n, K = int(rng.integers(1, 300)), int(rng.integers(0, 9))
        ver = np.cumsum(rng.uniform(0, 1e-4, max(n * K + 1 - (t % 4 == 0) * n, 1))) + 0.01   # short tables too
        dr = np.concatenate([[0.0], np.cumsum(rng.uniform(0, 1e-4, n)) + 0.002])
        costs = kit.Tables(ver, dr, rng.uniform(0, 1e-3, int(rng.integers(1, 9))) if t % 3 == 0 else None)
        f = rng.uniform(0.5, 1.2, K) if t % 2 else None
        trials = float(rng.uniform(1, 100)) if t % 5 or f is None else None
        ends = rng.integers(0, K + 2, n) if t % 2 == 0 else None
        drain = {} if t % 3 else dict(remaining=rng.integers(1, 300, n), rates=rng.uniform(0, 0.99, n),
                                      spread=bool(t % 2))   # draining rows (with ends: the numpy form)
        cases.append((np.full(n, rng.uniform(0, 1)), costs, K, dict(factors=f, trials=trials, ends=ends, **drain)))
    got = [kit.uniform_depth(a, c, K, **kw) for a, c, K, kw in cases]
    monkeypatch.setattr(search, "COMPILED", False)
    assert got == [kit.uniform_depth(a, c, K, **kw) for a, c, K, kw in cases]


def test_plan_by_position_drafts_the_better_rows_deeper():
    S = np.cumprod(np.array([[0.9] * 4, [0.2] * 4]), axis=1)
    costs = kit.Tables(np.full(2 * 4 + 1, 10e-3), np.r_[0.0, 1e-3, 1.1e-3])
    depths, g = kit.plan_by_position(S, costs)
    assert depths[0] > depths[1] and g > 2 / 10e-3


def test_the_compiled_searches_plan_what_the_numpy_loops_plan(monkeypatch):
    from specdepth.policies.kit import search
    rng = np.random.default_rng(2)
    cases = []
    for _ in range(60):
        n, K = int(rng.integers(17, 120)), int(rng.integers(1, 9))
        S = np.cumprod(rng.uniform(0.2, 1, (n, K)), axis=1) * (rng.random((n, K)) < 0.9)
        S *= rng.uniform(0.1, 3, n)[:, None]   # weighted rows: rankings that differ by position
        ver = np.cumsum(rng.uniform(0, 1e-4, n * K + 1)) + 0.01
        dr = np.concatenate([[0.0], np.cumsum(rng.uniform(0, 1e-4, n)) + 0.002])
        costs = kit.Tables(ver, dr, rng.uniform(0, 1e-3, K) if rng.random() < 0.3 else None)
        for nested in (True, False):
            cases.append((S, costs, float(rng.uniform(0, 3) * n / ver[0]), rng.integers(1, 100, n), nested))
    compiled = [kit.plan_by_position(S, c, G0, tie=t, nested=nd, base=float(S[:, 0].sum()))
                for S, c, G0, t, nd in cases]
    views = [drafting_view(make_view(len(S), remaining=rng.integers(2, 50, len(S))), int(rng.integers(1, 4)))
             for S, *_ in cases]
    pick = np.random.default_rng(5)
    kept = [_margins(v, S, c, pick) for v, (S, c, *_) in zip(views, cases)]
    monkeypatch.setattr(search, "COMPILED", False)   # the numpy loops
    for (S, c, G0, t, nd), (depths, G) in zip(cases, compiled):
        want_depths, want_G = kit.plan_by_position(S, c, G0, tie=t, nested=nd, base=float(S[:, 0].sum()))
        assert np.array_equal(depths, want_depths) and G == want_G
    pick = np.random.default_rng(5)
    for v, (S, c, *_), got in zip(views, cases, kept):
        assert _margins(v, S, c, pick) == got


def _margins(view, S, costs, rng):
    """keep_by_margin on a few random slot values of view's rows: the masks and the ratio's final [E, T]."""
    out = []
    for _ in range(4):
        idx = np.flatnonzero(rng.random(len(S)) < 0.5)
        if idx.size < 2:
            continue
        val, G, ratio = rng.random(idx.size), float(len(S) / costs.verify[0]), [float(len(S)), float(costs.verify[0])]
        out.append((kit.keep_by_margin(view, 0, idx, val, costs, G).tolist(),
                    kit.keep_by_margin(view, 1, idx, val, costs, G, ratio).tolist(), ratio))
    return out


def test_uniform_depth_prices_one_row_for_a_batch_at_one_level_with_expected_tokens_bits():
    from specdepth.policies.kit.search import _one_row
    rng = np.random.default_rng(6)
    for _ in range(300):
        k, a = int(rng.integers(0, 16)), float(rng.uniform(-0.1, 1.1))
        f = rng.uniform(0.5, 1.3, 16) if rng.random() < 0.8 else None
        trials = float(rng.uniform(1, 500)) if f is None or rng.random() < 0.3 else None
        want = kit.expected_tokens(np.array([a]), np.arange(k + 1), f, trials)[:, 0]
        assert _one_row(a, k, f, trials).tolist() == want.tolist()


def test_fit_token_cap_and_draft_caps_bound_a_plan():
    view = make_view(4, remaining=[1, 3, 50, 50], cap=4 + 6)
    assert kit.draft_caps(view, 8).tolist() == [0, 2, 8, 8]
    capped = kit.fit_token_cap(np.array([0, 2, 8, 8]), view)
    assert int(capped.sum()) <= 6 and capped.tolist() == [0, 2, 2, 2]


def test_keep_by_margin_keeps_only_rows_worth_their_marginal_time():
    view = drafting_view(make_view(3), 1)
    costs = kit.Tables(np.full(3 * 4 + 1, 10e-3), np.r_[0.0, 1e-3, 1.5e-3, 2e-3])
    keep = kit.keep_by_margin(view, 0, np.arange(3), np.array([0.9, 0.05, 0.8]), costs, G=100.0)
    assert keep.tolist() == [True, False, True]


# ---- idle ------------------------------------------------------------------------------------------

def test_idle_replan_skips_windows_that_double_while_the_batch_is_unchanged():
    idle, view = kit.IdleReplan(4), SimpleNamespace(request_ids=np.array([1, 2]))
    skipped = []
    for _ in range(12):
        s = idle.skip(view)
        skipped.append(s)
        if not s:
            idle.record(view, False)
    assert skipped == [False, True, False, True, True, False, True, True, True, True, False, True]
    idle.record(view, True)
    assert not idle.skip(view)
    assert not kit.IdleReplan(0).skip(view)


def test_probe_gate_and_thin_evidence():
    assert kit.thin_evidence(10.0, 10.0, 8) and not kit.thin_evidence(10.0 + kit.PROBE_TOKENS, 10.0, 8)
    assert kit.may_probe(0, 0.0, 10.0, 8) and not kit.may_probe(kit.PROBE_ROUNDS, 0.0, 10.0, 8)


class DraftCost:
    """draft_forward(ctx, tokens): one forward's seconds, 1 ms per token fed."""

    def draft_forward(self, ctx, q):
        return np.array([1e-3 * float(np.sum(q))])


def test_catch_up_prices_the_skipped_tokens_and_pays_only_where_it_gains():
    view = SimpleNamespace(draft_lag=np.array([10, 2, 30]), context_lens=np.array([100, 100, 100]),
                           cost=DraftCost(), remaining=np.array([5, 50, 20]))
    rows = np.array([True, True, False])
    assert kit.catch_up_s(view, rows) == pytest.approx(1e-3 * (10 - 2))
    assert kit.catch_up_s(view, np.ones(3, bool), padded=True) == pytest.approx(1e-3 * 3 * (30 - 2))
    assert kit.catch_up_s(view, np.array([False, True, False])) == 0.0
    assert kit.catch_up_pays(view, rows, gain_s=1e-3, steps=10.0)
    assert not kit.catch_up_pays(view, rows, gain_s=1e-4, steps=10.0)
    late = np.array([True, False, True])
    assert kit.catch_up_rows(view, late, budget_s=30e-3).tolist() == [False, False, True]


# ---- depth -----------------------------------------------------------------------------------------

def test_cost_aware_depth_drafts_at_a_high_level_and_learns_a_low_one():
    d = kit.CostAwareDepth(drain=False, probe=0.0)
    view = make_view(8, cost=LinearCost(v0=10e-3, v1=1e-5, d0=1e-3), requests_left=5, prior=0.9)
    assert d.depth(view, 8) > 0
    for _ in range(50):   # every draft rejected
        d.observe(drafting_view(view, 1), np.zeros(8, np.int64))
    assert d.level(view)[0] < 0.1 and d.depth(view, 8) == 0


def drafting_view(view, k):
    from test_policies_zoo import drafting
    return drafting(view, np.full(view.batch_size, k))


def test_the_docs_example_policy_composes_the_kit_and_runs(tmp_path, monkeypatch):
    """docs/policies.md's composed policy (the block after `<!-- kit-example -->`) is under 30 lines of code and
    runs on the simulator: it drafts where drafts pay."""
    import re
    import sys
    from pathlib import Path

    from sdtest import run_sim
    text = (Path(__file__).resolve().parents[1] / "docs" / "policies.md").read_text()
    code = re.search(r"<!-- kit-example -->\n```python\n(.*?)```", text, re.S).group(1)
    assert len([ln for ln in code.splitlines() if ln.strip()]) < 30
    (tmp_path / "level_depth.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("level_depth", None)
    out = run_sim(tmp_path / "run", "policy=none", "~policy.depth", "policy._target_=level_depth.LevelDepth",
                  "acceptance=iid", "acceptance.alpha=0.8", "workload=closed", "workload.batch_size=8",
                  "workload.output_len=64", "engine.progress=false")
    assert out["draft_tokens"] > 0 and out["throughput_tok_s"] > 0


# ---- budget ----------------------------------------------------------------------------------------

def test_budget_gives_first_drafts_to_the_likeliest_rows_and_keeps_the_best_survivors():
    view = SimpleNamespace(verify_tokens_free=2, batch_size=4, acceptance=np.array([0.2, 0.9, 0.5, 0.9]),
                           drafted=np.array([1, 1, 0, 0]))
    depths = np.full(4, 3)
    assert kit.first_drafts(depths, view, 3).tolist() == [0, 1, 0, 1]
    assert kit.first_drafts(depths, view, 0).tolist() == [0, 0, 0, 0]
    view.verify_tokens_free = 4
    assert kit.first_drafts(depths, view, 3) is depths   # room for every row
    keep = np.array([True, True, True, False])
    view.verify_tokens_free = 4   # 2 drafted already: room for 2 more
    assert kit.best_survivors(keep, np.array([0.3, 0.8, 0.5, 0.9]), view).tolist() == [False, True, True, False]
    view.verify_tokens_free = 9
    assert kit.best_survivors(keep, np.zeros(4), view) is keep


# ---- options ---------------------------------------------------------------------------------------

def test_options_node_fills_defaults_and_names_an_unknown_key():
    from specdepth.errors import ConfigError
    from specdepth.policies.kit.options import node
    got = node({"b": 5}, "policy.level", {"a": 1, "b": 2})
    assert (got.a, got.b) == (1, 5) and node(None, "policy.level", {"a": 1}).a == 1
    with pytest.raises(ConfigError, match=r"policy.level.c: unknown key; valid keys: a, b"):
        node({"c": 1}, "policy.level", {"a": 1, "b": 2})
    with pytest.raises(ConfigError, match="policy.level must be a mapping"):
        node(3, "policy.level", {"a": 1})


@pytest.mark.parametrize("policy", ["confidence", "batch_scaled", "goodput"])
def test_compiled_and_numpy_forms_run_the_same(policy, monkeypatch):
    """End to end: a closed batch that drains (the drain's expected maxima), a steady run, and per-position keeps
    give the same steps and requests with the kit's compiled loops as with their numpy form."""
    from specdepth.policies.kit import search
    runs = _runs_both_ways(monkeypatch, search, policy,
                           [["workload.batch_size=40", "workload.output_len={dist: uniform, low: 8, high: 120}"],
                            STEADY_24])
    assert runs[0] == runs[1]


def test_the_search_blocks_name_a_length_mismatch():
    """One value per row: a shorter array is a one-line ValueError naming the block (the compiled loops would read
    past its end)."""
    costs = kit.Tables(np.full(9, 10e-3), np.r_[0.0, np.full(4, 1e-3)])
    with pytest.raises(ValueError, match="uniform_depth: ends"):
        kit.uniform_depth(np.full(4, 0.8), costs, 2, ends=np.array([1, 2]))
    with pytest.raises(ValueError, match="plan_by_position: tie"):
        kit.plan_by_position(np.full((4, 2), 0.5), costs, tie=np.array([1, 2]))
    view = drafting_view(make_view(4, remaining=np.array([9, 9, 9, 9])), 2)
    with pytest.raises(ValueError, match="keep_by_margin: 2 values for 3 rows"):
        kit.keep_by_margin(view, 0, np.array([0, 1, 2]), np.array([0.5, 0.4]), costs, 10.0)


def test_kernels_define_each_name_once():
    """A second top-level def of a name in the kernels file shadows the first for every kernel compiled after the
    module loads (numba resolves globals then), so a caller of the first gets the second."""
    import ast
    import collections
    from specdepth.policies.kit import kernels
    tree = ast.parse(open(kernels.__file__).read())
    names = collections.Counter(n.name for n in tree.body if isinstance(n, ast.FunctionDef))
    assert [name for name, count in names.items() if count > 1] == []
