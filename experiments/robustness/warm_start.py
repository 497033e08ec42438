"""Issue 12's warm start in expectation: "short runs (16-token outputs, 8 requests) must not lose to the learning
transient". A closed batch of 8 requests x 16 output tokens (512-token prompts), iid acceptance at a grid of
levels, on two GPUs x two models of the robustness draw, with and without the engine costs the cost model misses
(`backend.step_overhead_s` 1 ms, `backend.position_overhead_s` 0.5 ms, padded ragged verifies, the draft's
catch-up). Each cell runs on `--seeds` seeds (other acceptance outcomes); every policy is judged on its mean
throughput over them against the best of none and fixed depths 1-8 by *their* means, so that what is left is the
learning transient, not one draw's luck:

    OMP_NUM_THREADS=1 .venv/bin/python experiments/robustness/warm_start.py [--seeds 16] [--jobs 2] \\
        [--out outputs/warm_start] [--alphas 0.3,0.45,0.6,0.75,0.9] [--table FILE]
    ... warm_start.py --only goodput --out outputs/warm_variant --base outputs/warm_start policies.goodput.probe=0

Policies: none, fixed 1-8, goodput, batch_scaled, confidence and oracle_expected as shipped
(conf/experiment/robustness.yaml), and `goodput@prior`: goodput told the true level as its prior
(`engine.acceptance_prior` = alpha, what a user who measured the pair would set), which separates what the prior
0.7 costs from what learning costs. Runs go to <out>/a<alpha>_<hw>_<model>[_oh]/s<seed>/<policy>/ (resume: a
rerun skips finished runs). Prints (and with --table writes) per level and overheads: each policy's mean over the
seeds / the best baseline's, worst and mean over the four hardware x model pairs, and the best baseline.
`--only P --base DIR` (a variant, e.g. with overrides after the options): only policies P run here, and the table
adds them, as "P (variant)", to DIR's (a full run with the same --seeds and --alphas).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from analyze import BASELINES  # noqa: E402
from draw import TENSOR_PARALLEL  # noqa: E402
from run import ROOT, _warm, base_config, job_config  # noqa: E402

from specdepth.app import run  # noqa: E402
from specdepth.errors import SpecdepthError  # noqa: E402
from specdepth.results import atomic_write  # noqa: E402

PAIRS = (("h100_sxm", "llama3_8b"), ("h100_sxm", "llama3_70b"), ("b200", "llama3_8b"), ("b200", "llama3_70b"))
OVERHEADS = {"step_overhead_s": 0.001, "position_overhead_s": 0.0005, "pad_ragged": True, "draft_catch_up": True}
NO_OVERHEADS = {"step_overhead_s": 0.0, "position_overhead_s": 0.0, "pad_ragged": False, "draft_catch_up": False}
JUDGED = ("goodput", "goodput@prior", "batch_scaled", "confidence", "oracle_expected")


def cells(alphas, seeds: int) -> list[dict]:
    """Every (level, pair, overheads, seed) cell, in the robustness draw's cell format (run.job_config)."""
    out = []
    for alpha in alphas:
        for hw, model in PAIRS:
            for oh in (False, True):
                name = f"a{alpha}_{hw}_{model}" + ("_oh" if oh else "")
                for s in range(seeds):
                    seed = int(np.random.SeedSequence([int(alpha * 1000), PAIRS.index((hw, model)), oh, s])
                               .generate_state(1)[0])
                    out.append({"id": f"{name}/s{s}", "group": name, "alpha": alpha, "oh": oh, "hardware": hw,
                                "model": model, "tp": TENSOR_PARALLEL.get((hw, model), 1), "batch": 8, "seed": seed,
                                "acceptance": {"_target_": "specdepth.acceptance.IID", "alpha": alpha},
                                "workload": {"_target_": "specdepth.workload.Closed", "batch_size": 8,
                                             "prompt_len": 512, "output_len": 16},
                                "backend": dict(OVERHEADS if oh else NO_OVERHEADS)})
    return out


def run_job(args):
    cell, pol, run_dir, *extra = args
    extra = tuple(extra[0]) if extra else ()
    name, _, variant = pol.partition("@")
    cfg = job_config(cell, name, extra)
    if variant == "prior":
        cfg.engine.acceptance_prior = cell["alpha"]
    try:
        s = run(cfg, run_dir)
    except SpecdepthError as e:
        print(f"FAILED {run_dir}: {e}", flush=True)
        return cell["id"], pol, None
    return cell["id"], pol, s["throughput_tok_s"]


