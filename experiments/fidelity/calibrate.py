"""Measure the real backend's cost outside the profiled model forwards, for the simulator.

    .venv/bin/python experiments/fidelity/calibrate.py REAL_SWEEP SIM_SWEEP [--fit-rep 0]
    e.g. calibrate.py outputs/multirun/real_pareto outputs/multirun/real_pareto_sim_table --fit-rep 0

A profile of model forwards (specdepth-profile -> cost=table) does not see what the real backend spends
around them: per draft position, the executor's sampling and host copies (softmax over the vocabulary,
argmax, .cpu(), the token and length bookkeeping) and the engine's per-position work; per step, the
engine's bookkeeping. The simulated sweep SIM_SWEEP (experiment=fidelity_sim with the plain profiled
table; it already charges each policy's own measured time, engine.charge_policy_time) makes the same
decisions as the real runs (it replays their acceptance traces), so for every run

    (real draft + overhead seconds) - (simulated draft + overhead seconds)
        ~= step_overhead_s x steps + position_overhead_s x draft positions

(draft positions = the sum of each step's deepest planned draft, steps.csv `max_depth`). This fits that by
least squares (non-negative) over the runs of repetition --fit-rep only, so the other repetition is an
out-of-sample check, and prints the overrides for experiment=fidelity_sim. It reads the draft and overhead
time columns, never the throughput the simulator is judged on, and never the verify or prefill times.

--phases draft,overhead,verify (run.sh in timing mode, issue 15) also reads the verify time: the verify phase
of backend=hf pays host work around its forward every step (the step's tokens, argmax and .cpu(), the
acceptance decision, the commit: 0.2-0.3 ms on this CPU, experiments/fidelity/phase_ab.py), which the
simulator charges only through step_overhead_s; the residual of every phase named is summed.
"""
from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import numpy as np


def _runs(root: Path, rep: str | None):
    for s in sorted(root.glob("r*/b*/*/summary.json")):
        r = s.parent.parent.parent.name[1:]
        if rep is None or r == rep:
            yield s.parent.relative_to(root), json.loads(s.read_text())


PHASES = ("draft", "overhead", "verify", "prefill")


def fit(real: Path, sim: Path, rep: str | None = "0", phases=("draft", "overhead")) -> tuple[float, float, int]:
    A, y = [], []
    for rel, rs in _runs(real, rep):
        ss_path = sim / rel / "summary.json"
        if not ss_path.is_file():
            continue
        ss = json.loads(ss_path.read_text())
        with (real / rel / "steps.csv").open(newline="") as fh:
            rows = list(csv.DictReader(fh))
        steps = sum(1 for r in rows)
        positions = sum(int(r["max_depth"]) for r in rows)
        resid = sum(rs[f"{p}_time_s"] - ss[f"{p}_time_s"] for p in phases)
        A.append((steps, positions))
        y.append(resid)
    if not A:
        raise SystemExit(f"no runs with both {real}/.../summary.json and {sim}/.../summary.json (rep {rep})")
    A, y = np.array(A, float), np.array(y)
    coef, *_ = np.linalg.lstsq(A, y, rcond=None)
    a, b = (max(float(c), 0.0) for c in coef)
    if coef[0] < 0:     # refit the per-position cost alone when the per-step one would be negative
        b = max(float(A[:, 1] @ y / (A[:, 1] @ A[:, 1])), 0.0)
    elif coef[1] < 0:
        a = max(float(A[:, 0] @ y / (A[:, 0] @ A[:, 0])), 0.0)
    return a, b, len(y)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("real", nargs="?", default="outputs/multirun/real_pareto")
    ap.add_argument("sim", nargs="?", default="outputs/multirun/real_pareto_sim_table")
    ap.add_argument("--fit-rep", default="0", help="repetition to fit on ('all' = every one)")
    ap.add_argument("--phases", default="draft,overhead",
                    help=f"comma-separated time columns whose residual is fitted, of {','.join(PHASES)}")
    a = ap.parse_args(argv)
    rep = None if a.fit_rep == "all" else a.fit_rep
    phases = tuple(p for p in a.phases.split(",") if p)
    if not phases or set(phases) - set(PHASES):
        ap.error(f"--phases: a comma-separated subset of {','.join(PHASES)}, got {a.phases!r}")
    s, p, n = fit(Path(a.real), Path(a.sim), rep, phases)
    print(f"# {n} runs of rep {a.fit_rep}: real - simulated ({' + '.join(phases)}) = {s * 1e3:.3f} ms x steps "
          f"+ {p * 1e3:.3f} ms x draft positions")
    print(f"backend.step_overhead_s={s:.6g} backend.position_overhead_s={p:.6g}")


if __name__ == "__main__":
    main()
