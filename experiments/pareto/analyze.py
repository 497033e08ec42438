"""Turn the Pareto sweep into tables and figures.

    .venv/bin/python experiments/pareto/analyze.py [outputs/multirun/pareto] [--readme experiments/pareto/README.md]

Reads every run with `specdepth.report.collect`; the cell of a run (hardware / acceptance / batch / policy)
comes from its directory, laid out by conf/experiment/pareto.yaml as <hw>/<acc>/b<batch>/<pol>.

Metrics per run:
  decode    steady-state decode throughput: emitted tokens / (draft + verify seconds) over the steps that ran
            at the cell's full batch size (the queue not yet drained). What a depth policy controls; the
            headline metric.
  e2e       summary.json throughput_tok_s: output tokens / wall time of the whole run, prefill and the
            draining tail included (prefill is the same for every policy, so it dilutes differences).
  tpot      summary.json tpot_p50_s.
Writes figures (PNG) and results.md next to this script, and the headline (the goal checks and the decode table of
every policy) into the results section of README.md between its `<!-- results:begin -->` and `<!-- results:end -->`
markers.
"""
from __future__ import annotations

import argparse
import csv
import math
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from specdepth.report import collect, replace_results  # noqa: E402
from specdepth.results import atomic_savefig, atomic_write  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
FIXED = ("none", "fixed1", "fixed2", "fixed3", "fixed4", "fixed6", "fixed8")
ORACLE = "oracle"
DESIGNED = "goodput"     # the one adaptive policy the goal is about (one config for every cell)
ACC_ORDER = ("iid05", "iid07", "iid09", "confidence")
ACC_LABEL = {"iid05": "iid a=0.5", "iid07": "iid a=0.7", "iid09": "iid a=0.9", "confidence": "confidence model"}


def steady_decode(run_dir: Path, batch: int) -> float | None:
    emitted = seconds = 0.0
    with open(run_dir / "steps.csv", newline="") as f:
        for r in csv.DictReader(f):
            if int(r["batch_size"]) == batch:
                emitted += float(r["emitted"])
                seconds += float(r["draft_s"]) + float(r["verify_s"])
    return emitted / seconds if seconds else None


def load(sweep_dir: Path) -> dict:
    """cells[(hw, acc, batch)][pol] = {decode, e2e, tpot, label}"""
    cells = defaultdict(dict)
    for row in collect(sweep_dir):
        rd = Path(row["run_dir"])
        try:
            rel = rd.relative_to(sweep_dir).parts
        except ValueError:
            continue
        if len(rel) != 4 or not rel[2].startswith("b"):
            continue
        hw, acc, b, pol = rel
        batch = int(b[1:])
        cells[(hw, acc, batch)][pol] = dict(decode=steady_decode(rd, batch), e2e=row.get("throughput_tok_s"),
                                            tpot=row.get("tpot_p50_s"), label=row.get("policy"))
    return cells


def baseline(cell: dict, metric: str):
    fixed = {p: cell[p][metric] for p in FIXED if p in cell and cell[p][metric]}
    if not fixed:
        return None, None
    p = max(fixed, key=fixed.get)
    return p, fixed[p]


def adaptive(cell: dict):
    return [p for p in cell if p not in FIXED and p != ORACLE]


def fmt(x, f=".3f"):
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, f)


def cell_rows(cells: dict, metric: str):
    out = []
    for (hw, acc, b) in sorted(cells, key=lambda k: (k[0], ACC_ORDER.index(k[1]) if k[1] in ACC_ORDER else 9, k[2])):
        c = cells[(hw, acc, b)]
        bp, bv = baseline(c, metric)
        if bv is None:
            continue
        orc = c.get(ORACLE, {}).get(metric)
        ad = {p: c[p][metric] for p in adaptive(c) if c[p][metric]}
        best = max(ad, key=ad.get) if ad else None
        d = c.get(DESIGNED, {}).get(metric)
        out.append(dict(hw=hw, acc=acc, batch=b, base_pol=bp, base=bv, oracle=orc, best=best,
                        best_rel=ad[best] / bv if best else None, best_orc=ad[best] / orc if best and orc else None,
                        d_rel=d / bv if d else None, d_orc=d / orc if d and orc else None,
                        none_rel=c["none"][metric] / bv if "none" in c and c["none"][metric] else None))
    return out


