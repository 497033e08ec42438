"""Study 7 (issue 7): adaptive depth policies vs no speculation vs the best fixed depth on the real backend.

    .venv/bin/python experiments/real_pareto/analyze.py [SWEEP] [--out DIR] [--readme FILE]
                                                        [--table experiments/real_pareto/variants.csv --variant NAME]

SWEEP (default outputs/multirun/real_pareto): the backend=hf runs of experiment=real_pareto, laid out
r<rep>/b<batch>/<pol>/, read with specdepth.report.collect. Per (batch, policy) the throughput is the mean
over repetitions of
  e2e     summary.json throughput_tok_s: output tokens / wall time, prefill included (the headline)
  decode  (output tokens - batch) / (wall time - prefill seconds): the decode phase only (prefill is the
          same for every policy and dilutes their differences)
Baseline per batch = max(none, best fixed depth among fixed1..fixed8, chosen per batch in hindsight).
Gap of an adaptive policy = its throughput / baseline - 1. Goal (issue 7): the best adaptive policy is never
more than 3% below the baseline, i.e. its worst gap over batch sizes >= -3%.
Writes results.md and PNG figures into --out (default: this folder), the README's results section
(between `<!-- results:begin -->` and `<!-- results:end -->`) when --readme is given, and the sweep's rows of
the table of every sweep (variants.py; `default` is the headline sweep, a variant is named after its change)
when --table is: a variant's figures live there, its results.md and PNGs in a folder of your choosing.
"""
from __future__ import annotations

import argparse
import csv
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import variants  # noqa: E402

from specdepth.report import collect, replace_results  # noqa: E402
from specdepth.results import atomic_savefig, atomic_write  # noqa: E402

HERE = Path(__file__).resolve().parent
FIXED = ("fixed1", "fixed2", "fixed3", "fixed4", "fixed6", "fixed8")
NONE = "none"
ADAPTIVE = ("batch_scaled", "confidence", "goodput", "ema", "heuristic", "disable_by_batch", "batch_table",
            "bandit")
GOAL = -0.03
GOAL12 = 0.98   # issue 12: goodput (calibrated) >= 0.98 x max(none, best fixed) at every batch size


def _steps(run_dir: str) -> dict | None:
    """A run's decode steps from its steps.csv: drafting steps' seconds and emitted tokens, idle steps' seconds
    (step_s less the prefill a step ran), and the batch. None where the file is missing."""
    f = Path(run_dir) / "steps.csv"
    if not f.is_file():
        return None
    with f.open() as fh:
        rows = list(csv.DictReader(fh))
    out = dict(draft_s=0.0, draft_steps=0, draft_emitted=0, idle_s=0.0, idle_steps=0, emitted=0, idle_over=0.0,
               over=0.0)
    for r in rows:
        t = float(r["step_s"]) - float(r["prefill_s"] or 0.0)
        out["emitted"] += int(r["emitted"])
        out["over"] += float(r["overhead_s"])
        if int(r["drafted"]) > 0:
            out["draft_s"] += t
            out["draft_steps"] += 1
            out["draft_emitted"] += int(r["emitted"])
        else:
            out["idle_s"] += t
            out["idle_steps"] += 1
            out["idle_over"] += float(r["overhead_s"])
    return out


def load(sweep: Path) -> dict:
    """cells[batch][pol] = {e2e, decode, tps, reps: [e2e per rep], by_rep: {rep: {e2e, decode, steps}}}"""
    raw = defaultdict(lambda: defaultdict(list))
    for row in collect(sweep):
        try:
            rel = Path(row["run_dir"]).relative_to(sweep).parts
        except ValueError:
            continue
        if len(rel) != 3 or not rel[0].startswith("r") or not rel[1].startswith("b"):
            continue
        row["_rep"] = int(rel[0][1:])
        raw[int(rel[1][1:])][rel[2]].append(row)
    cells = {}
    for b, pols in raw.items():
        cells[b] = {}
        for p, rows in pols.items():
            dec = []
            for r in rows:
                t = r["time_s"] - (r.get("prefill_time_s") or 0.0)
                dec.append((r["output_tokens"] - r["requests"]) / t if t > 0 else None)
            cells[b][p] = dict(e2e=statistics.fmean(r["throughput_tok_s"] for r in rows),
                               decode=statistics.fmean(d for d in dec if d is not None),
                               tps=statistics.fmean(r["tokens_per_step"] for r in rows),
                               reps=[r["throughput_tok_s"] for r in sorted(rows, key=lambda r: r["_rep"])],
                               by_rep={r["_rep"]: dict(e2e=r["throughput_tok_s"], decode=d,
                                                       steps=_steps(r["run_dir"])) for r, d in zip(rows, dec)})
    return cells


def baseline(cell: dict, metric: str):
    cands = {p: cell[p][metric] for p in (NONE,) + FIXED if p in cell}
    if not cands:
        return None, None
    p = max(cands, key=cands.get)
    return p, cands[p]


