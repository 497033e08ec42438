"""The simulator against closed forms: Leviathan et al. 2023 and the roofline's shape."""
import numpy as np
import pytest

from sdtest import run_sim
from specdepth.cost import CostModel, RooflineCost
from specdepth.app import make
from sdtest import cfg


def leviathan_tokens(a, k):
    return (1 - a ** (k + 1)) / (1 - a)


def leviathan_speedup(a, k, c):
    return leviathan_tokens(a, k) / (k * c + 1)


@pytest.mark.parametrize("alpha,k", [(0.6, 2), (0.8, 4), (0.9, 6)])
def test_leviathan_tokens_and_speedup(tmp_path, alpha, k):
    c = 0.05
    common = ["cost=constant", f"cost.draft_ratio={c}", "acceptance=iid", f"acceptance.alpha={alpha}",
              "workload.batch_size=1", "workload.output_len=40000", "workload.prompt_len=16",
              "engine.token_budget=64"]
    spec = run_sim(tmp_path / "k", *common, "policy=fixed", f"policy.depth={k}")
    base = run_sim(tmp_path / "0", *common, "policy=none")
    assert spec["tokens_per_step"] == pytest.approx(leviathan_tokens(alpha, k), rel=0.01)
    assert base["tokens_per_step"] == 1.0
    speedup = spec["throughput_tok_s"] / base["throughput_tok_s"]
    assert speedup == pytest.approx(leviathan_speedup(alpha, k, c), rel=0.01)
    # per-position acceptance of i.i.d. drafts is alpha at every position
    assert np.allclose(spec["per_position_acceptance"], alpha, atol=0.02)


def _roofline(hardware="h100_sxm", model="llama3_8b"):
    c = cfg(f"hardware={hardware}", f"model={model}")
    pair, hw = make(c, "model"), make(c, "hardware")
    return make(c, "cost", target=pair.target_arch, draft=pair.draft_arch, hardware=hw)


def test_roofline_breadth_equals_depth():
    cost = _roofline()
    assert isinstance(cost, RooflineCost)
    t = lambda ctx, q: cost.target_forward(np.array(ctx), np.array(q))[0]
    one = t([512], [1])
    assert t([512, 512], [1, 1]) == pytest.approx(one, rel=0.05)        # 2 x 1 ~ 1 x 1
    assert t([16] * 5, [1] * 5) == pytest.approx(t([16], [5]), rel=0.01)  # 5 x 1 == 1 x 5
    assert t([0] * 5, [1] * 5) == pytest.approx(t([0], [5]), rel=1e-9)


def test_roofline_linear_past_ridge():
    cost = _roofline()
    t = lambda n: cost.target_forward(np.zeros(n, dtype=np.int64))[0]
    ridge = cost.ridge_tokens(0.05)
    assert 100 < ridge < 400          # h100: 989 TFLOP/s x 0.6 / (3.35 TB/s x 0.8) ~ 221 FLOP/B
    assert t(ridge // 4) == pytest.approx(t(1), rel=0.06)      # flat below the ridge
    assert t(8192) / t(4096) == pytest.approx(2.0, rel=0.02)    # linear far past it
    assert t(16384) / t(8192) == pytest.approx(2.0, rel=0.01)


def test_ridge_moves_with_hardware():
    h100, a100 = _roofline("h100_sxm").ridge_tokens(), _roofline("a100_80g").ridge_tokens()
    h200 = _roofline("h200").ridge_tokens()
    assert h200 < h100          # more bandwidth, same compute: ridge moves left
    assert a100 < h100          # 312/2.039 = 153 < 989/3.35 = 295


def test_speculation_costs_flops(tmp_path):
    common = ["acceptance=iid", "acceptance.alpha=0.7", "workload.batch_size=8", "workload.output_len=256"]
    spec = run_sim(tmp_path / "k", *common, "policy=fixed", "policy.depth=4")
    base = run_sim(tmp_path / "0", *common, "policy=none")
    assert spec["flops_per_token"] > base["flops_per_token"]
    assert spec["steps"] < base["steps"]
    assert spec["draft_flops"] > 0 and base["draft_flops"] > 0  # the draft's prefill is paid in both


@pytest.mark.parametrize("hw,model,extra", [("h100_sxm", "llama3_8b", []), ("a100_80g", "qwen3_30b_a3b", []),
                                            ("h100_sxm", "llama3_70b", ["parallel.tensor=4"])])
def test_step_time_tables_equal_the_per_shape_calls(compose, hw, model, extra):
    """CostModel.verify_times / draft_times (the policies' step-time tables in one call) give what
    verify_time / draft_time give shape by shape: dense, MoE and tensor-parallel models."""
    from specdepth.app import build
    cost = build(compose(f"hardware={hw}", f"model={model}", *extra))["engine"].cost
    rng = np.random.default_rng(0)
    for n in (1, 3, 64, 300):
        ctx = rng.integers(0, 5000, n).astype(np.int64)
        xs = np.arange(0, 4 * n + 1, max(1, n // 3)).astype(float)
        want = [cost.verify_time(ctx, np.full(n, x / n)) for x in xs]
        np.testing.assert_allclose(cost.verify_times(ctx, xs), want, rtol=1e-12)
        ms = np.arange(0, n + 1, max(1, n // 5)).astype(float)
        want = [cost.draft_time(np.full(int(m), ctx.mean())) if m else 0.0 for m in ms]
        np.testing.assert_allclose(cost.draft_times(float(ctx.mean()), ms), want, rtol=1e-12)
        # the roofline's compiled tables are the per-point Python roofline's, to the bit
        assert cost.verify_times(ctx, xs).tolist() == _per_point(cost, CostModel.verify_times, ctx, xs)
        assert cost.draft_times(77.0, ms).tolist() == _per_point(cost, CostModel.draft_times, 77.0, ms)
        # draft_forward_times (a tree level's table) is draft_forward per token count, to the bit
        for c in (np.full(n, float(ctx.mean())), ctx.astype(float)):
            qs = np.arange(0, 20)
            want = [cost.draft_forward(c, np.full(n, q, np.int64))[0] for q in qs]
            assert cost.draft_forward_times(c, qs).tolist() == want
            assert cost.verify_times(c, xs).tolist() == _per_point(cost, CostModel.verify_times, c, xs)
            # tree_tables (TreePrice's two tables in one call) is those calls' values, to the bit
            v, d = cost.tree_tables(c, 12, 19)
            assert v.tolist() == cost.verify_times(c, np.arange(13, dtype=float) * n).tolist()
            assert d.tolist() == [0.0] + want[1:20]   # draft[0]: no forward
            base = CostModel.tree_tables(cost, c, 12, 19)
            assert base[0].tolist() == v.tolist() and base[1].tolist() == d.tolist()
        # draft_level_times (a draft tree's level forwards) is draft_forward per level, to the bit
        q = rng.integers(0, 4, (n, 6)) * (rng.random((n, 6)) < 0.7)
        q[:, 0] = 1
        want = [cost.draft_forward(ctx[q[:, lv] != 0] + lv, q[q[:, lv] != 0, lv])[0] for lv in range(6)]
        assert cost.draft_level_times(ctx, q).tolist() == want


def _per_point(cost, method, *args) -> list:
    """`method` with the base class's per-point `_time` loop (CostModel._times), as a list."""
    class PerPoint(type(cost)):
        _times = CostModel._times
    obj = object.__new__(PerPoint)
    obj.__dict__.update(cost.__dict__)
    return method(obj, *args).tolist()
