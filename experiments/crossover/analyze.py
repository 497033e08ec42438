"""Study `crossover`: where fixed-depth speculation stops beating no speculation, per alpha, hardware and
depth, and how the adaptive policies behave across it. Reads the sweep of `specdepth experiment=crossover`.

    .venv/bin/python experiments/crossover/analyze.py outputs/multirun/crossover [--out experiments/crossover]

Writes <out>/speedups.csv (every run: throughput and speed-up over no speculation at the same hardware,
alpha and batch size), <out>/crossover.csv (per hardware, alpha, depth: the crossover batch size),
<out>/crossover_fixed.png, <out>/adaptive.png, and prints the README's markdown tables.

Crossover batch: the speed-up is measured at powers of two; between the last batch size with speed-up
>= 1 and the first with < 1 it is interpolated linearly in log2(batch). Back-of-envelope comparison:
with E = (1 - a^(k+1)) / (1 - a) tokens per step and a flat forward cost up to R tokens (the roofline's
auto budget) and linear past it, fixed depth k wins by E at small batch and by about E R / (b (k+1))
once b (k+1) > R, so it crosses 1 near b = E R / (k + 1). Draft forwards move the real crossover left;
KV-cache reads move it right (they keep large batches memory-bound, so extra verify tokens stay cheap).
"""
from __future__ import annotations

import argparse
import csv
import math
import sys
from pathlib import Path

from specdepth.report import collect
from specdepth.results import atomic_open, atomic_savefig

FIXED = ("fixed1", "fixed2", "fixed4", "fixed8")


def load(sweep_dir) -> list[dict]:
    rows = collect(sweep_dir)
    out = []
    for r in rows:
        c = r["config"]
        out.append(dict(hardware=r["hardware"], alpha=float(c["acceptance.alpha"]), batch=int(r["batch_size"]),
                        pol=c.get("cell.pol") or r["policy"], label=r["policy"], throughput=r["throughput_tok_s"],
                        tokens_per_step=r["tokens_per_step"], draft_tokens=r["draft_tokens"],
                        tpot_p50_s=r["tpot_p50_s"], budget=r["token_budget"]))
    base = {(r["hardware"], r["alpha"], r["batch"]): r["throughput"] for r in out if r["pol"] == "none"}
    for r in out:
        b = base.get((r["hardware"], r["alpha"], r["batch"]))
        r["speedup"] = r["throughput"] / b if b and r["throughput"] else None
    return out


def crossover(points: list[tuple[int, float]]) -> tuple[str, float | None, int | None, int | None]:
    """(text, interpolated batch, last batch >= 1, first batch < 1) from (batch, speed-up) points."""
    pts = sorted(p for p in points if p[1] is not None)
    if not pts:
        return "-", None, None, None
    if pts[0][1] < 1:
        return f"never (< 1 at b{pts[0][0]})", None, None, pts[0][0]
    for (b0, s0), (b1, s1) in zip(pts, pts[1:]):
        if s0 >= 1 > s1:
            x = math.log2(b0) + (s0 - 1) / (s0 - s1) * (math.log2(b1) - math.log2(b0))
            return f"{2 ** x:.0f} ({b0}-{b1})", 2 ** x, b0, b1
    return f"> {pts[-1][0]}", None, pts[-1][0], None


def crossovers(rows: list[dict]) -> list[dict]:
    out = []
    for hw in sorted({r["hardware"] for r in rows}):
        for a in sorted({r["alpha"] for r in rows}):
            for pol in FIXED:
                pts = [(r["batch"], r["speedup"]) for r in rows
                       if r["hardware"] == hw and r["alpha"] == a and r["pol"] == pol]
                if not pts:
                    continue
                k = int(pol[5:])
                E = (1 - a ** (k + 1)) / (1 - a)
                R = next(r["budget"] for r in rows if r["hardware"] == hw)
                text, x, lo, hi = crossover(pts)
                s = dict(pts)
                out.append(dict(hardware=hw, alpha=a, depth=k, crossover_batch=x, last_win=lo, first_loss=hi,
                                text=text, envelope=E * R / (k + 1), speedup_b1=s.get(1), speedup_b512=s.get(512)))
    return out


def write_csv(rows: list[dict], path: Path) -> None:
    with atomic_open(path) as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if v is None else f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})


def plot_fixed(rows, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hws = [h for h in ("h100_sxm", "a100_80g", "h200") if any(r["hardware"] == h for r in rows)]
    alphas = sorted({r["alpha"] for r in rows})
    fig, axes = plt.subplots(len(alphas), len(hws), figsize=(4.2 * len(hws), 3.0 * len(alphas)), squeeze=False,
                             sharex=True, sharey=True)
    for i, a in enumerate(alphas):
        for j, hw in enumerate(hws):
            ax = axes[i, j]
            for n, pol in enumerate(FIXED):
                pts = sorted((r["batch"], r["speedup"]) for r in rows if r["hardware"] == hw and r["alpha"] == a
                             and r["pol"] == pol and r["speedup"] is not None)
                ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", ms=3, color=f"C{n}", label=f"depth {pol[5:]}")
            ax.axhline(1, color="grey", ls=":", lw=0.8)
            ax.set_xscale("log", base=2)
            ax.set_title(f"{hw}, alpha {a}", fontsize=9)
            ax.grid(alpha=0.3)
            if i == len(alphas) - 1:
                ax.set_xlabel("batch size")
            if j == 0:
                ax.set_ylabel("speed-up over none")
    axes[0, 0].legend(fontsize=7)
    fig.suptitle("Fixed depth vs no speculation (llama3_8b + 1B draft, roofline, i.i.d. acceptance)", fontsize=10)
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=80)
    plt.close(fig)


