"""Studies 6 and 7 of issue 7 (experiments/fidelity, experiments/real_pareto): the experiment configs compose,
and both analysis scripts run on a tiny fake sweep (no models, no real runs)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from conftest import compose
from specdepth.engine import STEP_COLUMNS
from specdepth.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def _compose_with_hydra(overrides):
    return compose(overrides, hydra_cfg=True)


def _module(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem + "_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("exp,backend", [("real_pareto", "specdepth.hf.HFExecutor"),
                                         ("fidelity_sim", "specdepth.sim.SimExecutor"),
                                         ("fidelity_timing", "specdepth.hf.HFExecutor"),
                                         ("fidelity_timing_sim", "specdepth.sim.SimExecutor")])
def test_configs_compose(exp, backend):
    cfg = _compose_with_hydra([f"experiment={exp}", "pol=goodput", "workload.batch_size=4", "rep=1"])
    assert cfg.backend._target_ == backend
    assert cfg.cost._target_ == "specdepth.cost.TableCost"
    assert cfg.policy._target_ == "specdepth.policies.goodput.Goodput"
    assert cfg.workload.batch_size == 4 and cfg.model.name == "tiny_pair"
    params = cfg.hydra.sweeper.params
    assert [int(b) for b in params["workload.batch_size"].split(",")] == [1, 2, 4, 8, 16, 32]
    pols = params.pol.split(",")
    assert "oracle" not in pols and {"none", "fixed4", "goodput", "bandit"} <= set(pols)
    if exp == "real_pareto":
        for p in pols:   # every policy preset resolves to a class
            c = compose([f"experiment={exp}", f"pol={p}"])
            assert c.policy._target_.startswith("specdepth.policies.")
    if exp == "fidelity_sim":
        assert cfg.acceptance._target_ == "specdepth.acceptance.Trace"
        assert cfg.acceptance.path == "outputs/fidelity_traces/r1/b4/goodput.jsonl"
    if exp.startswith("fidelity_timing"):   # the same acceptance model on both sides, at a level set per sweep
        c = compose([f"experiment={exp}", "acceptance.alpha=0.85"])
        assert c.acceptance._target_ == "specdepth.acceptance.IID" and c.acceptance.alpha == 0.85
        if exp == "fidelity_timing":
            assert c.backend.acceptance == "simulated"
        else:
            assert c.backend.pad_ragged and c.backend.draft_catch_up and c.engine.charge_policy_time
    if exp == "fidelity_timing_sim":   # the simulator presets build (no key of the real backend leaks in)
        from specdepth.app import build
        parts = build(compose([f"experiment={exp}", "pol=fixed2", "workload.batch_size=2"]))
        assert type(parts["executor"]).__name__ == "SimExecutor"
    if exp == "real_pareto":
        assert cfg.backend.num_threads == 1   # the real runs' one torch thread (top-level `threads`)


def _fake_run(d: Path, policy: str, batch: int, tput: float, tps: float, drafted: int, trace=None):
    d.mkdir(parents=True)
    s = dict(policy=policy, backend="x", batch_size=batch, requests=batch, output_tokens=32 * batch, steps=10,
             time_s=32 * batch / tput, throughput_tok_s=tput, tokens_per_step=tps, draft_tokens=drafted,
             prefill_time_s=0.1, draft_time_s=0.2, verify_time_s=0.5, overhead_time_s=0.01)
    (d / "summary.json").write_text(json.dumps(s))
    if trace is not None:
        (d / "acceptance_trace.jsonl").write_text("".join(json.dumps(r) + "\n" for r in trace))


def test_analyze_on_fake_sweeps(tmp_path):
    real, sim = tmp_path / "real", tmp_path / "sim"
    trace = [{"request_id": 0, "confidence": [0.9, 0.2], "accepted": [1, 0]}]
    for rep in (0, 1):
        for b in (1, 4):
            for k, pol in enumerate(("none", "fixed1", "fixed2", "goodput", "bandit")):
                t = 100.0 * b * (1 + 0.1 * k) * (1 + 0.02 * rep)
                _fake_run(real / f"r{rep}" / f"b{b}" / pol, pol, b, t, 1 + 0.3 * k, 5 * k,
                          trace=[] if pol == "none" else trace)
                _fake_run(sim / f"r{rep}" / f"b{b}" / pol, pol, b, t * 1.04, 1 + 0.3 * k, 5 * k)
    fid = _module(ROOT / "experiments" / "fidelity" / "analyze.py")
    out = tmp_path / "fid"
    readme = tmp_path / "README.md"
    readme.write_text("x\n<!-- results:begin -->\nold\n<!-- results:end -->\ny\n")
    fid.main([str(real), str(sim), "--out", str(out), "--readme", str(readme)])
    text = (out / "results.md").read_text()
    assert "| sim | 20 | 4.0% | 4.0% | 0.0% | 0.0% | 0.0% | 0.0% |" in text
    assert "old" not in readme.read_text() and "4.0%" in readme.read_text()
    # restated goal: per cell, every sim run 4 % above its real run (spread 2 %): 4.0 % everywhere
    assert ("10 of 10 cells within max(10 %, the cell's own spread) (met); mean error 4.0% (goal <= 5 %: met)"
            in text)
    for f in ("sim_vs_real.png", "error_by_batch.png", "time_split.png", "cells.csv"):
        assert (out / f).stat().st_size > 0

    prep = _module(ROOT / "experiments" / "fidelity" / "prepare.py")
    made = prep.prepare(real, tmp_path / "traces")
    assert len(made) == 20
    assert Path(made[("r0", "b1", "none")]).parent.name == "fixed1"      # empty trace: borrowed
    assert (tmp_path / "traces" / "r1" / "b4" / "goodput.jsonl").read_text().strip()

    rp = _module(ROOT / "experiments" / "real_pareto" / "analyze.py")
    out2 = tmp_path / "rp"
    rp.main([str(real), "--out", str(out2)])
    text = (out2 / "results.md").read_text()
    assert "best adaptive policy over all batch sizes = **bandit**" in text
    assert "goal (>= -3%) **met**" in text
    cells = rp.load(real)
    assert cells[4]["goodput"]["reps"][1] == pytest.approx(cells[4]["goodput"]["reps"][0] * 1.02)
    assert (out2 / "real_pareto_e2e.png").stat().st_size > 0
    # --table: every figure of results.md goes into the single table of sweeps; rendered back, the same text
    rp.main([str(real), "--out", str(out2), "--table", str(tmp_path / "v.csv"), "--variant", "fake"])
    vs = _module(ROOT / "experiments" / "real_pareto" / "variants.py")
    assert vs.render(vs.of_variant(vs.read(tmp_path / "v.csv"), "fake")) == (out2 / "results.md").read_text()


def test_goal_tolerance_is_the_cells_own_spread():
    fid = _module(ROOT / "experiments" / "fidelity" / "analyze.py")
    rows = [dict(batch=1, pol="none", rep=r, real_tput=t, sim_tput=140.0) for r, t in enumerate((100.0, 140.0))]
    rows += [dict(batch=2, pol="none", rep=r, real_tput=t, sim_tput=120.0) for r, t in enumerate((100.0, 102.0))]
    g = {c["batch"]: c for c in fid.goal_cells(rows)}
    assert g[1]["spread"] == pytest.approx(40 / 120) and g[1]["err"] == pytest.approx(140 / 120 - 1)
    assert g[1]["within"]                                  # 16.7 % error, inside its own 33 % spread
    assert not g[2]["within"]                              # 18.8 % error, spread 2 %: the 10 % floor applies
    assert "1 of 2 cells within" in fid.goal_text(rows, "x") and "16.7% (33.3%) |" in fid.goal_text(rows, "x")


def test_sim_overheads_are_charged_per_step_and_position():
    """backend.step_overhead_s / position_overhead_s (SimExecutor): 0 by default (unchanged results); else the
    clock grows by exactly step x steps + position x draft positions."""
    from specdepth.app import build

    def run(*extra):
        cfg = compose(["cost=constant", "acceptance=iid", "policy=fixed", "policy.depth=3",
                           "workload.batch_size=4", "workload.output_len=20", "engine.progress=false", *extra])
        res = build(cfg)["engine"].run()
        return res, sum(r[-3] for r in res.steps)   # step_s

    base, t0 = run()
    same, t1 = run("backend.step_overhead_s=0", "backend.position_overhead_s=0")
    assert t1 == t0 and [r[:10] for r in same.steps] == [r[:10] for r in base.steps]
    oh, t2 = run("backend.step_overhead_s=0.001", "backend.position_overhead_s=0.0005")
    positions = sum(r[3] for r in oh.steps)   # max_depth column: draft positions of the step
    assert len(oh.steps) == len(base.steps)
    assert t2 == pytest.approx(t0 + 0.001 * len(oh.steps) + 0.0005 * positions)


def _table_csv(path, scale=1.0):
    """A profile CSV where a forward costs 1 ms + 0.5 ms per token of query (x scale), context-free."""
    lines = ["model,batch,query,context,seconds"]
    for w, f in (("target", 1.0), ("draft", 0.25)):
        for b in (1, 2, 4, 8):
            for q in (1, 2, 4, 8, 16):
                for c in (0, 512):
                    lines.append(f"{w},{b},{q},{c},{scale * f * (1e-3 + 0.5e-3 * b * q)!r}")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_sim_pad_ragged_charges_the_padded_forward(tmp_path):
    """backend.pad_ragged: the verify of a ragged plan (depth 6 in rows 0 and 2, 0 in rows 1 and 3) is charged as
    backend=hf runs it, every row padded to the largest query (4 x 7 tokens), not as the packed 16 tokens;
    decisions and FLOPs are unchanged."""
    from specdepth.app import build
    from specdepth.cost import TableCost

    csv_path = _table_csv(tmp_path / "p.csv")

    def run(*extra):
        cfg = compose(["cost=table", f"cost.path={csv_path}", "acceptance=iid", "acceptance.alpha=0.0",
                           "workload.batch_size=4", "workload.prompt_len=8", "workload.output_len=3",
                           "engine.progress=false", "policy=fixed", "policy._target_=custom_policies.Alternating",
                           "policy.depth=6", *extra])
        parts = build(cfg)
        return parts["engine"].run(), parts["cost"]

    packed, cost = run()
    padded, _ = run("backend.pad_ragged=true")
    assert isinstance(cost, TableCost)
    assert [r[4] for r in packed.steps] == [r[4] for r in padded.steps]      # drafted per step
    assert [r[-2:] for r in packed.steps] == [r[-2:] for r in padded.steps]  # FLOPs
    ctx = np.full(4, 9)
    q_packed = np.array([7, 1, 7, 1])
    v_packed = cost.target_forward(ctx, q_packed)[0]
    v_padded = cost.target_forward(ctx, np.full(4, 7))[0]
    assert v_padded > 1.5 * v_packed
    verify_col = 11   # verify_s
    assert packed.steps[0][verify_col] == pytest.approx(v_packed)
    assert padded.steps[0][verify_col] == pytest.approx(v_padded)


def test_prefill_groups_are_the_cheapest_split_of_the_prompts_by_length():
    """executor.prefill_groups: against every split of the length-sorted prompts into runs (brute force), the
    groups it returns cost the least; they partition the prompts; equal lengths stay one group, and so does a
    price whose fixed part outweighs any padding."""
    import itertools

    from specdepth.executor import prefill_groups

    def cost(groups, plen, price):
        return sum(price(len(g), int(plen[g].max())) for g in groups)

    rng = np.random.default_rng(0)
    for trial in range(60):
        m = int(rng.integers(2, 8))
        plen = rng.integers(1, 5, m) * int(rng.choice([10, 100, 1000]))
        fixed = float(rng.choice([0.0, 50.0, 5e3]))

        def price(rows, tokens, fixed=fixed):
            return fixed + rows * tokens + 0.01 * rows * tokens ** 2   # a padded forward: rows x the longest

        groups = prefill_groups(plen, price)
        assert sorted(np.concatenate(groups).tolist()) == list(range(m))
        assert all((np.diff(g) > 0).all() for g in groups)
        order = np.argsort(plen, kind="stable")
        best = min(cost([order[a:b] for a, b in zip((0,) + cuts, cuts + (m,))], plen, price)
                   for r in range(m) for cuts in itertools.combinations(range(1, m), r))
        assert cost(groups, plen, price) == pytest.approx(best), (plen, fixed)
    assert len(prefill_groups(np.array([7, 7, 7]), lambda r, t: r * t)) == 1
    assert len(prefill_groups(np.array([10, 1000]), lambda r, t: 1e9 + r * t)) == 1
    assert [g.tolist() for g in prefill_groups(np.array([1000, 10, 1000, 12]), lambda r, t: r * t)] \
        == [[1], [3], [0, 2]]
    many = np.arange(1, 301) * 10   # 300 lengths: the cuts on a grid of 32, still a partition, cheaper than one
    g = prefill_groups(many, lambda r, t: 5.0 + r * t)
    assert 1 < len(g) <= 32 and sorted(np.concatenate(g).tolist()) == list(range(300))
    assert sum(5.0 + len(x) * many[x].max() for x in g) < 5.0 + 300 * 3000


def test_sim_padded_prefill_groups_prompts_of_similar_length(tmp_path):
    """backend.group_prefill (with pad_ragged): 4 prompts of 64 and 4,096 tokens admitted together prefill as two
    padded forwards (the roofline prices that far below one padded to 4,096), each charged by the clock, the
    second group with its two forwards' position_overhead_s; group_prefill=false charges one padded forward.
    Decisions and FLOPs are unchanged, and a packed engine (pad_ragged=false) ignores the switch."""
    from specdepth.app import build

    wl = tmp_path / "w.jsonl"
    wl.write_text("".join(json.dumps({"prompt_len": p, "output_len": 12}) + "\n" for p in (64, 4096, 64, 4096)))

    def run(*extra):
        cfg = compose(["workload=file", f"workload.path={wl}", "acceptance=iid", "acceptance.alpha=0.7",
                       "policy=fixed", "policy.depth=2", "engine.progress=false",
                       "backend.position_overhead_s=0.001", *extra])
        parts = build(cfg)
        return parts["engine"].run(), parts["cost"]

    prefill = STEP_COLUMNS.index("prefill_s")
    grouped, cost = run("backend.pad_ragged=true")
    single, _ = run("backend.pad_ragged=true", "backend.group_prefill=false")
    z2, z4 = np.zeros(2, np.int64), np.zeros(4, np.int64)

    def fwd(rows, q):
        return cost.target_forward(rows, q)[0] + cost.draft_forward(rows, q)[0]

    two = fwd(z2, np.full(2, 64)) + fwd(z2, np.full(2, 4096)) + 2 * 0.001
    one = fwd(z4, np.full(4, 4096))
    assert grouped.steps[0][prefill] == pytest.approx(two) and single.steps[0][prefill] == pytest.approx(one)
    assert two < 0.8 * one
    cols = [STEP_COLUMNS.index(c) for c in ("batch_size", "drafted", "accepted", "target_flops", "draft_flops")]
    assert [[r[c] for c in cols] for r in grouped.steps] == [[r[c] for c in cols] for r in single.steps]
    packed, _ = run()
    packed_off, _ = run("backend.group_prefill=false")
    assert [r[1:] for r in packed.steps] == [r[1:] for r in packed_off.steps]
    assert packed.steps[0][prefill] == pytest.approx(fwd(z4, np.array([64, 4096, 64, 4096])))


def test_sim_clock_profile_moves_the_clock_not_the_decisions(tmp_path):
    """backend.clock_profile: the clock charges another profile (here every forward 1.3x slower) while the
    policies keep seeing cost.path: same steps and decisions, time x 1.3."""
    from specdepth.app import build

    a = _table_csv(tmp_path / "a.csv")
    b = _table_csv(tmp_path / "b.csv", scale=1.3)

    def run(*extra):
        cfg = compose(["cost=table", f"cost.path={a}", "acceptance=iid", "acceptance.alpha=0.7", "policy=goodput",
                           "workload.batch_size=4", "workload.prompt_len=8", "workload.output_len=24",
                           "engine.progress=false", *extra])
        return build(cfg)["engine"].run()

    base = run()
    slow = run(f"backend.clock_profile={b}")
    assert [r[2:8] for r in base.steps] == [r[2:8] for r in slow.steps]
    t0 = sum(r[-3] for r in base.steps)
    t1 = sum(r[-3] for r in slow.steps)
    assert t1 == pytest.approx(1.3 * t0, rel=1e-9)
    with pytest.raises(ConfigError, match="backend.clock_profile: profile CSV not found"):
        run(f"backend.clock_profile={tmp_path / 'missing.csv'}")


def test_sim_draft_catch_up(tmp_path):
    """backend.draft_catch_up: the draft's first forward of a step feeds the tokens its cache lacks, 2 after a
    fully accepted step; with every draft accepted that costs (steps - 1) x (draft of 2 tokens - draft of 1)
    more than without; with every draft rejected nothing changes."""
    from specdepth.app import build

    csv_path = _table_csv(tmp_path / "p.csv")

    def run(alpha, *extra):
        cfg = compose(["cost=table", f"cost.path={csv_path}", "acceptance=iid", f"acceptance.alpha={alpha}",
                           "policy=fixed", "policy.depth=3", "workload.batch_size=4", "workload.prompt_len=8",
                           "workload.output_len=17", "engine.progress=false", *extra])
        parts = build(cfg)
        res = parts["engine"].run()
        return res, sum(r[10] for r in res.steps), parts["cost"]   # draft_s

    off, d0, cost = run(1.0)
    on, d1, _ = run(1.0, "backend.draft_catch_up=true")
    assert [r[2:10] for r in on.steps] == [r[2:10] for r in off.steps] and len(on.steps) == 4
    ctx = np.full(4, 9)
    delta = cost.draft_forward(ctx, np.full(4, 2))[0] - cost.draft_forward(ctx)[0]
    assert delta > 0 and d1 - d0 == pytest.approx((len(on.steps) - 1) * delta)
    _, r0, _ = run(0.0)
    _, r1, _ = run(0.0, "backend.draft_catch_up=true")
    assert r1 == pytest.approx(r0)


def test_simulator_charges_policy_time_when_asked():
    """engine.charge_policy_time: the policy's own measured time goes into the simulated clock and the
    steps' overhead_s (as a real engine pays it); off (the default) the simulation is deterministic."""
    import time

    from sdtest import engine
    from specdepth.policies import FixedDepth

    class Slow(FixedDepth):
        def plan(self, view):
            time.sleep(0.002)
            return super().plan(view)

    runs = {}
    for charge in (False, True):
        eng = engine("policy=fixed", "workload.batch_size=2", "workload.output_len=20",
                     f"engine.charge_policy_time={str(charge).lower()}")
        eng.policy = Slow(4)
        runs[charge] = eng.run()
    cols = {c: i for i, c in enumerate(("step", "time_s", "batch_size", "max_depth", "drafted", "accepted",
                                        "emitted", "verify_tokens", "admitted", "finished", "draft_s",
                                        "verify_s", "prefill_s", "overhead_s", "step_s"))}
    off, on = runs[False].steps, runs[True].steps
    assert [s[cols["emitted"]] for s in off] == [s[cols["emitted"]] for s in on]   # same decisions
    assert all(s[cols["overhead_s"]] == 0.0 for s in off)
    assert all(s[cols["overhead_s"]] >= 0.0019 for s in on)
    for s in on:
        assert s[cols["step_s"]] == pytest.approx(s[cols["draft_s"]] + s[cols["verify_s"]] + s[cols["prefill_s"]]
                                                  + s[cols["overhead_s"]], rel=1e-9)


