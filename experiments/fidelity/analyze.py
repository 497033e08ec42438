"""Study 6 (issue 7): the simulator's predictions vs the real backend, cell by cell.

    .venv/bin/python experiments/fidelity/analyze.py [REAL_SWEEP] [SIM_SWEEP ...] [--out DIR] [--readme FILE]

REAL_SWEEP (default outputs/multirun/real_pareto) holds the backend=hf runs of experiment=real_pareto,
SIM_SWEEP (default outputs/multirun/fidelity_sim) the simulated runs of experiment=fidelity_sim; both laid out
as r<rep>/b<batch>/<pol>/ and read with specdepth.report.collect. Several SIM_SWEEPs (e.g. the plain table and
the table plus the calibrated overheads) are compared side by side, labelled by their directory name.

Per cell (rep, batch, policy): throughput_tok_s (output tokens / wall time, prefill included) and
tokens_per_step, relative error = sim / real - 1; the time split (prefill, draft, verify, overhead) of both.
Also the real backend's own repeatability: |rep s / rep r - 1| for the same cell and any two repetitions (a
noise floor: the simulator cannot predict a timing to better than the backend repeats it).
Writes results.md, cells.csv and PNG figures into --out (default: this folder), and the results section of
--readme between `<!-- results:begin -->` and `<!-- results:end -->` when given (the error table and the
repeatability; the rest stays in results.md).
"""
from __future__ import annotations

import argparse
import csv
import math
import statistics
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402

from specdepth.report import collect, replace_results  # noqa: E402
from specdepth.results import atomic_open, atomic_savefig, atomic_write  # noqa: E402

HERE = Path(__file__).resolve().parent
POL_ORDER = ("none", "fixed1", "fixed2", "fixed3", "fixed4", "fixed6", "fixed8", "batch_scaled", "confidence",
             "goodput", "ema", "heuristic", "disable_by_batch", "batch_table", "bandit")
PARTS = ("prefill_time_s", "draft_time_s", "verify_time_s", "overhead_time_s")


def load(sweep: Path) -> dict:
    """{(rep, batch, pol): summary row} for the runs laid out r<rep>/b<batch>/<pol>/."""
    out = {}
    for row in collect(sweep):
        try:
            rel = Path(row["run_dir"]).relative_to(sweep).parts
        except ValueError:
            continue
        if len(rel) != 3 or not rel[0].startswith("r") or not rel[1].startswith("b"):
            continue
        out[(int(rel[0][1:]), int(rel[1][1:]), rel[2])] = row
    return out


def pol_key(p: str):
    return (POL_ORDER.index(p) if p in POL_ORDER else len(POL_ORDER), p)


def rel_err(sim, real):
    if sim is None or real is None or not real:
        return None
    return sim / real - 1.0


def stats(errs):
    e = [abs(x) for x in errs if x is not None and math.isfinite(x)]
    if not e:
        return None, None, 0
    return statistics.fmean(e), max(e), len(e)


def pct(x, digits=1):
    return "-" if x is None else f"{100 * x:+.{digits}f}%"


def compare(real: dict, sim: dict) -> list[dict]:
    rows = []
    for key in sorted(set(real) & set(sim), key=lambda k: (k[0], k[1], pol_key(k[2]))):
        r, s = real[key], sim[key]
        row = dict(rep=key[0], batch=key[1], pol=key[2], policy=r.get("policy"),
                   real_tput=r["throughput_tok_s"], sim_tput=s["throughput_tok_s"],
                   real_tps=r["tokens_per_step"], sim_tps=s["tokens_per_step"],
                   real_steps=r["steps"], sim_steps=s["steps"])
        row["err_tput"] = rel_err(row["sim_tput"], row["real_tput"])
        row["err_tps"] = rel_err(row["sim_tps"], row["real_tps"])
        for p in PARTS:
            row[f"real_{p}"], row[f"sim_{p}"] = r.get(p), s.get(p)
        # speed-up over no speculation at the same (rep, batch): a machine that is uniformly slower or faster
        # during the cell's runs (other processes on this shared CPU) cancels out of it
        rn, sn = real.get((key[0], key[1], "none")), sim.get((key[0], key[1], "none"))
        row["err_speedup"] = (rel_err(row["sim_tput"] / sn["throughput_tok_s"], row["real_tput"] / rn["throughput_tok_s"])
                              if rn and sn and key[2] != "none" else None)
        rows.append(row)
    return rows