def gaps(cells: dict, metric: str) -> dict:
    """gaps[pol][batch] = throughput / baseline - 1, computed within each repetition (the policies of one
    batch size run back to back, so a machine slowed down by other processes for minutes slows them alike)
    and then averaged over the repetitions."""
    return {p: {b: statistics.fmean(g) for b, g in per.items()} for p, per in rep_gaps(cells, metric).items()}


def rep_gaps(cells: dict, metric: str) -> dict:
    """rep_gaps[pol][batch] = [throughput / baseline - 1 in each repetition]."""
    out = defaultdict(dict)
    for b, cell in cells.items():
        reps = sorted({r for v in cell.values() for r in v.get("by_rep", {})}) or [None]
        acc = defaultdict(list)
        for rep in reps:
            view = ({p: v["by_rep"][rep] for p, v in cell.items() if rep in v.get("by_rep", {})}
                    if rep is not None else cell)
            _, base = baseline(view, metric)
            if not base:
                continue
            for p, v in view.items():
                if v.get(metric):
                    acc[p].append(v[metric] / base - 1)
        for p, g in acc.items():
            out[p][b] = g
    return out


def goal12(cells: dict, metric: str, pol: str = "goodput", goal: float = GOAL12) -> list[dict]:
    """Issue 12, part 4: `pol` >= 0.98 x max(none, best fixed) at every batch size, in the mean of the
    repetitions (each ratio taken within its repetition), with the repetitions' spread (min-max)."""
    g = rep_gaps(cells, metric).get(pol, {})
    batches = sorted(cells)
    if not all(b in g for b in batches):
        return [variants.row("goal12", metric=metric, policy=pol, note="not run")]
    worst = min(1 + statistics.fmean(g[b]) for b in batches)
    return [variants.row("goal12", metric=metric, policy=pol, n=max(len(g[b]) for b in batches),
                         ratio=f"{worst:.3f}", note="met" if worst >= goal else "missed")] + [
        variants.row("goal12_batch", metric=metric, batch=b, ratio=f"{1 + statistics.fmean(g[b]):.3f}",
                     lo=f"{1 + min(g[b]):.3f}", hi=f"{1 + max(g[b]):.3f}") for b in batches]


def table(cells: dict, metric: str) -> list[dict]:
    """Per policy and batch the mean throughput and its gap, each policy's worst gap, the baseline per batch, and
    the tokens per step."""
    batches = sorted(cells)
    g = gaps(cells, metric)
    pols = [p for p in (NONE,) + FIXED + ADAPTIVE if any(p in cells[b] for b in batches)]
    out = []
    for p in pols:
        for b in batches:
            v = cells[b].get(p)
            out.append(variants.row("throughput", metric=metric, policy=p, batch=b, tok_s="-") if v is None else
                       variants.row("throughput", metric=metric, policy=p, batch=b, tok_s=f"{v[metric]:.1f}",
                                    gap=f"{100 * g[p][b]:+.1f}"))
        worst = min(g[p].values()) if g.get(p) else None
        out.append(variants.row("worst_gap", metric=metric, policy=p,
                                gap="-" if worst is None else f"{100 * worst:+.1f}"))
    for b in batches:
        p, v = baseline(cells[b], metric)
        out.append(variants.row("baseline", metric=metric, batch=b, tok_s=f"{v:.1f}", policy=p))
    out += [variants.row("tps", metric=metric, policy=p, batch=b,
                         tps="-" if p not in cells[b] else f"{cells[b][p]['tps']:.2f}") for p in pols for b in batches]
    return out


def where_rows(cells: dict) -> list[dict]:
    """Where goodput's decode time goes against `none`'s, per batch, from the runs' steps.csv, in the same repetition
    then averaged (each as a share of none's decode time): its drafting steps' time beyond what none takes to emit
    their tokens (none's decode seconds per emitted token x theirs), and the same for its idle steps (the policy's
    own Python, the machine's drift between the two runs, and steps run with fewer rows once drafts put some rows
    ahead). The two add up to goodput's decode time / none's - 1 (both emit the same tokens)."""
    pol = "goodput"
    batches = sorted(b for b in cells if NONE in cells[b] and pol in cells[b])
    rowsout = []
    for b in batches:
        idle, over, draft, nd, total = [], [], [], [], []
        for rep, g in cells[b][pol]["by_rep"].items():
            n = cells[b][NONE]["by_rep"].get(rep)
            if n is None or g["steps"] is None or n["steps"] is None:
                continue
            gs, ns = g["steps"], n["steps"]
            tn = ns["idle_s"] + ns["draft_s"]
            per_token = tn / max(ns["emitted"], 1)   # none's seconds per emitted token (a step emits one a row)
            idle.append((gs["idle_s"] - per_token * (gs["emitted"] - gs["draft_emitted"])) / tn)
            over.append((gs["idle_over"] - ns["over"] / max(ns["emitted"], 1) * (gs["emitted"] - gs["draft_emitted"]))
                        / tn)
            draft.append((gs["draft_s"] - per_token * gs["draft_emitted"]) / tn)
            nd.append(gs["draft_steps"])
            total.append((gs["idle_s"] + gs["draft_s"]) / tn - 1.0)
        if total:
            rowsout.append(variants.row(
                "where", batch=b, steps=f"{statistics.fmean(nd):.1f}",
                draft_extra=f"{100 * statistics.fmean(draft):+.1f}",
                idle_extra=f"{100 * statistics.fmean(idle):+.1f}", outside=f"{100 * statistics.fmean(over):+.1f}",
                total=f"{100 * statistics.fmean(total):+.1f}"))
    return rowsout