def test_calibrate_recovers_fixed_costs_from_one_repetition(tmp_path):
    """calibrate.py fits real - simulated (draft + overhead) seconds = a x steps + b x draft positions on the
    runs of one repetition only."""
    real, sim = tmp_path / "real", tmp_path / "sim"
    for rep in (0, 1):
        for b in (1, 4):
            for k, pol in enumerate(("none", "fixed2", "fixed4")):
                depths = [2 * k] * (10 + k)                        # steps.csv: max_depth per step
                a_s, b_s = (0.0007, 0.0004) if rep == 0 else (0.5, 0.5)   # rep 1 must be ignored
                extra = a_s * len(depths) + b_s * sum(depths)
                for root, add in ((real, extra), (sim, 0.0)):
                    d = root / f"r{rep}" / f"b{b}" / pol
                    _fake_run(d, pol, b, 100.0, 1.0, sum(depths))
                    s = json.loads((d / "summary.json").read_text())
                    s["draft_time_s"] = 0.2 + 0.01 * k + add
                    (d / "summary.json").write_text(json.dumps(s))
                    (d / "steps.csv").write_text("max_depth\n" + "".join(f"{x}\n" for x in depths))
    cal = _module(ROOT / "experiments" / "fidelity" / "calibrate.py")
    a, b, n = cal.fit(real, sim, "0")
    assert n == 6 and a == pytest.approx(0.0007, rel=1e-6) and b == pytest.approx(0.0004, rel=1e-6)


