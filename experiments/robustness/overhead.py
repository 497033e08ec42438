"""Per-run overhead of the three ways to run robustness cells (issue 12): what a run costs beyond its
simulation. Run it on a quiet machine; the figures in the README say when and where they were taken.

    .venv/bin/python experiments/robustness/overhead.py [--jobs 10]

For `--jobs` runs of the default cell of conf/experiment/robustness.yaml (policies none, fixed1..8, goodput,
cycled), it measures
  engine     the simulation alone: Engine.run, in-process (median over the runs)
  multirun   `specdepth --multirun experiment=robustness pol=...` (Hydra's basic launcher), wall / runs
  single     one `specdepth experiment=robustness pol=none` process, wall (start-up included)
  runner     experiments/robustness/run.py's job function, in-process, one worker, wall / runs
and prints each one's overhead per run = its time per run - engine.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import base_config, run_job  # noqa: E402

from specdepth.app import build  # noqa: E402

POLS = ("none", "fixed1", "fixed2", "fixed3", "fixed4", "fixed5", "fixed6", "fixed7", "fixed8", "goodput")
CLI = str(Path(sys.executable).with_name("specdepth"))


def engine_time(pols) -> float:
    out = []
    for p in pols:
        cfg = base_config().copy()
        cfg.pol = p
        eng = build(cfg)["engine"]
        t = time.perf_counter()
        eng.run()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def timed(cmd, cwd) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, check=True, capture_output=True)
    return time.perf_counter() - t


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=10)
    a = ap.parse_args(argv)
    pols = [POLS[i % len(POLS)] for i in range(a.jobs)]
    eng = engine_time(pols)
    with tempfile.TemporaryDirectory() as tmp:
        multi = timed([CLI, "--multirun", "experiment=robustness", f"pol={','.join(dict.fromkeys(pols))}",
                       f"hydra.sweep.dir={tmp}/multi", "resume=false"], tmp) / len(dict.fromkeys(pols))
        single = timed([CLI, "experiment=robustness", "pol=none", f"hydra.run.dir={tmp}/single", "resume=false"], tmp)
        cell = {"id": 0, **{k: v for k, v in base_config().cell.items()}}
        t = time.perf_counter()
        for i, p in enumerate(pols):
            run_job((cell, p, f"{tmp}/runner/{i}", ("resume=false",)))
        runner = (time.perf_counter() - t) / len(pols)
    print(f"engine (simulation alone)  {eng * 1e3:7.1f} ms per run")
    for name, v in (("multirun", multi), ("single process", single), ("in-process runner", runner)):
        print(f"{name:26s} {v * 1e3:7.1f} ms per run, overhead {(v - eng) * 1e3:7.1f} ms")


if __name__ == "__main__":
    main()
