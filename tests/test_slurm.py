"""Sweeps through SLURM (hydra/launcher=slurm, submitit) on a real cluster: slurm/local_cluster.sh up.

Skipped, with the reason, where no cluster answers (a laptop); CI brings the local cluster up and sets
SPECDEPTH_REQUIRE_SLURM=1, which turns a missing cluster into a failure instead.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time

import pytest

from specdepth import report

from test_sweeps import KILLPOL, TINY, run_dirs, specdepth

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def _cluster_problem() -> str | None:
    for tool in ("sinfo", "sbatch", "sacct"):
        if shutil.which(tool) is None:
            return f"SLURM client tools not installed ({tool} missing); start one with `sudo slurm/local_cluster.sh up`"
    try:
        p = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=15)
    except subprocess.TimeoutExpired:
        return "sinfo timed out: no SLURM controller answers"
    states = p.stdout.split()
    if p.returncode != 0 or not any(s.rstrip("*~#") in ("idle", "mixed", "allocated", "completing") for s in states):
        return f"no SLURM node up (sinfo: {p.stdout.strip() or p.stderr.strip()!r}); `sudo slurm/local_cluster.sh up`"
    p = subprocess.run(["sacct", "-n", "-X", "-S", "now-1minutes"], capture_output=True, text=True, timeout=15)
    if p.returncode != 0:
        return ("SLURM accounting is off (sacct fails): a job killed hard would never be reported; "
                "slurm/local_cluster.sh sets it up")
    return None


@pytest.fixture(scope="module")
def cluster():
    problem = _cluster_problem()
    if problem:
        if os.environ.get("SPECDEPTH_REQUIRE_SLURM") == "1":
            pytest.fail(f"SPECDEPTH_REQUIRE_SLURM=1 but {problem}")
        pytest.skip(problem)


SLURM = ["hydra/launcher=slurm", "hydra.launcher.mem_gb=1", "hydra.launcher.timeout_min=5",
         "hydra.launcher.cpus_per_task=1"]


def test_sweep_on_slurm(cluster, tmp_path):
    """A 4-job array through submitit_slurm: every job's results, in the same dirs the basic launcher uses."""
    p = specdepth("--multirun", "name=sl", *SLURM, "policy=none,fixed", "workload.batch_size=1,4", *TINY,
                  cwd=tmp_path, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    sweep = tmp_path / "outputs" / "multirun" / "sl"
    dirs = run_dirs(sweep)
    assert len(dirs) == 4
    got = sorted((json.loads((d / "summary.json").read_text())["policy"],
                  json.loads((d / "summary.json").read_text())["batch_size"]) for d in dirs)
    assert got == [("fixed(4)", 1), ("fixed(4)", 4), ("none", 1), ("none", 4)]
    # it really went through SLURM: submitit's job dirs are named <array job id>_<task>
    jobs = sorted(d.name for d in (sweep / ".submitit").iterdir() if re.fullmatch(r"\d+_\d+", d.name))
    assert len(jobs) == 4
    array_id = jobs[0].split("_")[0]
    # slurmctld hands finished jobs to the accounting daemon asynchronously: give it a few seconds
    for _ in range(30):
        acct = subprocess.run(["sacct", "-n", "-X", "-P", "-j", array_id, "-o", "JobID,State"],
                              capture_output=True, text=True, timeout=15).stdout.split()
        if len(acct) == 4 and all(line.endswith("|COMPLETED") for line in acct):
            break
        time.sleep(1)
    assert len(acct) == 4 and all(line.endswith("|COMPLETED") for line in acct), acct
    text, _ = report.report(sweep, tmp_path / "rep", plots=False)
    assert "complete: all 4 runs" in text


def test_job_killed_hard_is_reported_failed(cluster, tmp_path):
    """One of two jobs SIGKILLs itself: the sweep ends (bounded time) with the job reported FAILED, and
    the other job's results are there."""
    (tmp_path / "sd_killpol.py").write_text(KILLPOL)
    env = {"PYTHONPATH": str(tmp_path)}   # sbatch passes the environment on to the job
    t0 = time.monotonic()
    p = specdepth("--multirun", "name=kill", *SLURM, "policy=none", "policy._target_=sd_killpol.make",
                  "+policy.kill=false,true", *TINY, cwd=tmp_path, env=env, timeout=240)
    elapsed = time.monotonic() - t0
    out = p.stdout + p.stderr
    assert p.returncode != 0, out
    assert "FAILED" in out and "has not produced any output" in out, out[-3000:]
    assert elapsed < 180
    sweep = tmp_path / "outputs" / "multirun" / "kill"
    done = [d for d in run_dirs(sweep) if (d / "summary.json").is_file()]
    assert len(done) == 1 and "kill=False" in done[0].name
