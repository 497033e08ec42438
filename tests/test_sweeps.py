"""Sweeps: Hydra multirun with the basic and the local launcher, run-dir naming, resume, the report.

The sweeps run the real CLI (`python -m specdepth --multirun ...`) on tiny simulator runs.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from conftest import compose
from specdepth import report
from specdepth._resolvers import config_hash, run_identity
from specdepth.app import run

TINY = ["workload.output_len=8", "workload.prompt_len=16"]

# A test-only policy: `policy._target_=sd_killpol.make`. It SIGKILLs its own process when built with kill=true,
# or (SD_KILL_AFTER=n, SD_KILL_COUNTER=<file>) once n policies were built before it: a sweep killed hard mid-way.
KILLPOL = textwrap.dedent("""\
    import os, signal
    from specdepth.policies.fixed import FixedDepth

    def make(depth=0, kill=False):
        after = os.environ.get("SD_KILL_AFTER")
        if after is not None:
            path = os.environ["SD_KILL_COUNTER"]
            n = int(open(path).read()) if os.path.exists(path) else 0
            with open(path, "w") as f:
                f.write(str(n + 1))
            kill = kill or n >= int(after)
        if kill:
            os.kill(os.getpid(), signal.SIGKILL)
        return FixedDepth(depth)
""")


def specdepth(*args, cwd, env=None, timeout=180) -> subprocess.CompletedProcess:
    e = dict(os.environ, HYDRA_FULL_ERROR="1")
    e.pop("WANDB_MODE", None)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "specdepth", *args], cwd=cwd, env=e, capture_output=True,
                          text=True, timeout=timeout)


def run_dirs(sweep: Path) -> list[Path]:
    return sorted(d for d in sweep.iterdir() if d.is_dir() and not d.name.startswith(".") and d.name != "report")


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    """One 4-job multirun (2 policies x 2 batch sizes) with the basic launcher."""
    cwd = tmp_path_factory.mktemp("grid")
    p = specdepth("--multirun", "name=grid", "policy=none,fixed", "workload.batch_size=1,4", *TINY, cwd=cwd)
    assert p.returncode == 0, p.stdout + p.stderr
    return cwd / "outputs" / "multirun" / "grid", p


def test_basic_multirun_writes_one_dir_per_config(grid):
    sweep, _ = grid
    dirs = run_dirs(sweep)
    assert len(dirs) == 4
    summaries = [json.loads((d / "summary.json").read_text()) for d in dirs]
    assert sorted((s["policy"], s["batch_size"]) for s in summaries) == [
        ("fixed(4)", 1), ("fixed(4)", 4), ("none", 1), ("none", 4)]
    for d in dirs:
        for f in ("summary.json", "config.yaml", "steps.csv", "requests.csv"):
            assert (d / f).is_file(), d / f
        assert not list(d.glob(".*.tmp")), "a temporary file of an atomic write was left behind"
        # <overrides>-<hash of the resolved config>
        label, h = d.name.rsplit("-", 1)
        assert "policy=" in label and "workload.batch_size=" in label and len(h) == 10
        cfg = OmegaConf.to_container(OmegaConf.load(d / "config.yaml"))
        assert h == config_hash(cfg)
    assert (sweep / "multirun.yaml").is_file()


def test_progress_bar_quiet_in_logs(grid):
    """engine.progress=auto: no tqdm bar when stderr is not a terminal (here: captured)."""
    _, p = grid
    out = p.stdout + p.stderr
    assert "tok/s]" not in out and "%|" not in out


def test_report_over_the_sweep(grid, tmp_path, capsys):
    sweep, _ = grid
    assert report.main([str(sweep), "--out", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "4 runs under" in text and "| batch | none | fixed(4) |" in text
    assert "complete: all 4 runs" in text and "Speed-up over no speculation" in text
    import csv
    rows = list(csv.DictReader((tmp_path / "runs.csv").open()))
    assert len(rows) == 4
    assert {"policy", "batch_size", "throughput_tok_s", "tpot_p50_s", "tpot_p99_s", "tokens_per_step",
            "speedup_vs_none", "cfg.policy.depth", "cfg.workload.batch_size", "run_dir"} <= set(rows[0])
    for r in rows:
        if r["policy"] == "none":
            assert float(r["speedup_vs_none"]) == pytest.approx(1.0)
    for png in ("throughput.png", "tpot.png", "tokens_per_step.png", "speedup.png"):
        data = (tmp_path / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, png


@pytest.mark.slow
def test_resume_after_a_sweep_killed_midway(tmp_path):
    """A sweep killed hard after 2 of 4 runs; the rerun runs only the 2 missing ones, in the same dirs.
    A different grid under the same name then adds dirs and never touches the earlier results."""
    (tmp_path / "sd_killpol.py").write_text(KILLPOL)
    env = {"PYTHONPATH": str(tmp_path)}
    args = ["--multirun", "name=res", "policy=none", "policy._target_=sd_killpol.make",
            "workload.batch_size=1,2,3,4", *TINY]
    sweep = tmp_path / "outputs" / "multirun" / "res"
    p = specdepth(*args, cwd=tmp_path, env=dict(env, SD_KILL_AFTER="2", SD_KILL_COUNTER=str(tmp_path / "n")))
    assert p.returncode == -9, p.stdout + p.stderr          # killed hard, mid-sweep
    done = {d: (d / "summary.json").stat().st_mtime_ns for d in run_dirs(sweep) if (d / "summary.json").exists()}
    assert len(done) == 2
    assert len(run_dirs(sweep)) == 3                        # the third one started, has no summary

    # the report on the partial sweep says what is missing
    text, _ = report.report(sweep, tmp_path / "rep", plots=False)
    assert "MISSING: 2 of 4 runs" in text and "workload.batch_size=3" in text and "workload.batch_size=4" in text
    assert "1 run dirs without summary.json" in text

    p = specdepth(*args, cwd=tmp_path, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout + p.stderr
    assert out.count("skipping") == 2
    dirs = run_dirs(sweep)
    assert len(dirs) == 4 and all((d / "summary.json").exists() for d in dirs)
    assert {d: (d / "summary.json").stat().st_mtime_ns for d in done} == done   # not rewritten
    text, _ = report.report(sweep, tmp_path / "rep", plots=False)
    assert "complete: all 4 runs" in text

    # another grid under the same name: new dirs only
    p = specdepth("--multirun", "name=res", "policy=none", "policy._target_=sd_killpol.make",
                  "workload.batch_size=1", "workload.output_len=9", "workload.prompt_len=16", cwd=tmp_path, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "skipping" not in p.stdout + p.stderr
    assert len(run_dirs(sweep)) == 5
    assert {d: (d / "summary.json").stat().st_mtime_ns for d in done} == done


@pytest.mark.slow
def test_optuna_preset_tunes_for_throughput(tmp_path):
    """experiment=tune_confidence: the Optuna sweeper maximizes the runs' throughput (the app's return value)."""
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper", reason="hydra-optuna-sweeper not installed")
    p = specdepth("--multirun", "experiment=tune_confidence", "hydra.sweeper.n_trials=2", *TINY, cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    sweep = tmp_path / "outputs" / "multirun" / "tune_confidence"
    dirs = run_dirs(sweep)
    assert len(dirs) == 2
    best = OmegaConf.load(sweep / "optimization_results.yaml")
    tputs = [json.loads((d / "summary.json").read_text())["throughput_tok_s"] for d in dirs]
    assert best.best_value == pytest.approx(max(tputs))
    assert set(best.best_params) == {"policy.threshold", "policy.max_depth"}
    text, _ = report.report(sweep, tmp_path / "rep", plots=False)
    assert "Optuna best:" in text and "2 runs under" in text


# ------------------------------------------------------------------------------------ in-process, fast
def test_run_id_resolver_names_configs_apart():
    base = {"seed": 0, "name": "a", "resume": True, "logger": {"_target_": "x"},
            "engine": {"progress": "auto", "max_depth": 16}, "policy": {"depth": 4}}

    def run_id(cfg, label="policy=fixed"):
        c = OmegaConf.create(dict(cfg, hydra={"label": label, "sweep": {"subdir": "${sd.run_id:${hydra.label}}"}}))
        return c.hydra.sweep.subdir

    a = run_id(base)
    assert a.startswith("policy=fixed-") and a == run_id(base)
    # keys that do not change results keep the dir (so a rerun finds its runs)
    same = dict(base, name="b", resume=False, logger={"_target_": "y"}, engine={"progress": True, "max_depth": 16})
    assert run_id(same) == a
    # anything else is another dir, even with the same overrides label
    assert run_id(dict(base, seed=1)) != a
    assert run_id(dict(base, policy={"depth": 5})) != a
    # labels are made safe for a file name
    odd = run_id(base, label="workload.path=/a/b c")
    assert "/" not in odd and " " not in odd


def test_same_config_waits_for_the_run_dir_lock(tmp_path):
    """Two jobs with the same config (a duplicated grid point, a sweep started twice) never write one run
    dir at once: the second waits for the first's lock, then finds its results (resume)."""
    import fcntl
    import threading

    cfg = compose("policy=none", "workload.batch_size=1", *TINY)
    out = []
    with open(tmp_path / ".lock", "a") as held:          # another job holds the run dir
        fcntl.flock(held, fcntl.LOCK_EX)
        t = threading.Thread(target=lambda: out.append(run(cfg, tmp_path)))
        t.start()
        t.join(1.5)
        assert t.is_alive() and not (tmp_path / "summary.json").exists()
        fcntl.flock(held, fcntl.LOCK_UN)
    t.join(60)
    assert not t.is_alive() and out and (tmp_path / "summary.json").is_file()


