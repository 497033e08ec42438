"""Results say what ran (issue 13, class 2), result files hold plain numbers with the user's umask, and a
sweep with a failing job finishes, records the failure and says so (exit code, failures file, report)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from sdtest import ROOT
from test_bad_inputs import _main

FID = ROOT / "experiments" / "fidelity"


def _summary(d: Path) -> dict:
    return json.loads((d / "summary.json").read_text())


def _run(tmp_path, *args, name="run") -> dict:
    code, out = _main(["engine.progress=false", *args, f"hydra.run.dir={tmp_path / name}"], tmp_path)
    assert code == 0, out[-3000:]
    return _summary(tmp_path / name)


# ---- the batch that ran ----------------------------------------------------------------------------------
@pytest.mark.parametrize("cap,expect", [("engine.max_batch_size=4", 4), ("engine.max_num_batched_tokens=6", 6)])
def test_capped_batch_is_recorded_and_warned(tmp_path, cap, expect):
    s = _run(tmp_path, "policy=none", "workload.batch_size=20", "workload.output_len=8", cap)
    assert s["batch_size"] == 20                       # what was asked for
    assert s["max_running"] == expect                  # what ran
    assert 1 <= s["mean_running"] <= expect
    assert any(cap.split("=")[0] in w for w in s["warnings"])
    steps = np.genfromtxt(tmp_path / "run" / "steps.csv", delimiter=",", names=True)
    assert s["max_running"] == int(steps["batch_size"].max())
    assert s["mean_running"] == pytest.approx(float(steps["batch_size"].mean()))


def test_uncapped_batch_has_no_warning(tmp_path):
    s = _run(tmp_path, "policy=none", "workload.batch_size=6", "workload.output_len=8")
    assert s["max_running"] == 6 and s["warnings"] == []


# ---- numerical trouble is part of the results ---------------------------------------------------------------
OVERFLOWING = ("policy=none", "~policy.depth", "policy._target_=custom_policies.Overflowing",
               "workload.batch_size=3", "workload.output_len=8")


def test_runtime_warnings_of_a_run_are_recorded_in_its_summary_every_time(tmp_path):
    """A policy whose plan() overflows in exp every step: the run completes, and summary.json's `warnings` says
    which warning, where and how many times (once per plan() call, i.e. per step). Run twice in this process: the
    second run records it too (Python by itself shows a warning once per place and process)."""
    import warnings
    for name in ("one", "two"):
        with warnings.catch_warnings():
            warnings.simplefilter("default")   # the interpreter's own default, whatever pytest set
            s = _run(tmp_path, *OVERFLOWING, name=name)
        steps = sum(1 for _ in open(tmp_path / name / "steps.csv")) - 1
        assert s["steps"] == steps and steps > 1
        assert s["warnings"] == [f"RuntimeWarning at custom_policies.py:{_line('np.exp(np.full')}: overflow "
                                 f"encountered in exp ({steps} times)"], (name, s["warnings"])


def test_runtime_warnings_made_errors_still_fail_the_run(tmp_path):
    """-W error::RuntimeWarning is the user's: the recording does not override it, the run fails cleanly,
    naming the policy and the warning, and leaves no result."""
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        code, out = _main(["engine.progress=false", *OVERFLOWING, f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert code == 2 and "raised RuntimeWarning: overflow encountered in exp" in out, out[-3000:]
    assert not (tmp_path / "run" / "summary.json").exists()


def _line(text: str) -> int:
    """The line of tests/custom_policies.py that holds `text`."""
    lines = (Path(__file__).parent / "custom_policies.py").read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


# ---- depth against the engine's cap ------------------------------------------------------------------------
def test_depth_at_the_cap_runs_and_the_label_is_what_ran(tmp_path):
    s = _run(tmp_path, "policy=fixed", "policy.depth=2", "engine.max_depth=2", "workload.output_len=16")
    assert s["policy"] == "fixed(2)"
    steps = np.genfromtxt(tmp_path / "run" / "steps.csv", delimiter=",", names=True)
    assert int(steps["max_depth"].max()) == 2


@pytest.mark.parametrize("policy", ["fixed", "disable_by_batch", "batch_scaled", "confidence", "heuristic", "ema",
                                    "goodput", "oracle", "bandit", "batch_table"])
def test_every_builtin_policy_declares_its_depth_bound(policy):
    from sdtest import cfg
    from specdepth.app import make
    p = make(cfg(f"policy={policy}"), "policy")
    param, depth = p.depth_bound()
    assert 1 <= depth <= 16 and param


# ---- local checkpoints ------------------------------------------------------------------------------------
def test_local_checkpoint_takes_its_architecture_and_name(tmp_path, tiny_pair):
    from specdepth.models import ModelArch
    ov = [f"model.target={tiny_pair['target']}", f"model.draft={tiny_pair['draft']}", "policy=none",
          "workload.batch_size=1", "workload.output_len=8", "workload.prompt_len=8"]
    s = _run(tmp_path, *ov)                                      # default model group: llama3_8b
    arch = ModelArch.from_hf_config(tiny_pair["target"], "t")
    assert s["model"] == "target"                               # the checkpoint dir, not llama3_8b
    # no speculation, prompt as long as the output: a few x 2 x params FLOPs per output token (prefill of
    # target and draft included), not an 8B model's ~1e10
    assert 2 * arch.matmul_params < s["flops_per_token"] < 5 * 2 * arch.matmul_params
    tiny = s["flops_per_token"]
    s = _run(tmp_path, *ov, "model.name=mine", name="named")
    assert s["model"] == "mine"
    s = _run(tmp_path, *ov, "model.target_arch.layers=40", name="explicit")   # explicit numbers are kept
    assert s["flops_per_token"] > 10 * tiny   # 40 layers instead of 2


# ---- cost=table profiles name their model -------------------------------------------------------------------
def test_profile_arch_column_accepts_its_model_and_refuses_another(tmp_path):
    from specdepth.cost import TableCost
    from specdepth.errors import ConfigError
    from specdepth.models import ModelArch
    a = ModelArch(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=64, dtype="float32")
    b = ModelArch(layers=3, hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=64, dtype="float32")
    lines = ["model,batch,query,context,seconds,device,dtype,name,arch"]
    lines += [f"target,{bb},{q},0,{0.01 * bb * q},cpu,float32,a,{a.signature}" for bb in (1, 2) for q in (1, 2)]
    p = tmp_path / "p.csv"
    p.write_text("\n".join(lines) + "\n")
    assert TableCost(a, a, path=str(p)).device == "cpu"
    with pytest.raises(ConfigError, match="profiled for another model"):
        TableCost(b, b, path=str(p))


# ---- backend=hf is labelled with its own machine ----------------------------------------------------------
def test_hf_label_and_budget_come_from_the_machine(tmp_path):
    pytest.importorskip("transformers")
    from transformers import AutoModelForCausalLM  # noqa: F401
    base = ["backend=hf", "model=tiny_pair", "model.device=cpu", "backend.num_threads=1", "workload.batch_size=2",
            "workload.prompt_len=8", "workload.output_len=6", "policy=fixed", "policy.depth=2"]
    s = _run(tmp_path, *base)
    assert s["hardware"] == "cpu"                                 # not h100_sxm
    assert s["token_budget_source"].startswith("none:") and "roofline(h100_sxm)" in s["token_budget_source"]
    assert s["token_budget"] == 8192                              # engine.max_num_batched_tokens: no budget
    s = _run(tmp_path, *base, "cost=table", f"cost.path={FID / 'profile.csv'}", name="table")
    assert s["hardware"] == "cpu" and s["token_budget_source"].startswith("ridge of the cost model (table(")
    s = _run(tmp_path, *base, "engine.token_budget=24", name="explicit")
    assert s["token_budget"] == 24 and s["token_budget_source"] == "engine.token_budget"


def test_sim_on_a_profile_is_labelled_with_the_profiled_device(tmp_path):
    s = _run(tmp_path, "model=tiny_pair", "cost=table", f"cost.path={FID / 'profile.csv'}", "policy=none",
             "workload.batch_size=2", "workload.output_len=8")
    assert s["hardware"] == "cpu" and s["cost_model"].startswith("table(")


# ---- result files: plain numbers, the user's umask ---------------------------------------------------------
def test_every_result_file_of_a_table_run_reads_back_as_numbers(tmp_path):
    pd = pytest.importorskip("pandas")
    _run(tmp_path, "model=tiny_pair", "cost=table", f"cost.path={FID / 'profile.csv'}",
         f"backend.clock_profile={FID / 'clock_profile.csv'}", "backend.pad_ragged=true", "policy=fixed",
         "policy.depth=2", "workload.batch_size=3", "workload.output_len=12", "engine.record_trace=true")
    d = tmp_path / "run"
    for name in ("steps.csv", "requests.csv"):
        df = pd.read_csv(d / name)
        assert len(df) > 0
        bad = {c: str(t) for c, t in df.dtypes.items() if not pd.api.types.is_numeric_dtype(t)}
        assert not bad, (name, bad)
    s = json.loads((d / "summary.json").read_text(), parse_constant=lambda c: pytest.fail(f"non-JSON {c}"))
    for k, v in s.items():
        assert not isinstance(v, str) or k in {"policy", "backend", "model", "hardware", "cost", "acceptance",
                                               "workload", "cost_model", "token_budget_source", "clock_profile",
                                               "clock_model", "acceptance_model", "batch_limited_by"}, (k, v)
    tr = pd.read_json(d / "acceptance_trace.jsonl", lines=True)
    assert pd.api.types.is_integer_dtype(tr["request_id"])
    assert all(isinstance(x, float) for row in tr["confidence"] for x in row)
    assert "np." not in "".join(p.read_text() for p in d.iterdir() if p.is_file())


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_result_files_follow_the_umask(tmp_path, umask, mode):
    from specdepth.results import atomic_write
    old = os.umask(umask)
    try:
        atomic_write(tmp_path / "f.txt", "x")
    finally:
        os.umask(old)
    assert (tmp_path / "f.txt").stat().st_mode & 0o777 == mode


def test_atomic_open_and_atomic_savefig_leave_the_old_file_whole_when_the_write_fails(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from specdepth.results import atomic_open, atomic_savefig
    table = tmp_path / "t.csv"
    with atomic_open(table) as f:
        f.write("a,b\r\n1,2\n")
    assert table.read_bytes() == b"a,b\r\n1,2\n"   # as written: no newline translation (csv's own terminators)
    with pytest.raises(RuntimeError, match="stop"):
        with atomic_open(table) as f:
            f.write("half a ta")
            raise RuntimeError("stop")
    assert table.read_bytes() == b"a,b\r\n1,2\n"
    fig, ax = plt.subplots(figsize=(2, 2))
    ax.plot([0, 1])
    png = tmp_path / "f.png"
    atomic_savefig(fig, png, dpi=20)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError):   # a format matplotlib does not know: nothing is written
        atomic_savefig(fig, tmp_path / "f.nosuchformat", dpi=20)
    plt.close(fig)
    assert sorted(x.name for x in tmp_path.iterdir()) == ["f.png", "t.csv"]   # and no temporary file is left


# files experiment scripts may write directly: (script, the line's text)
_DIRECT_WRITES = {
    # runs on a GPU machine where specdepth may not be installed (its docstring): plain open()
    ("roofline/cuda_roofline.py", 'with open(out / "cuda_roofline.csv", "w", newline="") as f:'),
    ("roofline/cuda_roofline.py", "fig.savefig(path, dpi=100)"),
    # the training log, streamed line by line while training runs: not a result file
    ("tiny_pair/train.py", 'self.f = open(path, "w", buffering=1)'),
    # the pair's prompt set, written with the model directory that save_pretrained writes file by file
    ("tiny_pair/train.py",
     'Dataset.from_list(prompts).to_json(str(out / "prompts.jsonl"), lines=True, orient="records")'),
}


def test_experiment_scripts_write_their_files_atomically():
    """Every table, figure and JSON an experiment script writes goes through specdepth.results (atomic_write,
    atomic_open, atomic_savefig), so an analysis stopped halfway leaves the old file or the whole new one (the
    guide: results are written atomically), except the few writes listed in _DIRECT_WRITES, with their reasons."""
    import re
    direct = re.compile(r"\.write_(text|bytes)\(|(?<!atomic_)savefig\(|\bopen\([^)]*[\"']w|\.to_(csv|json)\(")
    found = set()
    for path in sorted((ROOT / "experiments").rglob("*.py")):
        for line in path.read_text().splitlines():
            if direct.search(line) and not line.lstrip().startswith("#"):
                found.add((path.relative_to(ROOT / "experiments").as_posix(), line.strip()))
    assert found == _DIRECT_WRITES, sorted(found ^ _DIRECT_WRITES)


# ---- sweeps finish; failures are recorded and counted --------------------------------------------------------
def test_a_failed_job_is_recorded_and_the_sweep_goes_on(tmp_path):
    from specdepth.report import main as report_main, render
    sweep = tmp_path / "sw"
    args = ["--multirun", "policy=fixed", "engine.max_depth=2,8,3", "workload.batch_size=2", "workload.output_len=8",
            "engine.progress=false", f"hydra.sweep.dir={sweep}"]
    code, out = _main(args, tmp_path)
    assert code == 1, out[-3000:]
    assert "2 run(s) of the sweep failed" in out and "Traceback" not in out
    fails = [json.loads(x) for x in (sweep / "failures.jsonl").read_text().splitlines()]
    assert len(fails) == 2 and all("engine.max_depth" in f["error"] for f in fails)
    for f in fails:
        err = Path(f["run_dir"]) / "error.txt"
        assert "policy.depth=4" in err.read_text() and not (Path(f["run_dir"]) / "summary.json").exists()
    done = list(sweep.rglob("summary.json"))
    assert len(done) == 1 and _summary(done[0].parent)["policy"] == "fixed(4)"
    text = render(sweep)
    assert "FAILED: 2 runs" in text
    # a corrupt summary.json is reported as corrupt, not as missing
    done[0].write_text('{"policy": "fixed(4)", "throughput')
    text = render(sweep)
    assert "CORRUPT: 1 runs" in text and "JSONDecodeError" in text
    assert report_main([str(sweep), "--no-plots"]) in (0, 1)
    # rerunning the same sweep after the fix runs only the failed jobs, and the failures file is emptied
    code, out = _main([a.replace("engine.max_depth=2,8,3", "engine.max_depth=8") for a in args], tmp_path)
    assert code == 0 and not (sweep / "failures.jsonl").exists()