def _with_draft_next(src, path, factor):
    """src's profile plus draft_next rows (query 1 only, as specdepth-profile interleave=true writes them):
    factor x the draft rows at query 1."""
    lines = src.read_text().splitlines()
    extra = [ln.replace("draft,", "draft_next,", 1) for ln in lines[1:] if ln.startswith("draft,")]
    extra = [f"{','.join(p[:4])},{float(p[4]) * factor!r}" for p in (ln.split(",") for ln in extra) if p[2] == "1"]
    path.write_text("\n".join(lines + extra) + "\n")
    return path


@pytest.mark.parametrize("extra", [(), ("engine.record_trace=true",),
                                   ("backend.draft_catch_up=true", "backend.pad_ragged=true")])
def test_sim_clock_profile_draft_next_rows_charge_the_later_positions(tmp_path, extra):
    """A clock profile with draft_next rows (specdepth-profile interleave=true): the step's first draft forward is
    charged from the draft rows, positions >= 1 from the draft_next rows; draft_next = draft charges what a
    profile without them does. Per position (record_trace: engine.draft) and in one block (draft_block), with
    and without the catch-up and padding. Decisions unchanged."""
    from specdepth.app import build
    from specdepth.cost import TableCost
    from specdepth.models import ModelArch

    a = _table_csv(tmp_path / "a.csv")
    same = _with_draft_next(a, tmp_path / "same.csv", 1.0)
    half = _with_draft_next(a, tmp_path / "half.csv", 0.5)
    arch = ModelArch(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=64)
    assert TableCost(arch, path=str(half)).has_draft_next and not TableCost(arch, path=str(a)).has_draft_next
    t = TableCost(arch, path=str(half))
    assert t.next_draft_forward(np.full(4, 9))[0] == pytest.approx(0.5 * t.draft_forward(np.full(4, 9))[0])

    def run(clock):
        cfg = compose(["cost=table", f"cost.path={a}", "acceptance=iid", "acceptance.alpha=0.0", "policy=fixed",
                       "policy.depth=3", "workload.batch_size=4", "workload.prompt_len=8", "workload.output_len=9",
                       "engine.progress=false", f"backend.clock_profile={clock}", *extra])
        res = build(cfg)["engine"].run()
        return res, [r[10] for r in res.steps]   # draft_s per step

    base, d_base = run(a)
    _, d_same = run(same)
    halved, d_half = run(half)
    assert [r[2:10] for r in halved.steps] == [r[2:10] for r in base.steps]
    assert d_same == pytest.approx(d_base, rel=1e-12)
    # context-free table, every row drafts 3 positions (all rejected: no catch-up beyond 1 token):
    # 3 x d per step without draft_next rows, d + 2 x d/2 with rows at half the draft's time
    assert all(h == pytest.approx(b * 2 / 3, rel=1e-9) for h, b in zip(d_half, d_base))