def test_resume_in_process(tmp_path):
    cfg = compose("policy=fixed", "workload.batch_size=2", *TINY)
    s1 = run(cfg, tmp_path)
    t = (tmp_path / "summary.json").stat().st_mtime_ns
    # resume=true (default): not run again; result-neutral keys may differ
    s2 = run(compose("policy=fixed", "workload.batch_size=2", "engine.progress=false", "name=other", *TINY),
             tmp_path)
    assert s2 == s1 and (tmp_path / "summary.json").stat().st_mtime_ns == t
    # a different config in the same dir runs again; so does resume=false
    s3 = run(compose("policy=fixed", "workload.batch_size=2", "seed=3", *TINY), tmp_path)
    assert s3["seed"] == 3
    s4 = run(compose("policy=fixed", "workload.batch_size=2", "seed=3", "resume=false", *TINY), tmp_path)
    assert s4 == s3 and (tmp_path / "summary.json").stat().st_mtime_ns != t
    assert run_identity(OmegaConf.to_container(OmegaConf.load(tmp_path / "config.yaml")))["seed"] == 3


def test_policy_grid_preset_carries_its_grid():
    c = compose("experiment=policy_grid", hydra_cfg=True)
    params = c.hydra.sweeper.params
    assert set(params) == {"policy", "workload.batch_size", "acceptance.mean"}
    assert params["policy"].split(",") == ["none", "fixed", "batch_scaled", "confidence"]
    assert c.name == "policy_grid"


