"""backend=hf timing mode (backend.acceptance=simulated): real models and forwards, accept/reject from the run's
acceptance model. Its accepted counts follow the acceptance model exactly (the simulator's, for the same seed),
its results say they are not lossless, and it writes no generations."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from conftest import compose  # noqa: E402
from specdepth.app import format_summary, run  # noqa: E402
from specdepth.errors import ConfigError, PolicyError  # noqa: E402
from specdepth.report import render  # noqa: E402

SMALL = ("model=tiny_pair", "workload.batch_size=3", "workload.prompt_len=16", "workload.output_len=20",
         "engine.progress=false")
SAME = ("steps", "tokens_per_step", "acceptance_rate", "draft_tokens", "accepted_tokens", "verify_tokens",
        "per_position_acceptance", "output_tokens")


def _steps(run_dir) -> list[tuple]:
    """(batch, drafted, accepted, emitted) per step of steps.csv."""
    lines = (Path(run_dir) / "steps.csv").read_text().splitlines()
    cols = lines[0].split(",")
    idx = [cols.index(c) for c in ("batch_size", "drafted", "accepted", "emitted")]
    return [tuple(int(float(row.split(",")[i])) for i in idx) for row in lines[1:]]


@pytest.mark.parametrize("policy,acceptance", [
    (("policy=fixed", "policy.depth=3"), ("acceptance=iid", "acceptance.alpha=0.7")),
    # decisions from the confidences it is shown (cost_aware=false: its cost-aware cap would follow the clock,
    # measured wall time on hf against model time in the simulator)
    (("policy=confidence", "policy.cost_aware=false"), ("acceptance=confidence",)),
    (("policy=oracle",), ("acceptance=beta",)),               # timing mode can reveal its outcomes
])
def test_accepted_counts_follow_the_acceptance_model(tmp_path, policy, acceptance):
    common = (*SMALL, *policy, *acceptance, "seed=5", "engine.record_trace=true")
    real = run(compose("backend=hf", "backend.acceptance=simulated", *common), tmp_path / "hf")
    sim = run(compose("backend=sim", *common), tmp_path / "sim")
    assert real["draft_tokens"] > 0 and real["accepted_tokens"] > 0
    for k in SAME:
        assert real[k] == sim[k], k
    assert _steps(tmp_path / "hf") == _steps(tmp_path / "sim")   # step by step, not only in total
    # the confidences the policies saw and the outcomes, token by token: the acceptance model's
    trace = (tmp_path / "hf" / "acceptance_trace.jsonl").read_text()
    assert trace and trace == (tmp_path / "sim" / "acceptance_trace.jsonl").read_text()


def test_timing_mode_results_say_not_lossless(tmp_path):
    ov = (*SMALL, "policy=fixed", "policy.depth=2", "acceptance=iid", "acceptance.alpha=0.9")
    s = run(compose("backend=hf", "backend.acceptance=simulated", *ov), tmp_path / "t")
    assert s["lossless"] is False and s["backend"] == "hf"
    assert not (tmp_path / "t" / "generations.jsonl").exists()
    assert json.loads((tmp_path / "t" / "summary.json").read_text())["lossless"] is False
    assert "TIMING MODE" in format_summary(s)
    assert s["time_s"] > 0 and s["verify_time_s"] > 0 and s["draft_time_s"] > 0   # real forwards, wall clock
    lossless = run(compose("backend=hf", *ov), tmp_path / "l")
    assert lossless["lossless"] is True and (tmp_path / "l" / "generations.jsonl").is_file()
    assert "TIMING MODE" not in format_summary(lossless)
    assert run(compose("backend=sim", *ov), tmp_path / "s")["lossless"] is False
    assert "TIMING MODE: 1 of them" in render(tmp_path)   # specdepth-report marks the timing-mode run


def test_sampled_timing_mode_and_random_weights(tmp_path):
    """decode.temperature > 0 and model.init=random (the pair's config.json only) run in timing mode, with
    the acceptance model's counts."""
    common = (*SMALL, "policy=fixed", "policy.depth=4", "acceptance=iid", "acceptance.alpha=0.5", "seed=2")
    real = run(compose("backend=hf", "backend.acceptance=simulated", "model.init=random", "decode.temperature=0.8",
                       *common), tmp_path / "hf")
    sim = run(compose("backend=sim", *common), tmp_path / "sim")
    for k in SAME:
        assert real[k] == sim[k], k


def test_random_weights_are_lossless_too(tmp_path):
    """model.init=random with lossless verification: the output is the random target's own greedy output."""
    import torch

    from specdepth.hf_runner import random_causal_lm
    cfg = compose("backend=hf", "model.init=random", *SMALL, "policy=fixed", "policy.depth=3",
                  "workload.batch_size=1")
    run(cfg, tmp_path)
    gen = json.loads((tmp_path / "generations.jsonl").read_text().splitlines()[0])
    target = random_causal_lm(cfg.model.target, "model.target", torch.float32, "sdpa", torch.device("cpu"), 0)
    with torch.inference_mode():
        out = target.generate(torch.tensor([gen["prompt_ids"]]), max_new_tokens=20, do_sample=False,
                              eos_token_id=None, pad_token_id=0)
    assert out[0, len(gen["prompt_ids"]):].tolist() == gen["output_ids"]


def test_bad_acceptance_mode(tmp_path):
    with pytest.raises(ConfigError, match="backend.acceptance"):
        run(compose("backend=hf", "backend.acceptance=sometimes", *SMALL), tmp_path)
    assert not (tmp_path / "summary.json").exists()


WARM_CHECK = r"""
import sys
from hydra import compose, initialize_config_dir
from specdepth import _kernels as K
from specdepth.app import CONF_DIR, build
from specdepth.clock import Clock
COST = ("ragged_sums", "int_sum", "position_counts", "table_lookup", "roofline_forward", "roofline_positions",
        "roofline_verify", "roofline_verify_table", "roofline_draft_table", "roofline_flat_verify",
        "roofline_step_tables")
seen = {}
start = Clock.start
def snap(self):
    seen["start"] = {f: len(getattr(K, f).signatures) for f in COST}
    return start(self)
Clock.start = snap
with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
    cfg = compose("config", overrides=["experiment=real_pareto", "pol=" + sys.argv[1], "workload.batch_size=2",
                                       "workload.output_len=12", "engine.progress=false"])
build(cfg)["engine"].run()
end = {f: len(getattr(K, f).signatures) for f in COST}
print({f: (seen["start"][f], end[f]) for f in COST})
assert end == seen["start"], "compiled kernels loaded inside the timed run"
"""


@pytest.mark.parametrize("pol", ["goodput", "batch_scaled"])
def test_cost_kernels_load_before_the_clock_starts_on_backend_hf(pol):
    """On a measured clock a process's first call of a compiled kernel loads it (~5-7 ms): the engine calls view.cost's
    methods before the clock starts (read-only and writable arrays: numba's signatures differ), so a policy that
    prices its steps pays no kernel load inside its timed steps, which `none` never pays. A fresh process, so that
    nothing is loaded before."""
    import subprocess
    import sys
    from sdtest import ROOT
    r = subprocess.run([sys.executable, "-c", WARM_CHECK, pol], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]


def test_cost_warm_up_never_fails_a_run():
    """The warm-up only loads kernels: a user's cost model without the methods it calls does not fail there (it
    fails, with its own error, where a policy calls one)."""
    from specdepth.app import build
    engine = build(compose("engine.progress=false"))["engine"]
    engine.cost = object()
    engine._warm_cost()   # no AttributeError


def test_gc_frozen_inside_a_measured_run_only(tmp_path):
    """engine.gc_freeze (default on): on a measured clock the objects alive before the run (models, configs) sit in
    the collector's permanent generation while the steps run, and go back after it (also after a failed run); off,
    or on the simulator's model clock, nothing is frozen."""
    import gc

    from specdepth.app import build
    from specdepth.policies import FixedDepth

    class Probe(FixedDepth):
        fail = False

        def plan(self, view):
            seen.append(gc.get_freeze_count())
            if self.fail and len(seen) == 3:
                raise ZeroDivisionError
            return super().plan(view)

    def frozen(*over, fail=False):
        seen.clear()
        engine = build(compose(*SMALL, "policy=fixed", "policy.depth=1", *over))["engine"]
        engine.policy = Probe(depth=1)
        engine.policy.fail = fail
        if fail:
            with pytest.raises(PolicyError, match="ZeroDivisionError"):
                engine.run()
        else:
            engine.run()
        assert gc.get_freeze_count() == 0   # unfrozen after the run
        return min(seen) > 0

    seen: list[int] = []
    assert frozen("backend=hf")
    assert frozen("backend=hf", fail=True)
    assert not frozen("backend=hf", "engine.gc_freeze=false")
    assert not frozen("backend=sim")
    gc.freeze()   # the caller's own freeze: left as it is, not undone
    try:
        held = gc.get_freeze_count()
        seen.clear()
        build(compose(*SMALL, "backend=hf", "policy=fixed", "policy.depth=1"))["engine"].run()
        assert gc.get_freeze_count() > held // 2   # still frozen (less the frozen objects that died meanwhile)
    finally:
        gc.unfreeze()
    with pytest.raises(ConfigError, match="engine.gc_freeze"):
        build(compose(*SMALL, "engine.gc_freeze=sometimes"))