def plot_adaptive(rows, path: Path, hw: str = "h100_sxm") -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    alphas = sorted({r["alpha"] for r in rows})
    pols = sorted({r["pol"] for r in rows if r["hardware"] == hw and r["pol"] not in FIXED + ("none",)})
    fig, axes = plt.subplots(1, len(alphas), figsize=(4.6 * len(alphas), 4.4), squeeze=False)
    for ax, a in zip(axes[0], alphas):
        sub = [r for r in rows if r["hardware"] == hw and r["alpha"] == a and r["speedup"] is not None]
        best = {}
        for r in sub:
            if r["pol"] in FIXED + ("none",):
                best[r["batch"]] = max(best.get(r["batch"], 0), r["speedup"])
        xs = sorted(best)
        ax.fill_between(xs, [0] * len(xs), [best[x] for x in xs], color="grey", alpha=0.15,
                        label="best of none / fixed 1,2,4,8")
        for n, pol in enumerate(pols):
            pts = sorted((r["batch"], r["speedup"]) for r in sub if r["pol"] == pol)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=2.5, lw=1, color=f"C{n % 10}",
                    ls="-" if n < 10 else "--", label=pol)
        ax.axhline(1, color="grey", ls=":", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_ylim(bottom=0)
        ax.set_title(f"{hw}, alpha {a}", fontsize=9)
        ax.set_xlabel("batch size")
        ax.grid(alpha=0.3)
    axes[0, 0].set_ylabel("speed-up over none")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=6, fontsize=7)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    atomic_savefig(fig, path, dpi=80)
    plt.close(fig)


def markdown(rows: list[dict], cross: list[dict], hw: str = "h100_sxm") -> str:
    depths = sorted({c["depth"] for c in cross})
    lines = ["Crossover batch size of fixed depth k (speed-up over no speculation falls below 1; interpolated "
             "in log2 batch, bracket of measured batch sizes; back-of-envelope E R/(k+1) in brackets):", "",
             "| hardware | alpha | " + " | ".join(f"depth {k}" for k in depths) + " |",
             "|---|---:|" + "---:|" * len(depths)]
    cell = {(c["hardware"], c["alpha"], c["depth"]): c for c in cross}
    for h in sorted({c["hardware"] for c in cross}):
        for a in sorted({c["alpha"] for c in cross}):
            lines.append(f"| {h} | {a} | " + " | ".join(
                f"{cell[h, a, k]['text']} [{cell[h, a, k]['envelope']:.0f}]" if (h, a, k) in cell else "-"
                for k in depths) + " |")
    lines += ["", "Speed-up over no speculation at batch 1 / batch 512:", "",
              "| hardware | alpha | " + " | ".join(f"depth {k}" for k in depths) + " |",
              "|---|---:|" + "---:|" * len(depths)]
    for h in sorted({c["hardware"] for c in cross}):
        for a in sorted({c["alpha"] for c in cross}):
            lines.append(f"| {h} | {a} | " + " | ".join(
                f"{cell[h, a, k]['speedup_b1']:.2f} / {cell[h, a, k]['speedup_b512']:.2f}"
                if (h, a, k) in cell and cell[h, a, k]['speedup_b512'] is not None else "-" for k in depths) + " |")
    # adaptive policies on one hardware: speed-up per batch, and against the best of none/fixed
    sub = [r for r in rows if r["hardware"] == hw and r["speedup"] is not None]
    pols = sorted({r["pol"] for r in sub if r["pol"] not in FIXED + ("none",)})
    batches = sorted({r["batch"] for r in sub})
    for a in sorted({r["alpha"] for r in sub}):
        s = {(r["pol"], r["batch"]): r["speedup"] for r in sub if r["alpha"] == a}
        best = {b: max(v for (p, bb), v in s.items() if bb == b and p in FIXED + ("none",)) for b in batches}
        lines += ["", f"{hw}, alpha {a}: speed-up over no speculation by batch size; last columns: worst and "
                      f"geometric mean over batch sizes of throughput / best of (none, fixed 1, 2, 4, 8):", "",
                  "| policy | " + " | ".join(f"b{b}" for b in batches) + " | worst vs best fixed | geomean vs best fixed |",
                  "|---|" + "---:|" * (len(batches) + 2)]
        for p in ["best fixed/none"] + pols:
            if p == "best fixed/none":
                vals = [best[b] for b in batches]
                rel = [1.0] * len(batches)
            else:
                vals = [s.get((p, b)) for b in batches]
                rel = [v / best[b] for v, b in zip(vals, batches) if v is not None]
            g = math.exp(sum(math.log(x) for x in rel) / len(rel)) if rel else None
            lines.append(f"| {p} | " + " | ".join("-" if v is None else f"{v:.2f}" for v in vals)
                         + f" | {min(rel):.2f} | {g:.3f} |")
    return "\n".join(lines)


def analyze(sweep_dir, out_dir) -> tuple[list[dict], list[dict]]:
    rows = load(sweep_dir)
    if not rows:
        raise SystemExit(f"no finished runs under {sweep_dir}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows.sort(key=lambda r: (r["hardware"], r["alpha"], r["pol"], r["batch"]))
    write_csv(rows, out_dir / "speedups.csv")
    cross = crossovers(rows)
    if cross:
        write_csv(cross, out_dir / "crossover.csv")
        plot_fixed(rows, out_dir / "crossover_fixed.png")
    if any(r["pol"] not in FIXED + ("none",) for r in rows):
        plot_adaptive(rows, out_dir / "adaptive.png")
    return rows, cross


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sweep_dir")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent))
    a = ap.parse_args(argv)
    rows, cross = analyze(a.sweep_dir, a.out)
    print(markdown(rows, cross))
    return 0


if __name__ == "__main__":
    sys.exit(main())
