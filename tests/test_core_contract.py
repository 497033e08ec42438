"""The policy protocol's validation, config errors, determinism and user policies."""
import json

import numpy as np
import pytest

from sdtest import RESULT_FILES, ROOT, cfg, cli, engine, result_files, run_sim
from specdepth import ConfigError, PolicyError
from specdepth.app import run

BROKEN = "policy._target_=custom_policies.Broken"


@pytest.mark.parametrize("answer,rule", [
    ("short", "shape"), ("float", "integer"), ("nan", "NaN"), ("negative", "negative"),
    ("too_deep", "engine.max_depth"), ("none", "shape"), ("bad_mask", "keep_drafting"), ("int_mask", "bool mask"),
])
def test_every_allocation_rule_raises_policy_error(tmp_path, answer, rule):
    c = cfg("policy=none", BROKEN, "~policy.depth", f"+policy.answer='{answer}'", "workload.batch_size=4")
    with pytest.raises(PolicyError) as e:
        run(c, tmp_path)
    assert "Broken" in str(e.value) and rule in str(e.value)
    assert result_files(tmp_path) == []


def test_hard_token_cap_raises_policy_error(tmp_path):
    c = cfg("policy=none", BROKEN, "~policy.depth", "+policy.answer=over_cap", "workload.batch_size=8",
            "engine.max_num_batched_tokens=64")
    with pytest.raises(PolicyError, match="max_num_batched_tokens=64"):
        run(c, tmp_path)


def test_list_answers_are_accepted(tmp_path):
    s = run(cfg("policy=none", BROKEN, "~policy.depth", "+policy.answer=list", "workload.batch_size=3",
                "workload.output_len=16"), tmp_path)
    assert s["draft_tokens"] > 0


def test_view_is_read_only(tmp_path):
    """Writing into the view's arrays fails, and the run stops with a PolicyError naming the policy and
    the hook, carrying the exception's own message."""
    with pytest.raises(PolicyError, match=r"policy Vandal: plan\(\) raised ValueError: .*read-only"):
        run(cfg("policy=none", "policy._target_=custom_policies.Vandal", "~policy.depth"), tmp_path)
    from specdepth.policy import StepView
    v = StepView(None, 8, 4, 64, None)
    for name in ("batch_size", "token_budget", "cost", "measured_draft_s", "anything"):
        with pytest.raises(AttributeError):
            setattr(v, name, 1)


def test_the_views_step_arrays_are_read_only_and_current():
    """view.depths and view.drafted: read-only views that show the step's arrays as they are now (the engine counts
    row_drafted in place), of the array the step holds now."""
    from test_policies_zoo import drafting, make_view
    v = drafting(make_view(3), [2, 0, 1])
    first = v.drafted
    v._s.row_drafted[0] += 5
    for a, want in ((v.drafted, [7, 0, 1]), (first, [7, 0, 1]), (v.depths, [2, 0, 1])):
        assert a.tolist() == want and not a.flags.writeable
        with pytest.raises(ValueError):
            a[0] = 1
    first.flags.writeable = True   # (a view a policy made writable is not handed out again)
    assert not v.drafted.flags.writeable
    v._s.row_drafted = np.zeros(3, np.int64)
    v._s.depths = None
    assert v.drafted.tolist() == [0, 0, 0] and v.depths is None


def test_ragged_depths_in_one_verify(tmp_path):
    s = run(cfg("policy=none", "policy._target_=custom_policies.Alternating", "policy.depth=3",
                "workload.batch_size=4", "workload.output_len=64", "acceptance=iid", "acceptance.alpha=0.8"), tmp_path)
    import csv
    first = next(csv.DictReader(open(tmp_path / "steps.csv")))
    assert (first["batch_size"], first["max_depth"], first["drafted"]) == ("4", "3", "6")  # depths 3,0,3,0
    assert int(first["verify_tokens"]) == 4 + 6
    assert s["policy"] == "alternating"


@pytest.mark.parametrize("override,key", [
    ("policy.depth=-1", "policy.depth"),
    ("acceptance.alpha=1.5", "acceptance.alpha"),
    ("acceptance.alpha=-0.1", "acceptance.alpha"),
    ("engine.token_budget=0", "engine.token_budget"),
    ("engine.token_budget=-5", "engine.token_budget"),
    ("workload.batch_size=0", "workload.batch_size"),
    ("workload.output_len=0", "workload.output_len"),
    ("workload.prompt_len=abc", "workload.prompt_len"),
    ("engine.max_depth=-2", "engine.max_depth"),
    ("hardware.mbu=0", "hardware.mbu"),
    ("cost.overhead_s=-1", "cost.overhead_s"),
    ("seed=-3", "seed"),
])
def test_bad_config_values_name_the_key(tmp_path, override, key):
    extra = ["policy=fixed", "acceptance=iid"]
    with pytest.raises(ConfigError) as e:
        run(cfg(*extra, override), tmp_path)
    assert str(e.value).startswith(key), str(e.value)
    assert result_files(tmp_path) == []