def test_calibrate_phases_include_the_verify_host_work(tmp_path):
    """calibrate.py --phases draft,overhead,verify: the residual of every phase named is summed (timing mode:
    the verify phase's host work per step); the default reads draft and overhead only, as before."""
    real, sim = tmp_path / "real", tmp_path / "sim"
    for b in (1, 4):
        for k, pol in enumerate(("none", "fixed2", "fixed4")):
            depths = [2 * k] * (10 + k)
            for root, add_d, add_v in ((real, 0.0004 * sum(depths), 0.0003 * len(depths)), (sim, 0.0, 0.0)):
                d = root / "r0" / f"b{b}" / pol
                _fake_run(d, pol, b, 100.0, 1.0, sum(depths))
                s = json.loads((d / "summary.json").read_text())
                s["draft_time_s"] = 0.2 + 0.01 * k + add_d
                s["verify_time_s"] = 0.5 + add_v
                (d / "summary.json").write_text(json.dumps(s))
                (d / "steps.csv").write_text("max_depth\n" + "".join(f"{x}\n" for x in depths))
    cal = _module(ROOT / "experiments" / "fidelity" / "calibrate.py")
    a, b, _ = cal.fit(real, sim, "0", ("draft", "overhead", "verify"))
    assert a == pytest.approx(0.0003, rel=1e-6) and b == pytest.approx(0.0004, rel=1e-6)
    a0, b0, _ = cal.fit(real, sim, "0")
    assert a0 == pytest.approx(0.0, abs=1e-9) and b0 == pytest.approx(0.0004, rel=1e-6)


