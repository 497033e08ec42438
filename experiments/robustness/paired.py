"""A policy change, paired on one draw: the draw's own runs of a policy against a variant's runs of it on the
same cells (the same seeds, the same none / fixed 1-8 baselines).

    .venv/bin/python experiments/robustness/run.py --seed 2026 --only pol=goodput --out outputs/variant \
        policies.goodput.drain=false                      # the variant's runs of goodput, another folder
    .venv/bin/python experiments/robustness/paired.py outputs/robustness/seed2026 outputs/variant/seed2026 \
        --policies goodput
    ... paired.py ... --only acc=confidence --range acceptance.calibration=0:0.9   # a subset of the cells

Prints, for each policy, the figures analyze.py reports (worst and geo-mean ratio to max(none, best fixed),
cells below 0.99 / 0.95, cells more than 1 % below none, worst TPOT p50 ratio and cells above 1.02 on poisson
cells) for the draw's runs and the variant's, over the cells both have, and the cells that moved most.
`--only key=a,b` keeps the cells whose cells.json `key` is one of the values (as run.py's --only: kind, acc,
hardware, model, cell (the id), ...); `--range dotted.key=lo:hi` the cells whose value there (e.g.
acceptance.calibration) is in [lo, hi) (either end may be empty); a cell without the key is left out.

`--whole`: the variant is a whole draw (every policy, the baselines too) run with a change that moves every
policy's throughput, e.g. an engine switch (`run.py --seed S --out outputs/variant backend.group_prefill=false`):
each side is judged against its own none / fixed 1-8, and each policy's own throughput, variant / draw, is given
too (geo-mean, the cells up / down by more than 0.1 %, the cells where it moved most, its prefill seconds summed).

`--also DRAW_R VARIANT_R` (repeatable): replicates of both (run.py --replicate R: the draw's with none / fixed 1-8
and the policies, the variant's with the policies): each side's throughput and TPOT p50, the baselines' too, are
then the mean over the draw and its replicates, on the cells every folder holds, so that a change is judged in
expectation and not on one draw of outcomes (replicates.py's figures, for a variant):

    ... paired.py outputs/robustness/seed2057 outputs/variant/seed2057 --policies goodput \
        --also outputs/rep1/seed2057 outputs/vrep1/seed2057 ... --also outputs/rep7/seed2057 outputs/vrep7/seed2057
"""
from __future__ import annotations

import argparse
from pathlib import Path

from analyze import _gm, _where, load, table


def figures(rows, p) -> str:
    ratios = [r["ratio"][p] for r in rows]
    tp = [r["tpot"][p] for r in rows if "tpot" in r]
    return (f"worst {min(ratios):.3f}, geo-mean {_gm(ratios):.4f}, < 0.99: {sum(x < 0.99 for x in ratios)}, "
            f"< 0.95: {sum(x < 0.95 for x in ratios)}, > 1 % below none: "
            f"{sum(r['vs_none'][p] < 0.99 for r in rows)}, TPOT worst {max(tp, default=float('nan')):.3f} "
            f"(> 1.02: {sum(x > 1.02 for x in tp)})")


def _value(cell: dict, dotted: str):
    v = cell
    for part in dotted.split("."):
        if not isinstance(v, dict) or part not in v:
            return None
        v = v[part]
    return v


def keeps(cell: dict, only: list[str], ranges: list[str]) -> bool:
    """Whether a cell passes every --only key=a,b and --range dotted.key=lo:hi."""
    for spec in only:
        key, _, vals = spec.partition("=")
        key = "id" if key == "cell" else key   # run.py's cell=0,5: the cells.json id
        if str(_value(cell, key)) not in vals.split(","):
            return False
    for spec in ranges:
        key, _, span = spec.partition("=")
        lo, sep, hi = span.partition(":")
        if not sep:
            raise SystemExit(f"paired.py: --range {spec!r}: expected dotted.key=lo:hi")
        try:
            lo_v, hi_v = (float(lo) if lo else None), (float(hi) if hi else None)
        except ValueError:
            raise SystemExit(f"paired.py: --range {spec!r}: the bounds must be numbers") from None
        v = _value(cell, key)
        if not isinstance(v, (int, float)) or (lo_v is not None and v < lo_v) or (hi_v is not None and v >= hi_v):
            return False
    return True


def mean_runs(loaded: list[dict]) -> dict:
    """Runs (load's second half) averaged over folders: per (cell, policy) every folder has, summary.json's
    throughput_tok_s and tpot_p50_s (where all have it) the mean, the rest the first folder's."""
    keys = set.intersection(*(set(r) for r in loaded))
    out = {}
    for k in keys:
        s = dict(loaded[0][k])
        for f in ("throughput_tok_s", "tpot_p50_s"):
            vals = [r[k].get(f) for r in loaded]
            if None not in vals:
                s[f] = sum(vals) / len(vals)
        out[k] = s
    return out