@pytest.mark.parametrize("launcher,target", [("slurm", "SlurmLauncher"), ("local", "LocalLauncher")])
def test_launcher_presets_compose(launcher, target):
    c = compose(f"hydra/launcher={launcher}", "hydra.launcher.timeout_min=7", hydra_cfg=True)
    lc = c.hydra.launcher
    assert lc._target_.endswith(target) and lc.timeout_min == 7 and lc.cpus_per_task == 1
    if launcher == "slurm":
        for key in ("partition", "gpus_per_node", "mem_gb", "array_parallelism", "setup", "account", "qos"):
            assert key in lc


def test_keys_added_later_keep_old_identities_at_their_defaults():
    from specdepth._resolvers import config_hash
    old = {"seed": 0, "backend": {"_target_": "specdepth.hf.HFExecutor"}, "model": {"name": "m"}}
    new = {"seed": 0, "backend": {"_target_": "specdepth.hf.HFExecutor", "acceptance": "model"},
           "model": {"name": "m", "init": "pretrained", "tokenizer": None}}
    assert config_hash(new) == config_hash(old)
    timed = {**new, "backend": {**new["backend"], "acceptance": "simulated"}}
    rand = {**new, "model": {**new["model"], "init": "random"}}
    assert len({config_hash(old), config_hash(timed), config_hash(rand)}) == 3