def test_profile_interleave_adds_draft_next_rows(tiny_pair, tmp_path):
    """specdepth-profile interleave=true: the same target and draft points (the draft timed after a target
    forward) plus one draft_next row per batch x context at query 1, with the draft's arch; cost=table reads them
    (has_draft_next). Without it, no draft_next rows."""
    from transformers import AutoModelForCausalLM

    from specdepth import profile as P
    from specdepth.cost import TableCost
    from specdepth.models import ModelArch

    loaded = [(w, AutoModelForCausalLM.from_pretrained(str(tiny_pair[w])).eval()) for w in ("target", "draft")]
    grid = ([1, 2], [1, 3], [0, 16])
    rows = P.measure(loaded, grid, warmup=0, repeats=1, interleave=True, arch={"target": "T", "draft": "D"})
    plain = P.measure(loaded, grid, warmup=0, repeats=1)
    keys = {r[:4] for r in rows}
    assert {r[:4] for r in plain} <= keys and not any(r[0] == "draft_next" for r in plain)
    assert keys - {r[:4] for r in plain} == {("draft_next", b, 1, c) for b in (1, 2) for c in (0, 16)}
    assert all(r[8] == "D" for r in rows if r[0] == "draft_next") and all(r[4] > 0 for r in rows)
    P.write_profile([r[:8] + ("",) for r in rows], tmp_path / "p.csv")
    arch = ModelArch.from_hf_config(tiny_pair["target"], "model.target_arch")
    assert TableCost(arch, path=str(tmp_path / "p.csv")).has_draft_next