def test_cli_bad_value_exits_cleanly_and_writes_nothing(tmp_path):
    p = cli("acceptance=iid", "acceptance.alpha=1.5", cwd=tmp_path)
    assert p.returncode == 2
    assert "specdepth: error: acceptance.alpha must be <= 1" in p.stderr
    assert "Traceback" not in p.stderr
    assert result_files(tmp_path) == []


def test_cli_unknown_hardware_names_the_group(tmp_path):
    p = cli("hardware=tpu_v9", cwd=tmp_path)
    assert p.returncode != 0
    assert "hardware/tpu_v9" in p.stderr or "hardware" in p.stderr
    assert result_files(tmp_path) == []


def test_user_policy_from_the_command_line(tmp_path):
    p = cli("policy=none", "policy._target_=custom_policies.Alternating", "policy.depth=2",
            "workload.batch_size=4", "hydra.run.dir=run", cwd=tmp_path,
            env_extra={"PYTHONPATH": str(ROOT / "tests")})
    assert p.returncode == 0, p.stderr
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["policy"] == "alternating(depth=2)" and s["draft_tokens"] > 0
    assert "alternating(depth=2) on sim" in p.stdout
    assert all((tmp_path / "run" / f).is_file() for f in RESULT_FILES)


def test_same_seed_identical_summary(tmp_path):
    ov = ("policy=confidence", "workload=poisson", "workload.num_requests=40", "seed=7")
    run_sim(tmp_path / "a", *ov)
    run_sim(tmp_path / "b", *ov)
    run_sim(tmp_path / "c", *ov[:-1], "seed=8")
    a, b, c = ((tmp_path / x / "summary.json").read_text() for x in "abc")
    assert a == b
    assert a != c
    assert (tmp_path / "a" / "steps.csv").read_text() == (tmp_path / "b" / "steps.csv").read_text()


def test_summary_fields(tmp_path):
    s = run_sim(tmp_path, "policy=fixed", "workload.batch_size=8", "workload.output_len=64")
    for k in ("policy", "backend", "batch_size", "output_tokens", "steps", "time_s", "throughput_tok_s",
              "tokens_per_step", "acceptance_rate", "draft_tokens", "accepted_tokens", "verify_tokens",
              "per_position_acceptance", "tpot_p50_s", "tpot_p99_s", "ttft_p50_s", "e2e_p50_s", "e2e_p99_s",
              "target_flops", "draft_flops", "flops_per_token"):
        assert k in s, k
    assert s["output_tokens"] == 8 * 64
    assert s["acceptance_rate"] == pytest.approx(s["accepted_tokens"] / s["draft_tokens"])
    assert s["verify_tokens"] == s["draft_tokens"] + sum(
        int(r.split(",")[2]) for r in (tmp_path / "steps.csv").read_text().splitlines()[1:])
    assert s["backend"] == "sim" and s["policy"] == "fixed(4)"
    assert (tmp_path / "config.yaml").read_text().startswith("seed: 0")


def test_budget_auto_and_batch_scaled():
    e = engine("policy=batch_scaled")
    assert 100 < e.budget < 400
    e64 = engine("policy=batch_scaled", "engine.token_budget=64")
    assert e64.budget == 64
    capped = engine("policy=batch_scaled", "engine.token_budget=100000")
    assert capped.budget == 8192  # never above max_num_batched_tokens


def test_budget_aware_policies_stop_speculating_past_the_budget(tmp_path):
    """Past the ridge (~230 tokens < 300 sequences) drafting stops paying: the cost-aware policies draft only
    to probe their acceptance level (a step or two of one token per row) and where the batch thins at the end,
    and lose nothing to no speculation; at batch 1 they draft."""
    none = run_sim(tmp_path / "none", "policy=none", "workload.batch_size=300", "workload.output_len=16")
    for pol in ("batch_scaled", "confidence"):
        s = run_sim(tmp_path / pol, f"policy={pol}", "workload.batch_size=300", "workload.output_len=16")
        assert s["draft_tokens"] <= 3 * 300, pol
        assert s["throughput_tok_s"] >= 0.99 * none["throughput_tok_s"], pol
        s = run_sim(tmp_path / (pol + "1"), f"policy={pol}", "workload.batch_size=1", "workload.output_len=64")
        assert s["draft_tokens"] > 0, pol


def test_oracle_style_policy_refused_without_outcomes():
    from specdepth.engine import Engine, EngineConfig
    from specdepth.executor import Executor
    from specdepth.policies import FixedDepth

    class Peeker(FixedDepth):
        requires_oracle = True

    class NoOracle(Executor):
        name = "real"
        def prefill(self, r): return 0, 0, 0
        def draft(self, rows, p): pass
        def verify(self, d): pass
        def retire(self, k): pass

    with pytest.raises(ConfigError, match="oracle.*backend 'real'"):
        Engine(Peeker(), NoOracle(), None, EngineConfig(token_budget=8), [])


def test_python_m_is_the_same_app(tmp_path):
    import subprocess
    import sys
    p = subprocess.run([sys.executable, "-m", "specdepth", "policy=fixed", "workload.batch_size=2",
                        "workload.output_len=8", "hydra.run.dir=r"], cwd=tmp_path, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["output_tokens"] == 16
