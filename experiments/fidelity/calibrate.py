"""Measure the real backend's per-step cost outside the model forwards, for the simulator.

    .venv/bin/python experiments/fidelity/calibrate.py [outputs/multirun/real_pareto]

The engine records, for every real step, overhead_s = step wall time - draft - verify - prefill seconds:
policy.plan / keep_drafting / observe, the engine's bookkeeping and the trace recording. A profile of model
forwards never sees it. This fits overhead_s = step_overhead_s + position_overhead_s x (draft positions of the
step) over the steps of every run (least squares on the per-depth medians, weighted by their step counts,
so that a few steps slowed down by other processes do not drive it), and prints the overrides for
experiment=fidelity_sim. It reads only the overhead column, never the throughput the simulator is judged on.
"""
from __future__ import annotations

import csv
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np


def fit(real: Path) -> tuple[float, float, int]:
    by_k = defaultdict(list)
    for f in sorted(real.glob("r*/b*/*/steps.csv")):
        if not (f.parent / "summary.json").is_file():
            continue
        with f.open(newline="") as fh:
            for r in csv.DictReader(fh):
                by_k[int(r["max_depth"])].append(float(r["overhead_s"]))
    if not by_k:
        raise SystemExit(f"no steps.csv under {real}")
    ks = np.array(sorted(by_k), float)
    med = np.array([statistics.median(by_k[int(k)]) for k in ks])
    w = np.sqrt(np.array([len(by_k[int(k)]) for k in ks], float))
    if ks.size == 1:
        return max(float(med[0]), 0.0), 0.0, len(by_k[int(ks[0])])
    A = np.stack([np.ones_like(ks), ks], axis=1) * w[:, None]
    (a, b), *_ = np.linalg.lstsq(A, med * w, rcond=None)
    return max(float(a), 0.0), max(float(b), 0.0), sum(len(v) for v in by_k.values())


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    real = Path(argv[0] if argv else "outputs/multirun/real_pareto")
    a, b, n = fit(real)
    print(f"# {n} real steps: overhead_s = {a * 1e3:.3f} ms + {b * 1e3:.3f} ms x draft positions")
    print(f"backend.step_overhead_s={a:.6g} backend.position_overhead_s={b:.6g}")


if __name__ == "__main__":
    main()