def test_real_pareto_splits_a_policys_decode_time_against_nones():
    """analyze.py's `where`: a policy's decode seconds beyond none's, from steps.csv sums, split into its drafting
    steps and its idle steps (each against none's seconds per emitted token), and the idle steps' time outside the
    forwards; the parts add up to the total."""
    rp = _module(ROOT / "experiments" / "real_pareto" / "analyze.py")
    none = dict(draft_s=0.0, draft_steps=0, draft_emitted=0, idle_s=1.0, idle_steps=10, emitted=20, idle_over=0.1,
                over=0.1)
    good = dict(draft_s=0.33, draft_steps=2, draft_emitted=6, idle_s=0.9, idle_steps=7, emitted=20, idle_over=0.2,
                over=0.25)
    cells = {2: {"none": {"by_rep": {0: {"steps": none}}}, "goodput": {"by_rep": {0: {"steps": good}}}}}
    text = rp.where(cells)
    # none: 0.05 s a token. Drafting: 0.33 - 6 x 0.05 = 0.03; idle: 0.9 - 14 x 0.05 = 0.2, of it outside the
    # forwards 0.2 - 14 x 0.005 = 0.13; total 1.23 / 1.0 - 1
    assert "| 2 | 2.0 | +3.0% | +20.0% | +13.0% | +23.0% |" in text
    assert rp.where({2: {"none": {"by_rep": {0: {"steps": None}}}, "goodput": {"by_rep": {0: {"steps": good}}}}}) \
        is None   # no steps.csv: no table