def throughput_moved(mine, theirs, p, runs, other) -> str:
    """--whole: policy p's own throughput, variant / draw, per cell: geo-mean, cells up / down by more than 0.1 %,
    the extremes; and its prefill seconds summed over these cells (summary.json's prefill_time_s)."""
    moved = sorted(((theirs[r["cell"]["id"]]["thr"][p] / r["thr"][p], r) for r in mine), key=lambda m: m[0])
    ids = [r["cell"]["id"] for _, r in moved]
    pre = [sum(d[cid, p].get("prefill_time_s", 0.0) for cid in ids) for d in (runs, other)]
    ends = moved[:2] + moved[-3:] if len(moved) > 5 else moved
    return (f"  its throughput, variant / draw: geo-mean {_gm([x for x, _ in moved]):.4f}, "
            f"{sum(x > 1.001 for x, _ in moved)} cells up and {sum(x < 0.999 for x, _ in moved)} down by more "
            f"than 0.1 %; " + ", ".join(f"c{r['cell']['id']} {r['thr'][p]:.1f} -> "
                                        f"{theirs[r['cell']['id']]['thr'][p]:.1f}" for _, r in ends)
            + f"; prefill {pre[0]:.1f} -> {pre[1]:.1f} s")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("draw", type=Path, help="the draw's folder (run.py's <out>/seed<seed>)")
    ap.add_argument("variant", type=Path, help="the variant's folder for the same seed")
    ap.add_argument("--policies", default="goodput", help="comma-separated")
    ap.add_argument("--moved", type=int, default=5, help="cells that moved most, each way")
    ap.add_argument("--base", type=Path, help="another run of the policies on the same seed to compare against")
    ap.add_argument("--only", action="append", default=[], help="key=a,b: the cells with one of these values")
    ap.add_argument("--range", action="append", default=[], help="dotted.key=lo:hi: the cells with a value in [lo, hi)")
    ap.add_argument("--whole", action="store_true",
                    help="the variant is a whole draw: each side against its own baselines, and throughput moved")
    ap.add_argument("--also", nargs=2, type=Path, action="append", default=[], metavar=("DRAW_R", "VARIANT_R"),
                    help="a replicate of the draw and of the variant: both sides averaged over them")
    a = ap.parse_args(argv)
    if a.whole and a.base is not None:
        raise SystemExit("paired.py: --whole compares two whole draws; --base does not apply")
    if a.also and (a.whole or a.base is not None):
        raise SystemExit("paired.py: --also averages replicates of a policy variant; --whole and --base do not apply")
    cells, runs = load(a.draw)
    cells = [c for c in cells if keeps(c, a.only, a.range)]
    _, other = load(a.variant)
    if a.also:
        runs = mean_runs([runs] + [load(d)[1] for d, _ in a.also])
        other = mean_runs([other] + [load(v)[1] for _, v in a.also])
        print(f"means over the draw and {len(a.also)} replicates")
    pols = a.policies.split(",")
    if a.base is not None:
        _, base = load(a.base)
        runs = {k: v for k, v in runs.items() if k[1] not in pols}
        runs.update({k: v for k, v in base.items() if k[1] in pols})
    for p in pols:
        both = {cid for cid, q in other if q == p} & {cid for cid, q in runs if q == p}
        mine = [r for r in table(cells, runs) if r["cell"]["id"] in both]
        if not mine:
            raise SystemExit(f"paired.py: no cell where both {a.draw} (with its none / fixed baselines) and "
                             f"{a.variant} have a finished {p!r} run: the draw (first argument) must be run.py's "
                             f"full draw, the variant (second) a run of the same seed")
        var = other if a.whole else {**runs, **{k: v for k, v in other.items() if k[1] == p}}
        theirs = {r["cell"]["id"]: r for r in table(cells, var) if r["cell"]["id"] in both}
        if a.whole:
            mine = [r for r in mine if r["cell"]["id"] in theirs]
            if not mine:
                raise SystemExit(f"paired.py --whole: no cell complete (none, fixed 1-8 and {p!r}) in both draws")
        print(f"{p}, {len(mine)} cells")
        print(f"  draw:    {figures(mine, p)}")
        print(f"  variant: {figures(list(theirs.values()), p)}")
        if a.whole:
            print(throughput_moved(mine, theirs, p, runs, other))
        moved = sorted(mine, key=lambda r: theirs[r["cell"]["id"]]["ratio"][p] - r["ratio"][p])
        for r in (moved if len(moved) <= 2 * a.moved else moved[:a.moved] + moved[len(moved) - a.moved:]):
            print(f"    {_where(r)}: {r['ratio'][p]:.3f} -> {theirs[r['cell']['id']]['ratio'][p]:.3f}")


if __name__ == "__main__":
    main()