def table(rows, metric: str) -> str:
    lines = [f"| hardware | acceptance | batch | max(none, best fixed) | {metric} tok/s | {DESIGNED} / base | "
             f"{DESIGNED} / oracle | best adaptive | best / base | best / oracle |",
             "|---|---|---:|---|---:|---:|---:|---|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['hw']} | {ACC_LABEL.get(r['acc'], r['acc'])} | {r['batch']} | {r['base_pol']} | "
                     f"{r['base']:,.0f} | {fmt(r['d_rel'])} | {fmt(r['d_orc'])} | {r['best']} | "
                     f"{fmt(r['best_rel'])} | {fmt(r['best_orc'])} |")
    return "\n".join(lines)


def policy_summary(cells: dict, metric: str) -> str:
    """Per policy: worst and geometric-mean ratio to max(none, best fixed) over all cells, and vs oracle."""
    ratios, orc = defaultdict(list), defaultdict(list)
    for c in cells.values():
        _, bv = baseline(c, metric)
        o = c.get(ORACLE, {}).get(metric)
        for p, v in c.items():
            if v[metric] and bv:
                ratios[p].append(v[metric] / bv)
                if o:
                    orc[p].append(v[metric] / o)
    lines = ["| policy | cells | worst / base | geo-mean / base | cells below 0.99 | worst / oracle | geo-mean / oracle |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    gm = lambda xs: math.exp(sum(math.log(x) for x in xs) / len(xs))  # noqa: E731
    for p in sorted(ratios, key=lambda p: -gm(ratios[p])):
        rs, os_ = ratios[p], orc[p]
        lines.append(f"| {p} | {len(rs)} | {min(rs):.3f} | {gm(rs):.3f} | {sum(r < 0.99 for r in rs)} | "
                     f"{fmt(min(os_) if os_ else None)} | {fmt(gm(os_) if os_ else None)} |")
    return "\n".join(lines)


def verdict(rows, metric: str) -> str:
    d = [r for r in rows if r["d_rel"] is not None]
    if not d:
        return f"no `{DESIGNED}` runs found"
    worst = min(d, key=lambda r: r["d_rel"])
    worst_o = min((r for r in d if r["d_orc"] is not None), key=lambda r: r["d_orc"], default=None)
    ok1 = worst["d_rel"] >= 0.99
    ok2 = worst_o is not None and worst_o["d_orc"] >= 0.90
    below = [r for r in d if r["d_rel"] < 0.99]
    far = [r for r in d if r["d_orc"] is not None and r["d_orc"] < 0.90]
    s = [f"- `{DESIGNED}` vs max(none, best fixed), {metric}: worst {worst['d_rel']:.3f} "
         f"({worst['hw']}, {ACC_LABEL.get(worst['acc'])}, batch {worst['batch']}); "
         f"{len(below)} of {len(d)} cells below 0.99 -> goal {'MET' if ok1 else 'NOT met'}."]
    if worst_o is not None:
        s.append(f"- `{DESIGNED}` vs oracle, {metric}: worst {worst_o['d_orc']:.3f} ({worst_o['hw']}, "
                 f"{ACC_LABEL.get(worst_o['acc'])}, batch {worst_o['batch']}); {len(far)} of {len(d)} cells "
                 f"below 0.90 -> goal {'MET' if ok2 else 'NOT met'}.")
        if far:
            s.append("  Cells below 0.90 of the oracle: " + ", ".join(
                f"{r['hw']}/{r['acc']}/b{r['batch']} ({r['d_orc']:.3f})" for r in far) + ".")
    if below:
        s.append("  Cells below 0.99 of max(none, best fixed): " + ", ".join(
            f"{r['hw']}/{r['acc']}/b{r['batch']} ({r['d_rel']:.3f} vs {r['base_pol']})" for r in below) + ".")
    return "\n".join(s)


STYLE = {"oracle": dict(color="black", ls="--", lw=1.6), "goodput": dict(color="tab:red", lw=2.2),
         "goodput_global": dict(color="tab:pink", lw=1.4), "disable_by_batch": dict(color="tab:blue"),
         "batch_table": dict(color="tab:cyan"), "heuristic": dict(color="tab:olive"), "ema": dict(color="tab:green"),
         "bandit": dict(color="tab:purple"), "batch_scaled": dict(color="tab:orange"),
         "confidence": dict(color="tab:brown"), "none": dict(color="gray", lw=2.0, ls=":")}


def _style(p):
    if p in STYLE:
        return dict(lw=1.2, **STYLE[p]) if "lw" not in STYLE[p] else STYLE[p]
    return dict(color="lightgray", lw=0.9)   # fixed depths


def figures(cells: dict, out: Path) -> list[str]:
    made = []
    hws = sorted({k[0] for k in cells})
    accs = [a for a in ACC_ORDER if any(k[1] == a for k in cells)]
    for hw in hws:
        for metric, ylabel, fname, rel in (("decode", "steady decode throughput (tok/s)", "throughput", False),
                                           ("decode", "decode throughput / max(none, best fixed)", "relative", True),
                                           ("tpot", "TPOT p50 (ms)", "tpot", False)):
            fig, axes = plt.subplots(1, len(accs), figsize=(4.2 * len(accs), 3.8), squeeze=False)
            for ax, acc in zip(axes[0], accs):
                keys = sorted(k for k in cells if k[0] == hw and k[1] == acc)
                pols = sorted({p for k in keys for p in cells[k]}, key=lambda p: (p in STYLE, p))
                for p in pols:
                    xs, ys = [], []
                    for k in keys:
                        v = cells[k].get(p, {}).get(metric)
                        if v is None:
                            continue
                        if rel:
                            _, bv = baseline(cells[k], metric)
                            v = v / bv
                        elif metric == "tpot":
                            v = v * 1e3
                        xs.append(k[2])
                        ys.append(v)
                    if xs:
                        label = p if p in STYLE else ("fixed 1..8" if p == "fixed1" else None)
                        ax.plot(xs, ys, marker="o", ms=2.5, label=label, **_style(p))
                ax.set_xscale("log", base=2)
                if not rel:
                    ax.set_yscale("log")
                else:
                    ax.axhline(0.99, color="red", lw=0.6, ls=":")
                    ax.set_ylim(0.6, 1.5)
                ax.set_title(f"{hw}, {ACC_LABEL.get(acc, acc)}", fontsize=9)
                ax.set_xlabel("batch size")
                ax.grid(alpha=0.3, which="both")
            axes[0][0].set_ylabel(ylabel)
            axes[0][-1].legend(fontsize=6.5, loc="best")
            fig.tight_layout()
            path = out / f"{fname}_{hw}.png"
            atomic_savefig(fig, path, dpi=110)
            plt.close(fig)
            made.append(path.name)
    return made


def replicate_table(dirs: list[Path], metric: str = "decode") -> str:
    """Seed replicates of (a subset of) the grid: goodput / max(none, best fixed) per seed, for the cells
    every replicate has. The spread is the measurement noise the single-seed tables carry."""
    per = [dict(((r["hw"], r["acc"], r["batch"]), r) for r in cell_rows(load(d), metric)) for d in dirs]
    keys = sorted(set.intersection(*(set(p) for p in per)),
                  key=lambda k: (k[0], ACC_ORDER.index(k[1]) if k[1] in ACC_ORDER else 9, k[2]))
    if not keys:
        return "(no cells common to every replicate)"
    head = " | ".join(f"seed dir {i}" for i in range(len(dirs)))
    lines = [f"| hardware | acceptance | batch | {head} | mean | sd | best fixed per seed |",
             "|---|---|---:|" + "---:|" * len(dirs) + "---:|---:|---|"]
    sds = []
    for k in keys:
        vals = [p[k]["d_rel"] for p in per]
        if any(v is None for v in vals):
            continue
        m = sum(vals) / len(vals)
        sd = (sum((v - m) ** 2 for v in vals) / max(len(vals) - 1, 1)) ** 0.5
        sds.append(sd)
        lines.append(f"| {k[0]} | {ACC_LABEL.get(k[1], k[1])} | {k[2]} | " + " | ".join(f"{v:.3f}" for v in vals)
                     + f" | {m:.3f} | {sd:.3f} | {', '.join(p[k]['base_pol'] for p in per)} |")
    if sds:
        lines.append("")
        lines.append(f"Median sd of the ratio across seeds: {sorted(sds)[len(sds) // 2]:.3f}; largest: {max(sds):.3f}.")
    return "\n".join(lines)


def headline(parts: list[str]) -> str:
    """The README's results section: the goal checks and the decode table of every policy; the rest is results.md's."""
    end = parts.index("### Every policy over all cells (end-to-end throughput)")
    return "\n".join(parts[:end]) + "\nThe end-to-end table, every cell and the seed replicates: [results.md](results.md).\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sweep_dir", nargs="?", default=str(ROOT / "outputs" / "multirun" / "pareto"))
    ap.add_argument("--out", default=str(HERE), help="where figures and results.md go")
    ap.add_argument("--readme", default=str(HERE / "README.md"), help="README whose results section is rewritten")
    ap.add_argument("--seeds", nargs="*", default=[],
                    help="extra sweep dirs of the same grid (or a subset) run with other seeds: adds a noise table")
    a = ap.parse_args(argv)
    sweep = Path(a.sweep_dir).resolve()
    cells = load(sweep)
    if not cells:
        print(f"analyze: no runs under {sweep}", file=sys.stderr)
        return 2
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    n_runs = sum(len(c) for c in cells.values())
    pngs = figures(cells, out)
    dec, e2e = cell_rows(cells, "decode"), cell_rows(cells, "e2e")
    parts = [f"Generated by `experiments/pareto/analyze.py` from {n_runs} runs in {len(cells)} cells.", "",
             "### Goal check (steady-state decode throughput, the headline)", "", verdict(dec, "decode"), "",
             "### Goal check (end-to-end throughput, prefill and tail included)", "", verdict(e2e, "e2e"), "",
             "### Every policy over all cells (steady-state decode throughput)", "", policy_summary(cells, "decode"), "",
             "### Every policy over all cells (end-to-end throughput)", "", policy_summary(cells, "e2e"), "",
             "### Per cell (steady-state decode throughput)", "", table(dec, "decode"), "",
             "### Per cell (end-to-end throughput)", "", table(e2e, "e2e"), "",
             "Figures: " + ", ".join(f"[{p}]({p})" for p in pngs)]
    if a.seeds:
        dirs = [sweep] + [Path(d).resolve() for d in a.seeds]
        seeds = "Seed dirs: " + ", ".join(f"{i} = `{d.relative_to(ROOT) if d.is_relative_to(ROOT) else d}`"
                                          for i, d in enumerate(dirs))
        parts[-1:-1] = ["### Seed replicates: goodput / max(none, best fixed), decode", "", seeds, "",
                        replicate_table(dirs), "",
                        "### Seed replicates: goodput / max(none, best fixed), end to end", "", seeds, "",
                        replicate_table(dirs, "e2e"), ""]
    text = "\n".join(parts) + "\n"
    atomic_write(out / "results.md", text)
    replace_results(a.readme, headline(parts))
    print(verdict(dec, "decode"))
    print(verdict(e2e, "e2e"))
    print(f"wrote {out / 'results.md'} and {len(pngs)} figures")
    return 0


if __name__ == "__main__":
    sys.exit(main())