def table(cs: list[dict], got: dict, judged: tuple = JUDGED) -> list[str]:
    """Per (level, overheads): each judged policy's mean throughput over the seeds / the best baseline's (by
    mean), worst and mean over the pairs; and which baseline was best."""
    groups: dict = {}
    for c in cs:
        groups.setdefault((c["alpha"], c["oh"]), {}).setdefault(c["group"], []).append(c["id"])
    lines = [f"Mean over {len(next(iter(next(iter(groups.values())).values())))} seeds / the best of none and fixed "
             "1-8 by their means; worst [mean] over the 4 GPU x model pairs:", "",
             "| alpha | overheads | " + " | ".join(judged) + " | best baselines |", "|---:|---|" + "---:|" * len(judged)
             + "---|"]
    for (alpha, oh), by_group in sorted(groups.items()):
        ratios = {p: [] for p in judged}
        best_names = []
        for ids in by_group.values():
            mean = {p: statistics.mean(got[i, p] for i in ids) for p in BASELINES + judged}
            best = max(BASELINES, key=mean.get)
            best_names.append(best)
            for p in judged:
                ratios[p].append(mean[p] / mean[best])
        cols = " | ".join(f"{min(r):.3f} [{statistics.mean(r):.3f}]" for r in ratios.values())
        lines.append(f"| {alpha} | {'on' if oh else 'off'} | {cols} | {', '.join(sorted(set(best_names)))} |")
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=16)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--alphas", default="0.3,0.45,0.6,0.75,0.9")
    ap.add_argument("--out", default=str(ROOT / "outputs" / "warm_start"))
    ap.add_argument("--table", default=None, help="also write the table here (markdown)")
    ap.add_argument("--only", default=None, help="policies to run (default: all), e.g. goodput for a variant")
    ap.add_argument("--base", default=None, help="with --only: a full run's --out; the table puts the runs made here "
                    "(as '<policy> (variant)') beside its baselines and policies")
    ap.add_argument("overrides", nargs="*", help="config overrides for every run (e.g. policies.goodput.probe=0)")
    a = ap.parse_args(argv)
    try:
        alphas = [float(x) for x in a.alphas.split(",")]
    except ValueError:
        raise SystemExit(f"warm_start.py: --alphas must be numbers separated by commas, got {a.alphas!r}") from None
    if a.seeds < 1 or any(not 0.0 <= x <= 1.0 for x in alphas):
        raise SystemExit("warm_start.py: --seeds must be >= 1 and every --alphas level in [0, 1]")
    cs = cells(alphas, a.seeds)
    out = Path(a.out)
    pols = BASELINES + JUDGED if a.only is None else tuple(a.only.split(","))
    base = None
    if a.only is not None and a.base is not None:   # read and checked before any run
        try:
            raw = json.loads((Path(a.base) / "throughput.json").read_text())
            base = {tuple(k.split("|")): v for k, v in raw.items()}
        except (OSError, ValueError) as e:
            raise SystemExit(f"warm_start.py: --base {a.base}: no readable throughput.json ({e})") from None
        missing = [c["id"] for c in cs if (c["id"], "none") not in base]
        if missing:
            raise SystemExit(f"warm_start.py: --base {a.base} lacks cells of this run (e.g. {missing[0]}): run it "
                             "with the same --seeds and --alphas")
    extra = tuple(a.overrides)
    work = [(c, p, str(out / c["id"] / p), extra) for c in cs for p in pols]
    known = set(base_config(extra).policies)
    bad = [p for p in pols if p.partition("@")[0] not in known or p.partition("@")[2] not in ("", "prior")]
    if bad:
        raise SystemExit(f"warm_start.py: --only: unknown policy {', '.join(bad)} (conf/experiment/robustness.yaml's "
                         "policies, optionally with @prior)")
    _warm()
    t0 = time.perf_counter()
    if a.jobs > 1:
        with mp.get_context("fork").Pool(a.jobs) as pool:
            results = list(pool.imap_unordered(run_job, work, chunksize=8))
    else:
        results = [run_job(w) for w in work]
    got = {(cid, p): t for cid, p, t in results}
    if any(t is None for t in got.values()):
        raise SystemExit("warm_start.py: some runs failed (FAILED lines above); no table")
    print(f"{len(work)} runs in {time.perf_counter() - t0:.0f} s ({a.jobs} workers)", flush=True)
    atomic_write(out / "throughput.json", json.dumps({f"{k[0]}|{k[1]}": v for k, v in got.items()}, indent=0))
    judged = JUDGED
    if a.only is not None:
        if base is None:
            return
        judged = JUDGED + tuple(f"{p} (variant)" for p in pols)
        got = {**base, **{(c, f"{p} (variant)"): t for (c, p), t in got.items()}}
    lines = table(cs, got, judged)
    print("\n".join(lines))
    if a.table:
        atomic_write(Path(a.table), "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