def where(cells: dict) -> str | None:
    """`where_rows` as the results.md prints it; None where no run has its steps.csv."""
    rows = where_rows(cells)
    return "\n".join(variants.where_lines(rows)) if rows else None


def verdict(cells: dict, metric: str) -> dict:
    g = gaps(cells, metric)
    batches = sorted(cells)
    worst = {p: min(g[p][b] for b in batches if b in g[p]) for p in ADAPTIVE if p in g
             and all(b in g[p] for b in batches)}
    if not worst:
        return variants.row("verdict", metric=metric)
    best = max(worst, key=worst.get)
    per_batch = []
    for b in batches:
        ad = {p: g[p][b] for p in ADAPTIVE if p in g and b in g[p]}
        per_batch.append(max(ad.values()) if ad else float("nan"))
    return variants.row("verdict", metric=metric, policy=best, gap=f"{100 * worst[best]:+.1f}",
                        lo=f"{100 * min(per_batch):+.1f}", note="met" if worst[best] >= GOAL else "missed")


def figure(cells: dict, metric: str, out: Path) -> str:
    batches = sorted(cells)
    g = gaps(cells, metric)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
    ax = axes[0]
    for p in (NONE,) + FIXED + ADAPTIVE:
        if p not in g:
            continue
        xs = [b for b in batches if p in cells[b]]
        style = dict(ls="--", lw=1, color="0.5") if p in FIXED else dict(lw=1.6)
        if p == NONE:
            style = dict(lw=2, color="k")
        ax.plot(xs, [cells[b][p][metric] for b in xs], marker="o", ms=3, label=p, **style)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.set_xlabel("batch size")
    ax.set_ylabel(f"{metric} throughput (tok/s)")
    ax.set_title("real backend (CPU, tiny_pair): throughput", fontsize=9)
    ax.legend(fontsize=6, ncol=2)
    ax = axes[1]
    for p in ADAPTIVE:
        if p not in g:
            continue
        xs = [b for b in batches if b in g[p]]
        ax.plot(xs, [100 * g[p][b] for b in xs], marker="o", ms=3, lw=1.4, label=p)
    ax.axhline(0, color="k", lw=0.8)
    ax.axhline(100 * GOAL, color="r", lw=0.8, ls=":", label="goal -3%")
    ax.set_xscale("log", base=2)
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.set_xlabel("batch size")
    ax.set_ylabel("gap to max(none, best fixed) (%)")
    ax.set_title("adaptive policies vs the per-batch best static choice", fontsize=9)
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    name = f"real_pareto_{metric}.png"
    atomic_savefig(fig, out / name, dpi=130)
    plt.close(fig)
    return name


def noise(cells: dict) -> list[dict]:
    d = [abs(v["reps"][j] / v["reps"][i] - 1) for c in cells.values() for v in c.values()
         for i in range(len(v["reps"])) for j in range(i + 1, len(v["reps"]))]
    if not d:
        return []
    return [variants.row("noise", ratio=f"{100 * statistics.fmean(d):.1f}", hi=f"{100 * max(d):.1f}", n=len(d))]


def figures(sweep: Path, cells: dict) -> list[dict]:
    """The sweep's rows of variants.csv: every figure its results.md shows."""
    rows = [variants.row("runs", note=sweep, n=sum(len(c) for c in cells.values()))] + noise(cells)
    for metric in variants.METRICS:
        rows += [verdict(cells, metric)] + goal12(cells, metric) + table(cells, metric)
    return rows + where_rows(cells)


def report(sweep: Path, out: Path) -> tuple[str, list[dict]]:
    """results.md and the figures into `out`; the text and the rows of variants.csv."""
    cells = load(sweep)
    if not cells:
        raise SystemExit(f"no runs under {sweep}")
    out.mkdir(parents=True, exist_ok=True)
    rows = figures(sweep, cells)
    text = variants.render(rows)
    for metric in variants.METRICS:
        figure(cells, metric, out)
    atomic_write(out / "results.md", text)
    return text, rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep", nargs="?", default="outputs/multirun/real_pareto")
    ap.add_argument("--out", default=str(HERE))
    ap.add_argument("--readme", default=None)
    ap.add_argument("--table", default=None, help="also put the figures into this table (variants.csv)")
    ap.add_argument("--variant", default="default", help="the sweep's name in --table")
    a = ap.parse_args(argv)
    text, rows = report(Path(a.sweep), Path(a.out))
    print(text)
    if a.table:
        variants.write(Path(a.table), a.variant, rows)
    if a.readme:
        replace_results(a.readme, text)


if __name__ == "__main__":
    main()
