"""The plug-ins of outside_plugins.py (written from docs/plugins.md alone) run through the app and the engine
API; the previous release's forms run with a DeprecationWarning naming the new form and give the same results;
a plug-in that breaks its protocol gets one error naming it, the hook and what was expected."""
from __future__ import annotations

import ast
import csv
import warnings
from pathlib import Path

import pytest

import outside_plugins as op
from sdtest import ROOT, cfg, cli, result_files
from specdepth.app import build, run
from specdepth.engine import Engine, EngineConfig
from specdepth.errors import PluginError, PolicyError
from specdepth.models import ModelArch
from specdepth.workload import Request

HERE = Path(__file__).resolve().parent
SMALL = ["engine.token_budget=32", "workload.batch_size=4", "workload.prompt_len=16", "workload.output_len=20",
         "engine.progress=false"]
POLICY = ["policy=none", "~policy.depth", "policy._target_=outside_plugins.SpreadBudget", "+policy.depth=3"]
COST = ["~cost", "+cost._target_=outside_plugins.LinearCost"]


def acceptance(cls: str, rate: float = 0.6) -> list[str]:
    return ["acceptance=iid", f"acceptance._target_=outside_plugins.{cls}", "~acceptance.alpha",
            f"+acceptance.rate={rate}"]


def backend(cls: str) -> list[str]:
    return ["~backend", f"+backend._target_=outside_plugins.{cls}"]


def steps(run_dir) -> list[dict]:
    with open(Path(run_dir) / "steps.csv") as f:
        return list(csv.DictReader(f))


def deprecations(fn):
    """fn()'s result and the messages of the DeprecationWarnings it raised."""
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out = fn()
    return out, [str(x.message) for x in w if issubclass(x.category, DeprecationWarning)]


def test_plugins_import_only_the_public_api():
    tree = ast.parse((HERE / "outside_plugins.py").read_text())
    modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    modules |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert modules <= {"__future__", "numpy", "specdepth", "specdepth.cost", "specdepth.acceptance",
                       "specdepth.executor"}, modules


def test_policy_cost_and_acceptance_model_through_the_app(tmp_path):
    s = run(cfg(*POLICY, *COST, *acceptance("Positional"), *SMALL), tmp_path)
    assert (s["policy"], s["cost_model"], s["acceptance"]) == ("spread_budget(depth=3)", "LinearCost", "Positional")
    assert s["output_tokens"] == 4 * 20 and s["accepted_tokens"] > 0
    rows = steps(tmp_path)
    assert max(int(r["max_depth"]) for r in rows) == 3
    # the clock charged LinearCost: the first verify, 4 rows of 16 cached tokens each, each row's drafts + 1
    first = rows[0]
    want = 5e-3 + 2e-5 * (4 + int(first["drafted"])) + 1e-8 * 4 * 16
    assert float(first["verify_s"]) == pytest.approx(want, rel=1e-12)
    # the acceptance model decided: its pattern accepts about `rate` of the drafts
    assert 0.3 < s["acceptance_rate"] < 0.9


def test_keep_drafting_stops_rows(tmp_path):
    """Every confidence (0.6) is below stop_below: each row stops after its first draft of a step."""
    run(cfg(*POLICY, "+policy.stop_below=0.65", *COST, *acceptance("Positional", 0.6), *SMALL), tmp_path)
    rows = steps(tmp_path)
    assert all(int(r["drafted"]) <= int(r["batch_size"]) for r in rows)
    assert any(int(r["max_depth"]) == 3 for r in rows)


def test_acceptance_model_in_the_old_form_still_runs(tmp_path):
    new = run(cfg(*POLICY, *COST, *acceptance("Positional"), *SMALL), tmp_path / "new")
    old, msgs = deprecations(lambda: run(cfg(*POLICY, *COST, *acceptance("OldPositional"), *SMALL), tmp_path / "old"))
    assert len(msgs) == 1 and "OldPositional" in msgs[0] and "admit(request_ids, new)" in msgs[0]
    assert (tmp_path / "new" / "steps.csv").read_bytes() == (tmp_path / "old" / "steps.csv").read_bytes()
    names = ("acceptance", "acceptance_model")
    assert {k: v for k, v in new.items() if k not in names} == {k: v for k, v in old.items() if k not in names}


def test_executor_through_the_app_and_in_the_old_form(tmp_path):
    new = run(cfg("policy=fixed", "policy.depth=3", *backend("ToyExecutor"), *SMALL), tmp_path / "new")
    old, msgs = deprecations(lambda: run(cfg("policy=fixed", "policy.depth=3", *backend("OldToyExecutor"), *SMALL),
                                         tmp_path / "old"))
    assert new["backend"] == "toy" and new["output_tokens"] == 80
    assert sorted(m.split(": ")[1].split(" is ")[0] for m in msgs) == [
        "begin_step(depths)", "check(requests)", "prefill(requests)", "retire(keep)"]
    assert all("OldToyExecutor" in m and "implement" in m for m in msgs)
    assert (tmp_path / "new" / "steps.csv").read_bytes() == (tmp_path / "old" / "steps.csv").read_bytes()