def cell_means(rows: list[dict]) -> list[dict]:
    """One row per (batch, policy): simulated vs real throughput (and tokens/step, speed-up) averaged over the
    repetitions, i.e. the simulator's prediction against the best estimate of the cell's expected real value."""
    cells: dict = {}
    for r in rows:
        cells.setdefault((r["batch"], r["pol"]), []).append(r)
    out = []
    for (b, p), rs in cells.items():
        def mean(k):
            v = [r[k] for r in rs]
            return None if any(x is None for x in v) else statistics.fmean(v)
        row = dict(batch=b, pol=p, err_tput=rel_err(mean("sim_tput"), mean("real_tput")),
                   err_tps=rel_err(mean("sim_tps"), mean("real_tps")), err_speedup=None)
        none = cells.get((b, "none"))
        if none and p != "none":
            sn = statistics.fmean(r["sim_tput"] for r in none)
            rn = statistics.fmean(r["real_tput"] for r in none)
            row["err_speedup"] = rel_err(mean("sim_tput") / sn, mean("real_tput") / rn)
        out.append(row)
    return out


def repeatability(real: dict) -> list[float]:
    """|rep s / rep r - 1| of throughput for every cell and every pair of its repetitions r < s."""
    out = []
    for (rep, b, p), r in real.items():
        for (rep2, b2, p2), r2 in real.items():
            if (b2, p2) == (b, p) and rep2 > rep:
                out.append(abs(r2["throughput_tok_s"] / r["throughput_tok_s"] - 1))
    return out


def goal_cells(rows: list[dict]) -> list[dict]:
    """Per cell (batch, policy): the error of the simulated mean throughput against the real mean over the
    repetitions, and the real runs' own spread, (max - min) / mean over the repetitions (0 with one). The
    restated goal: every cell within max(10 %, its spread), and the mean error <= 5 %."""
    cells: dict = defaultdict(list)
    for r in rows:
        cells[(r["batch"], r["pol"])].append(r)
    out = []
    for (b, p), rs in sorted(cells.items(), key=lambda kv: (kv[0][0], pol_key(kv[0][1]))):
        real = [r["real_tput"] for r in rs]
        mean = statistics.fmean(real)
        spread = (max(real) - min(real)) / mean if len(real) > 1 else 0.0
        err = abs(statistics.fmean(r["sim_tput"] for r in rs) / mean - 1)
        out.append(dict(batch=b, pol=p, reps=len(rs), err=err, spread=spread, tolerance=max(0.10, spread),
                        within=err <= max(0.10, spread)))
    return out


def goal_text(rows: list[dict], label: str) -> str:
    """The restated goal for one simulator variant: verdicts, then error (spread) per cell."""
    g = goal_cells(rows)
    if not g:
        return ""
    mean = statistics.fmean(c["err"] for c in g)
    ok = sum(c["within"] for c in g)
    lines = [f"**{label}, restated goal** (each cell's mean over repetitions): {ok} of {len(g)} cells within "
             f"max(10 %, the cell's own spread) ({'met' if ok == len(g) else 'NOT met'}); mean error "
             f"{100 * mean:.1f}% (goal <= 5 %: {'met' if mean <= 0.05 else 'NOT met'}). Cell: |error| "
             "(spread of the real repetitions = (max - min) / mean); * = outside its tolerance.", ""]
    batches = sorted({c["batch"] for c in g})
    pols = sorted({c["pol"] for c in g}, key=pol_key)
    by = {(c["batch"], c["pol"]): c for c in g}
    lines += ["| policy | " + " | ".join(f"b={b}" for b in batches) + " |", "|---|" + "---|" * len(batches)]
    for p in pols:
        cells = [by.get((b, p)) for b in batches]
        lines.append(f"| {p} | " + " | ".join("-" if c is None else f"{100 * c['err']:.1f}% ({100 * c['spread']:.1f}%)"
                                               + ("" if c["within"] else " *") for c in cells) + " |")
    return "\n".join(lines)


