"""Policies (or one policy's variants) side by side on the real backend, interleaved in one process: the cell of
`experiment=real_pareto` (model=tiny_pair, backend=hf, this machine's profile, a closed batch of 64-token
prompts and 128-token outputs), every variant once per repetition and batch size, in turn, so that a slow spell
of the machine hits them all. Run it pinned on a quiet machine:

    OMP_NUM_THREADS=1 taskset -c 1 .venv/bin/python experiments/real_pareto/interleaved.py --batch 2,4 --reps 2 \
        none goodput goodput:policies.goodput.estimate.row_calibration=0
    ... --gc-freeze none goodput confidence      # gc.collect(); gc.freeze() before each run

A variant is `pol[:override[:override...]]` (overrides of the real_pareto config). Prints, per batch and
variant, the mean over repetitions of the summary's verify, draft and overhead seconds and the decode time
(time_s - prefill_time_s), and the decode time's ratio to the first variant's. Runs go to a temporary folder.

    ... interleaved.py --batch 1,2,4,8,16,32 --reps 4 --order alternate --baselines none,fixed1,fixed2 \
        none fixed1 fixed2 goodput

`--order alternate`: odd repetitions run the variants in reverse order, so that a machine speeding up or slowing
down steadily over a repetition favours no variant (forward, the default: the same order every time).
`--baselines a,b`: a second table, per batch and other variant, against the baselines:
* issue 12's real-backend figure: the best baseline's mean decode seconds over the repetitions / the variant's (the
  best baseline is the one with the smallest mean, as `max(none, best fixed)` picks it from the means), then the
  paired ratio per repetition (that baseline's decode seconds / the variant's, same repetition): mean, a 95 %
  t-interval of that mean (it needs 2 repetitions or more), and [min-max];
* the best baseline of each repetition / the variant's, mean [min-max]: the luckiest baseline of every repetition,
  which the machine's noise biases against the variant (kept for the figures quoted before 2026-12-03).
"""
from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from specdepth.app import CONF_DIR, run

FIELDS = ("verify_time_s", "draft_time_s", "overhead_time_s")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("variants", nargs="+", help="pol[:override...], e.g. goodput:policies.goodput.probe=0")
    ap.add_argument("--batch", default="2")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--gc-freeze", action="store_true")
    ap.add_argument("--order", choices=("forward", "alternate"), default="forward")
    ap.add_argument("--baselines", default="", help="variants (as given) whose best is the paired baseline")
    a = ap.parse_args(argv)
    batches = [int(b) for b in a.batch.split(",")]
    base = [v for v in a.baselines.split(",") if v]
    if any(v not in a.variants for v in base) or (base and set(base) >= set(a.variants)):
        sys.exit(f"interleaved.py: --baselines {a.baselines!r} must name some of the variants (not all): "
                 f"{a.variants}")
    res: dict = {}
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None), tempfile.TemporaryDirectory() as tmp:
        for rep in range(a.reps):
            for b in batches:
                for i, v in schedule(a.variants, rep, a.order):
                    pol, *over = v.split(":")
                    try:
                        cfg = compose("config", overrides=["experiment=real_pareto", f"pol={pol}", "hydra.mode=RUN",
                                                           f"workload.batch_size={b}", "resume=false", *over])
                        if a.gc_freeze:
                            gc.collect()
                            gc.freeze()
                        s = run(cfg, f"{tmp}/b{b}_{i}")
                    except Exception as e:   # one line naming the variant, not a traceback
                        sys.exit(f"interleaved.py: variant {v!r} at batch {b}: {type(e).__name__}: "
                                 f"{str(e).splitlines()[0] if str(e) else ''}")
                    res.setdefault((b, v), []).append([s[f] for f in FIELDS] + [s["time_s"] - s["prefill_time_s"]])
    print("| batch | variant | verify s | draft s | overhead s | decode s | decode / first |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for b in batches:
        first = statistics.mean(r[3] for r in res[(b, a.variants[0])])
        for v in a.variants:
            m = [statistics.mean(col) for col in zip(*res[(b, v)])]
            print(f"| {b} | {v} | {m[0]:.3f} | {m[1]:.3f} | {m[2]:.3f} | {m[3]:.3f} | {m[3] / first:.3f} |")
    if base:
        print()
        print("| batch | variant | best baseline (by mean) | its mean decode s / the variant's | paired per "
              "repetition: mean, 95 % CI [min-max] | each repetition's best baseline / the variant: mean [min-max] |")
        print("|---:|---|---|---:|---|---|")
        for b in batches:
            decode = {k[1]: [r[3] for r in rs] for k, rs in res.items() if k[0] == b}
            each = paired(decode, base)
            for v, (best, of_means, mean, ci, lo, hi) in paired_by_mean(decode, base).items():
                ci_s = "n/a" if ci is None else f"{ci[0]:.3f}-{ci[1]:.3f}"
                print(f"| {b} | {v} | {best} | {of_means:.3f} | {mean:.3f}, {ci_s} [{lo:.3f}-{hi:.3f}] | "
                      f"{each[v][0]:.3f} [{each[v][1]:.3f}-{each[v][2]:.3f}] |")


def schedule(variants: list, rep: int, order: str) -> list:
    """(index, variant) in the order repetition `rep` runs them: forward, or reversed on odd repetitions."""
    pairs = list(enumerate(variants))
    return pairs[::-1] if order == "alternate" and rep % 2 else pairs


def paired(decode: dict, baselines: list) -> dict:
    """decode[variant] = decode seconds per repetition. For each variant not a baseline: the best (smallest)
    baseline's seconds in the same repetition / the variant's, as (mean, min, max) over repetitions."""
    out = {}
    for v, ts in decode.items():
        if v in baselines:
            continue
        r = [min(decode[b][i] for b in baselines) / t for i, t in enumerate(ts)]
        out[v] = (statistics.mean(r), min(r), max(r))
    return out


# two-sided 95 % quantiles of Student's t, by degrees of freedom (1-30); past 30: 2.04 to 60, 2.00 to 120, 1.98
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t975(df: int) -> float:
    """Student's t two-sided 95 % quantile for df >= 1 (a table; conservative past 30)."""
    return _T975[df - 1] if df <= 30 else 2.04 if df <= 60 else 2.00 if df <= 120 else 1.98


def paired_by_mean(decode: dict, baselines: list) -> dict:
    """decode[variant] = decode seconds per repetition. The best baseline is the one with the smallest mean decode
    seconds; for each variant not a baseline: (that baseline, its mean / the variant's mean, the mean of the
    per-repetition ratios (baseline / variant, same repetition), their 95 % t-interval (None with one
    repetition), min, max)."""
    best = min(baselines, key=lambda b: statistics.mean(decode[b]))
    out = {}
    for v, ts in decode.items():
        if v in baselines:
            continue
        r = [decode[best][i] / t for i, t in enumerate(ts)]
        m = statistics.mean(r)
        ci = None
        if len(r) > 1:
            h = t975(len(r) - 1) * statistics.stdev(r) / len(r) ** 0.5
            ci = (m - h, m + h)
        out[v] = (best, statistics.mean(decode[best]) / statistics.mean(ts), m, ci, min(r), max(r))
    return out


if __name__ == "__main__":
    main()