def test_all_four_through_the_engine_api():
    arch = ModelArch(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=64)
    requests = [Request(request_id=i, arrival_s=0.01 * i, prompt_len=8 + i, output_len=12 + 3 * i) for i in range(6)]
    ex = op.ToyExecutor(period=3)
    engine = Engine(op.SpreadBudget(depth=2), ex, op.LinearCost(arch), EngineConfig(max_depth=4, progress=False),
                    requests)
    res = engine.run()
    out = {r[0]: r[2] for r in res.requests}   # request_id -> output_len, as requests.csv
    assert out == {r.request_id: r.output_len for r in requests}
    assert sum(ex.log) == len(requests)   # its retire hook saw every request leave
    assert sum(r[5] for r in res.steps) > 0 and max(r[3] for r in res.steps) <= 2   # accepted; max_depth


BROKEN = [   # (overrides, error, what the message must say)
    (["policy=none", "~policy.depth", "policy._target_=outside_plugins.NoViewPolicy"], PolicyError,
     ["policy NoViewPolicy", "plan()", "expected plan(view)"]),
    (["~cost", "+cost._target_=outside_plugins.PairTimeCost"], PluginError,
     ["cost model PairTimeCost", "target_forward(ctx, q)", "expected (seconds, flops)"]),
    (acceptance("OneArraySample"), PluginError,
     ["acceptance model OneArraySample", "sample(n, k) returned ndarray", "expected (confidence float"]),
    (acceptance("ShortCommit"), PluginError,
     ["acceptance model ShortCommit", "commit(drafted, accepted) raised TypeError",
      "expected commit(drafted, accepted)"]),
    (backend("TwoTupleVerify"), PluginError,
     ["executor TwoTupleVerify", "verify(drafted) returned a tuple of 2", "expected (accepted"]),
    (backend("OverAccepting"), PluginError, ["executor OverAccepting", "verify(drafted)", "outside 0..drafted"]),
]


@pytest.mark.parametrize("overrides, error, says", BROKEN, ids=lambda x: None)
def test_a_broken_plugin_is_named_with_its_hook(overrides, error, says):
    with pytest.raises(error) as e:
        build(cfg("policy=fixed", "policy.depth=2", *overrides, *SMALL))["engine"].run()
    for part in says:
        assert part in str(e.value)


def test_a_broken_plugin_is_one_line_on_the_command_line(tmp_path):
    p = cli("policy=fixed", "policy.depth=2", *acceptance("ShortCommit"), *SMALL, cwd=tmp_path,
            env_extra={"PYTHONPATH": f"{HERE}:{ROOT / 'tests'}"})
    assert p.returncode != 0
    assert "acceptance model ShortCommit: commit(drafted, accepted) raised TypeError" in p.stderr
    assert "Traceback" not in p.stderr + p.stdout and "unexpected error" not in p.stderr
    assert result_files(tmp_path) == []


def test_the_commands_of_docs_plugins_run(tmp_path):
    """docs/plugins.md's commands, as written, from the repository's root (small workload, another run dir)."""
    import re
    import shlex
    text = (ROOT / "docs" / "plugins.md").read_text()
    lines = [ln for b in re.findall(r"```bash\n(.*?)```", text, re.S) for ln in b.splitlines() if "specdepth" in ln]
    assert len(lines) == 4
    for i, line in enumerate(lines):
        words = shlex.split(line)
        assert words[0] == "PYTHONPATH=tests/plugins" and words[1] == "specdepth"
        p = cli(*words[2:], "workload.batch_size=2", "workload.output_len=8", "engine.progress=false",
                f"hydra.run.dir={tmp_path / str(i)}", cwd=ROOT, env_extra={"PYTHONPATH": str(HERE)})
        assert p.returncode == 0, p.stderr[-2000:]
        assert (tmp_path / str(i) / "summary.json").is_file()


def test_builtin_plugins_are_called_directly():
    """specdepth's own executor and acceptance model run unwrapped (their hot paths pay no checks); a foreign
    one runs through its checked adapter."""
    from specdepth.acceptance import IID
    from specdepth.sim import SimExecutor
    engine = build(cfg("policy=fixed", "acceptance=iid", *SMALL))["engine"]
    assert type(engine.executor) is SimExecutor and type(engine.executor.outcomes.model) is IID
    engine = build(cfg("policy=fixed", *acceptance("Positional"), *backend("ToyExecutor"), *SMALL))["engine"]
    assert type(engine.executor).__name__ == "_Executor" and engine.executor.name == "toy"