def cell_table(rows: list[dict], label: str) -> str:
    """batch x policy, throughput (real / sim / err) and tokens per step err, averaged over reps."""
    by = defaultdict(list)
    for r in rows:
        by[(r["batch"], r["pol"])].append(r)
    batches = sorted({b for b, _ in by})
    pols = sorted({p for _, p in by}, key=pol_key)
    lines = [f"**{label}**: throughput real -> sim tok/s (error); tokens/step error; speed-up-vs-none error; "
             "mean over repetitions", "",
             "| policy | " + " | ".join(f"b={b}" for b in batches) + " |",
             "|---|" + "---|" * len(batches)]
    for p in pols:
        cells = []
        for b in batches:
            rs = by.get((b, p))
            if not rs:
                cells.append("-")
                continue
            rt = statistics.fmean(x["real_tput"] for x in rs)
            st = statistics.fmean(x["sim_tput"] for x in rs)
            et = statistics.fmean(x["err_tput"] for x in rs)
            ek = [x["err_tps"] for x in rs if x["err_tps"] is not None]
            es = [x["err_speedup"] for x in rs if x["err_speedup"] is not None]
            cells.append(f"{rt:.0f} -> {st:.0f} ({pct(et)}); {pct(statistics.fmean(ek)) if ek else '-'}; "
                         f"{pct(statistics.fmean(es)) if es else '-'}")
        lines.append(f"| {p} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parts_table(rows: list[dict]) -> str:
    """Seconds per part, summed over policies and reps, per batch: real vs sim."""
    agg = defaultdict(lambda: defaultdict(float))
    for r in rows:
        for p in PARTS:
            agg[r["batch"]][f"real_{p}"] += r[f"real_{p}"] or 0.0
            agg[r["batch"]][f"sim_{p}"] += r[f"sim_{p}"] or 0.0
    lines = ["| batch | " + " | ".join(f"{p.replace('_time_s', '')} real / sim (err)" for p in PARTS) + " |",
             "|---|" + "---|" * len(PARTS)]
    for b in sorted(agg):
        a = agg[b]
        cells = []
        for p in PARTS:
            re_, si = a[f"real_{p}"], a[f"sim_{p}"]
            cells.append(f"{re_:.2f} / {si:.2f} ({pct(rel_err(si, re_)) if re_ else '-'})")
        lines.append(f"| {b} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def figures(results: dict, out: Path) -> list[str]:
    made = []
    # 1. sim vs real throughput, one panel per simulator variant
    n = len(results)
    fig, axes = plt.subplots(1, n, figsize=(5 * n, 4.6), squeeze=False)
    for ax, (label, rows) in zip(axes[0], results.items()):
        batches = sorted({r["batch"] for r in rows})
        cmap = plt.get_cmap("viridis", max(len(batches), 2))
        for i, b in enumerate(batches):
            xs = [r["real_tput"] for r in rows if r["batch"] == b]
            ys = [r["sim_tput"] for r in rows if r["batch"] == b]
            ax.scatter(xs, ys, s=14, color=cmap(i), label=f"batch {b}")
        lo = min(min(r["real_tput"], r["sim_tput"]) for r in rows) * 0.8
        hi = max(max(r["real_tput"], r["sim_tput"]) for r in rows) * 1.25
        ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
        ax.fill_between([lo, hi], [lo * 0.95, hi * 0.95], [lo * 1.05, hi * 1.05], color="0.85", label="+-5%")
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel("real backend throughput (tok/s)")
        ax.set_ylabel("simulated throughput (tok/s)")
        m, mx, _ = stats(r["err_tput"] for r in rows)
        ax.set_title(f"{label}\nMAE {100 * m:.1f}%, max {100 * mx:.1f}%", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    atomic_savefig(fig, out / "sim_vs_real.png", dpi=130)
    plt.close(fig)
    made.append("sim_vs_real.png")
    # 2. error by batch and policy (last variant = the calibrated one when there are several)
    label, rows = list(results.items())[-1]
    pols = sorted({r["pol"] for r in rows}, key=pol_key)
    batches = sorted({r["batch"] for r in rows})
    fig, ax = plt.subplots(figsize=(8, 4.6))
    for p in pols:
        ys = []
        for b in batches:
            e = [r["err_tput"] for r in rows if r["batch"] == b and r["pol"] == p]
            ys.append(100 * statistics.fmean(e) if e else float("nan"))
        ax.plot(batches, ys, marker="o", ms=3, lw=1, label=p)
    ax.axhspan(-5, 5, color="0.9")
    ax.axhline(0, color="k", lw=0.6)
    ax.set_xscale("log", base=2)
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.set_xlabel("batch size")
    ax.set_ylabel("throughput error, sim / real - 1 (%)")
    ax.set_title(f"{label}: error per cell (mean over repetitions)", fontsize=9)
    ax.legend(fontsize=6, ncol=3)
    fig.tight_layout()
    atomic_savefig(fig, out / "error_by_batch.png", dpi=130)
    plt.close(fig)
    made.append("error_by_batch.png")
    # 3. time split, real vs each sim variant, per batch
    fig, ax = plt.subplots(figsize=(9, 4.6))
    names = ["real"] + list(results)
    width = 0.8 / len(names)
    colors = dict(zip(PARTS, ("tab:gray", "tab:orange", "tab:blue", "tab:red")))
    first_rows = list(results.values())[0]
    for j, name in enumerate(names):
        src = first_rows if name == "real" else results[name]
        pre = "real_" if name == "real" else "sim_"
        bottom = [0.0] * len(batches)
        for p in PARTS:
            vals = [sum((r[pre + p] or 0.0) for r in src if r["batch"] == b) for b in batches]
            xs = [i + (j - (len(names) - 1) / 2) * width for i in range(len(batches))]
            ax.bar(xs, vals, width, bottom=bottom, color=colors[p], edgecolor="k", lw=0.3,
                   label=p.replace("_time_s", "") if j == 0 else None)
            bottom = [a + v for a, v in zip(bottom, vals)]
        for i, b in enumerate(batches):
            ax.text(i + (j - (len(names) - 1) / 2) * width, bottom[i], name[:10], rotation=90, fontsize=6,
                    ha="center", va="bottom")
    ax.set_xticks(range(len(batches)), [f"b={b}" for b in batches])
    ax.set_ylabel("seconds, summed over policies and repetitions")
    ax.set_title("where the time goes: real backend vs simulator", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    atomic_savefig(fig, out / "time_split.png", dpi=130)
    plt.close(fig)
    made.append("time_split.png")
    return made


def write_csv(results: dict, out: Path):
    keys = None
    with atomic_open(out / "cells.csv") as f:
        for label, rows in results.items():
            for r in rows:
                r = dict(sim=label, **r)
                if keys is None:
                    keys = list(r)
                    w = csv.DictWriter(f, fieldnames=keys)
                    w.writeheader()
                w.writerow(r)


def report(real_dir: Path, sim_dirs: list[Path], out: Path) -> tuple[str, str]:
    """results.md, tables and figures into `out`; the text, and its headline (the error table and the real runs'
    repeatability) for the README."""
    real = load(real_dir)
    results = {}
    for d in sim_dirs:
        sim = load(d)
        rows = compare(real, sim)
        if rows:
            results[d.name] = rows
    if not results:
        raise SystemExit(f"no cells in common between {real_dir} and {[str(d) for d in sim_dirs]}")
    out.mkdir(parents=True, exist_ok=True)
    write_csv(results, out)
    figs = figures(results, out)
    md = [f"Real runs: `{real_dir}` ({len(real)} runs). Simulated: "
          + ", ".join(f"`{d}`" for d in sim_dirs) + ".", ""]
    md += ["| simulator | cells | throughput MAE | throughput max | tokens/step MAE | tokens/step max "
           "| speed-up vs none MAE | speed-up max |", "|---|---|---|---|---|---|---|---|"]

    def f(x):
        return "-" if x is None else f"{100 * x:.1f}%"

    for label, rows in results.items():
        reps = sorted({r["rep"] for r in rows})
        groups = [(label, rows)] + ([(f"{label}, rep {k} only", [r for r in rows if r["rep"] == k]) for k in reps]
                                    if len(reps) > 1 else [])
        if len(reps) > 1:
            groups.append((f"{label}, each cell's mean over repetitions", cell_means(rows)))
        for name, rs in groups:
            m, mx, n = stats(r["err_tput"] for r in rs)
            km, kmx, _ = stats(r["err_tps"] for r in rs)
            sm, smx, _ = stats(r["err_speedup"] for r in rs)
            md.append(f"| {name} | {n} | {f(m)} | {f(mx)} | {f(km)} | {f(kmx)} | {f(sm)} | {f(smx)} |")
    rp = repeatability(real)
    if rp:
        md += ["", f"Real backend repeatability (same cell, any two repetitions, {len(rp)} pairs): mean "
               f"|difference| {100 * statistics.fmean(rp):.1f}%, max {100 * max(rp):.1f}%."]
    head = "\n".join(md) + "\n\nPer cell, the restated goal and the time split by phase: [results.md](results.md).\n"
    for label, rows in results.items():
        md += ["", goal_text(rows, label)]
    for label, rows in results.items():
        md += ["", cell_table(rows, label)]
        md += ["", f"Time split ({label}), seconds summed over policies and repetitions:", "", parts_table(rows)]
    md += ["", "Figures: " + ", ".join(f"[{f}]({f})" for f in figs)]
    text = "\n".join(md) + "\n"
    atomic_write(out / "results.md", text)
    return text, head


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("real", nargs="?", default="outputs/multirun/real_pareto")
    ap.add_argument("sim", nargs="*", default=["outputs/multirun/fidelity_sim"])
    ap.add_argument("--out", default=str(HERE))
    ap.add_argument("--readme", default=None)
    a = ap.parse_args(argv)
    text, head = report(Path(a.real), [Path(s) for s in a.sim], Path(a.out))
    print(text)
    if a.readme:
        replace_results(a.readme, head)


if __name__ == "__main__":
    main()