def test_interleaved_alternates_the_order_and_pairs_within_a_repetition():
    il = _module(ROOT / "experiments" / "real_pareto" / "interleaved.py")
    v = ["none", "fixed1", "goodput"]
    assert il.schedule(v, 0, "alternate") == [(0, "none"), (1, "fixed1"), (2, "goodput")]
    assert il.schedule(v, 1, "alternate") == [(2, "goodput"), (1, "fixed1"), (0, "none")]
    assert il.schedule(v, 1, "forward") == il.schedule(v, 0, "forward")
    got = il.paired({"none": [1.0, 2.0], "fixed1": [1.2, 1.5], "goodput": [1.1, 2.2]}, ["none", "fixed1"])
    assert list(got) == ["goodput"]
    mean, lo, hi = got["goodput"]   # per repetition: 1.0 / 1.1 and 1.5 / 2.2 (the best baseline of each)
    assert (lo, hi) == (pytest.approx(1.5 / 2.2), pytest.approx(1.0 / 1.1))
    assert mean == pytest.approx((1.0 / 1.1 + 1.5 / 2.2) / 2)
    with pytest.raises(SystemExit, match="--baselines"):
        il.main(["--baselines", "fixed3", "none", "goodput"])


def test_interleaved_judges_against_the_baseline_best_by_its_mean_with_a_t_interval():
    from scipy import stats
    il = _module(ROOT / "experiments" / "real_pareto" / "interleaved.py")
    for df in (1, 2, 5, 30):
        assert il.t975(df) == pytest.approx(stats.t.ppf(0.975, df), abs=1e-3)
    assert il.t975(31) >= stats.t.ppf(0.975, 31) and il.t975(500) >= stats.t.ppf(0.975, 500)   # conservative
    # fixed1 is best in rep 0 only, by luck; none has the smaller mean (1.5 s against 1.6 s), so none is the
    # baseline of every repetition: 1.0 / 1.1 and 2.0 / 2.2, both 0.909 (the per-repetition best gives 1.5 / 2.2)
    decode = {"none": [1.0, 2.0], "fixed1": [0.9, 2.3], "goodput": [1.1, 2.2]}
    best, of_means, mean, ci, lo, hi = il.paired_by_mean(decode, ["none", "fixed1"])["goodput"]
    assert best == "none" and of_means == pytest.approx(1.5 / 1.65)
    assert mean == lo == hi == pytest.approx(1 / 1.1) and ci == (pytest.approx(1 / 1.1), pytest.approx(1 / 1.1))
    r = [1.0 / 1.1, 2.0 / 2.4, 1.5 / 1.4]   # the interval is the textbook one
    got = il.paired_by_mean({"none": [1.0, 2.0, 1.5], "goodput": [1.1, 2.4, 1.4]}, ["none"])["goodput"]
    half = stats.t.ppf(0.975, 2) * stats.tstd(r) / 3 ** 0.5
    assert got[3] == (pytest.approx(sum(r) / 3 - half, abs=1e-3), pytest.approx(sum(r) / 3 + half, abs=1e-3))
    assert il.paired_by_mean({"none": [1.0], "goodput": [1.1]}, ["none"])["goodput"][3] is None
