"""Tables and figures of the `long_context` study from runs.csv (written by sweep.py).

    .venv/bin/python experiments/long_context/analyze.py [--runs experiments/long_context/runs.csv]

Writes results.md (every table of the README) and speedup_<model>_<hardware>.png, best_depth.png,
tuned.png, moe.png next to runs.csv. Speed-up = decode throughput / decode throughput of no speculation in
the same cell (deployment, context, batch). Crossover batch of a fixed depth: between the last batch with
speed-up >= 1 and the first with < 1, interpolated linearly in log2(batch); the depth
still wins at the largest batch memory admits ("never (cap N)").
"""
from __future__ import annotations

import argparse
import csv
import math
from collections import defaultdict
from pathlib import Path

from specdepth.results import atomic_savefig, atomic_write

HERE = Path(__file__).resolve().parent
FIXED = ("fixed1", "fixed2", "fixed3", "fixed4", "fixed6", "fixed8")
DEPTH = {"none": 0, **{f: int(f[5:]) for f in FIXED}}
CTX_LABEL = {1024: "1k", 4096: "4k", 8192: "8k", 16384: "16k", 32768: "32k", 65536: "64k", 130928: "128k"}


def load(path: Path) -> list[dict]:
    rows = list(csv.DictReader(open(path)))
    for r in rows:
        for c in ("tp", "context", "batch", "requests", "memory_cap"):
            r[c] = int(r[c])
        for c in ("decode_tok_s", "throughput_tok_s", "mean_running", "peak_kv_gb"):
            r[c] = float(r[c])
    base = {_cell(r): r["decode_tok_s"] for r in rows if r["policy"] == "none"}
    for r in rows:
        r["speedup"] = r["decode_tok_s"] / base[_cell(r)]
    return rows


def _cell(r) -> tuple:
    return (r["model"], r["hardware"], r["context"], r["batch"])


def group(rows, *keys) -> dict:
    out = defaultdict(list)
    for r in rows:
        out[tuple(r[k] for k in keys)].append(r)
    return out


def crossover(points: list[tuple[int, float]], cap: int) -> str:
    """points: (batch, speed-up) sorted by batch."""
    if points[0][1] < 1:
        return f"< {points[0][0]}"
    for (b0, s0), (b1, s1) in zip(points, points[1:]):
        if s1 < 1 <= s0:
            x = math.log2(b0) + (s0 - 1) / (s0 - s1) * (math.log2(b1) - math.log2(b0))
            return f"{2 ** x:.0f}"
    return f"never (cap {cap})" if points[-1][0] == cap else f"> {points[-1][0]}"


def fmt_ctx(c: int) -> str:
    return CTX_LABEL.get(c, str(c))


def crossover_table(rows) -> list[str]:
    out = ["| model (TP) | hardware | context | memory cap | depth 1 | depth 2 | depth 3 | depth 4 |",
           "|---|---|---|---:|---:|---:|---:|---:|"]
    dense = [r for r in rows if r["part"] == "dense"]
    for (m, hw, ctx), rs in sorted(group(dense, "model", "hardware", "context").items()):
        cap = rs[0]["memory_cap"]
        cells = []
        for pol in FIXED[:4]:
            pts = sorted((r["batch"], r["speedup"]) for r in rs if r["policy"] == pol)
            cells.append(crossover(pts, cap))
        out.append(f"| {m} ({rs[0]['tp']}) | {hw} | {fmt_ctx(ctx)} | {cap} | " + " | ".join(cells) + " |")
    return out


def best_depth_table(rows, part="dense") -> list[str]:
    sel = [r for r in rows if r["part"] == part and r["policy"] in DEPTH]
    out = []
    for (m, hw), rs in sorted(group(sel, "model", "hardware").items()):
        batches = sorted({r["batch"] for r in rs if r["batch"] in (1, 2, 4, 8, 16, 32, 64, 128, 256)})
        out += [f"\n**{m} (TP {rs[0]['tp']}) on {hw}**: best fixed depth (its decode speed-up over none); "
                "`-`: past the memory limit; last column: the batch at the memory limit\n",
                "| context | " + " | ".join(f"b{b}" for b in batches) + " | at the limit |",
                "|---|" + "---:|" * (len(batches) + 1)]
        for (ctx,), rc in sorted(group(rs, "context").items()):
            cap = rc[0]["memory_cap"]
            cells = []
            for b in batches + [cap]:
                cand = [r for r in rc if r["batch"] == b]
                if not cand:
                    cells.append("-")
                    continue
                best = max(cand, key=lambda r: r["speedup"])
                label = f"{DEPTH[best['policy']]} ({best['speedup']:.2f})"
                cells.append(f"b{cap}: {label}" if b == cap and len(cells) == len(batches) else label)
            if cap > batches[-1]:
                cells[-1] = f"> b{batches[-1]}"
            out.append(f"| {fmt_ctx(ctx)} | " + " | ".join(cells) + " |")
    return out


def tuned_table(rows) -> list[str]:
    """Each tuned policy's decode throughput / the best fixed depth's, per context (mean and worst over batches)."""
    best = {}
    for cell, rs in group([r for r in rows if r["part"] == "dense"], "model", "hardware", "context", "batch").items():
        best[cell] = max(r["decode_tok_s"] for r in rs)
    tuned = [r for r in rows if r["part"] == "tuned"]
    pols = ("batch_table", "disable_by_batch", "goodput")
    out = ["| model (TP) | hardware | context | " + " | ".join(f"{p}: mean / worst" for p in pols) + " |",
           "|---|---|---|" + "---:|" * len(pols)]
    for (m, hw, ctx), rs in sorted(group(tuned, "model", "hardware", "context").items()):
        cells = []
        for p in pols:
            rel = [r["decode_tok_s"] / best[_cell(r)] for r in rs if r["policy"] == p]
            worst = min(rel)
            wb = [r["batch"] for r in rs if r["policy"] == p][rel.index(worst)]
            cells.append(f"{sum(rel) / len(rel):.3f} / {worst:.3f} (b{wb})")
        out.append(f"| {m} ({rs[0]['tp']}) | {hw} | {fmt_ctx(ctx)} | " + " | ".join(cells) + " |")
    return out


def moe_table(rows) -> list[str]:
    moe = [r for r in rows if r["part"] == "moe"]
    out = ["| hardware | context | batch | " + " | ".join(["depth 1", "depth 2", "depth 4", "depth 8", "goodput"])
           + " | best depth |", "|---|---|---:|" + "---:|" * 6]
    for (hw, ctx, b), rs in sorted(group(moe, "hardware", "context", "batch").items()):
        sp = {r["policy"]: r["speedup"] for r in rs}
        bestp = max((p for p in sp if p in DEPTH), key=lambda p: sp[p])
        cells = [f"{sp[p]:.2f}" for p in ("fixed1", "fixed2", "fixed4", "fixed8", "goodput")]
        cap = rs[0]["memory_cap"]
        out.append(f"| {hw} | {fmt_ctx(ctx)} | {b}{' (cap)' if b == cap else ''} | " + " | ".join(cells)
                   + f" | {DEPTH[bestp]} |")
    return out


def figures(rows, out_dir: Path) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    made = []
    dense = [r for r in rows if r["part"] == "dense"]
    for (m, hw), rs in sorted(group(dense, "model", "hardware").items()):
        ctxs = sorted({r["context"] for r in rs})
        fig, axes = plt.subplots(1, len(ctxs), figsize=(3.0 * len(ctxs), 3.0), sharey=True)
        for ax, ctx in zip(axes, ctxs):
            rc = [r for r in rs if r["context"] == ctx]
            for pol in FIXED:
                pts = sorted((r["batch"], r["speedup"]) for r in rc if r["policy"] == pol)
                ax.plot(*zip(*pts), marker="o", ms=3, label=f"depth {DEPTH[pol]}")
            ax.axhline(1.0, color="k", lw=0.8)
            ax.set_xscale("log", base=2)
            ax.set_title(f"{fmt_ctx(ctx)} (cap {rc[0]['memory_cap']})")
            ax.set_xlabel("batch")
        axes[0].set_ylabel("decode speed-up over none")
        axes[-1].legend(fontsize=7)
        fig.suptitle(f"{m} (TP {rs[0]['tp']}) on {hw}: fixed depths vs batch, per context")
        fig.tight_layout()
        name = f"speedup_{m}_{hw}.png"
        atomic_savefig(fig, out_dir / name, dpi=110)
        plt.close(fig)
        made.append(name)
    made.append(_best_depth_figure(plt, dense, out_dir))
    made.append(_tuned_figure(plt, rows, out_dir))
    made.append(_moe_figure(plt, rows, out_dir))
    return made


def _best_depth_figure(plt, dense, out_dir) -> str:
    import numpy as np
    keys = sorted(group(dense, "model", "hardware"))
    fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.4))
    for ax, key in zip(axes, keys):
        rs = group(dense, "model", "hardware")[key]
        ctxs = sorted({r["context"] for r in rs})
        bs = [1, 2, 4, 8, 16, 32, 64, 128, 256]
        grid = np.full((len(ctxs), len(bs)), np.nan)
        for i, ctx in enumerate(ctxs):
            for j, b in enumerate(bs):
                cand = [r for r in rs if r["context"] == ctx and r["batch"] == b]
                if cand:
                    grid[i, j] = DEPTH[max(cand, key=lambda r: r["speedup"])["policy"]]
        im = ax.imshow(grid, origin="lower", aspect="auto", vmin=0, vmax=8, cmap="viridis")
        ax.set_xticks(range(len(bs)), [str(b) for b in bs], fontsize=7)
        ax.set_yticks(range(len(ctxs)), [fmt_ctx(c) for c in ctxs])
        ax.set_xlabel("batch (blank: past the memory limit)")
        ax.set_title(f"{key[0]} on {key[1]}", fontsize=9)
    fig.colorbar(im, ax=axes, label="best fixed depth")
    atomic_savefig(fig, out_dir / "best_depth.png", dpi=110)
    plt.close(fig)
    return "best_depth.png"


def _tuned_figure(plt, rows, out_dir) -> str:
    keys = sorted(group([r for r in rows if r["part"] == "tuned"], "model", "hardware"))
    fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.2), sharey=True)
    best = {c: max(r["decode_tok_s"] for r in rs)
            for c, rs in group([r for r in rows if r["part"] == "dense"], "model", "hardware", "context",
                               "batch").items()}
    for ax, (m, hw) in zip(axes, keys):
        for pol, ls in (("batch_table", "-"), ("disable_by_batch", "--"), ("goodput", ":")):
            for ctx, color in ((1024, "C0"), (32768, "C3")):
                pts = sorted((r["batch"], r["decode_tok_s"] / best[_cell(r)]) for r in rows
                             if r["part"] == "tuned" and (r["model"], r["hardware"], r["context"], r["policy"])
                             == (m, hw, ctx, pol))
                ax.plot(*zip(*pts), ls=ls, color=color, marker="o", ms=3, label=f"{pol} @ {fmt_ctx(ctx)}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch")
        ax.set_title(f"{m} on {hw}", fontsize=9)
    axes[0].set_ylabel("decode throughput / best fixed depth")
    axes[-1].legend(fontsize=6)
    fig.tight_layout()
    atomic_savefig(fig, out_dir / "tuned.png", dpi=110)
    plt.close(fig)
    return "tuned.png"


def _moe_figure(plt, rows, out_dir) -> str:
    moe = [r for r in rows if r["part"] == "moe"]
    keys = sorted(group(moe, "hardware", "context"))
    fig, axes = plt.subplots(1, len(keys), figsize=(3.0 * len(keys), 3.0), sharey=True)
    for ax, (hw, ctx) in zip(axes, keys):
        rc = group(moe, "hardware", "context")[(hw, ctx)]
        for pol in (*FIXED, "goodput"):
            pts = sorted((r["batch"], r["speedup"]) for r in rc if r["policy"] == pol)
            ax.plot(*zip(*pts), marker="o", ms=3, ls=":" if pol == "goodput" else "-",
                    label=pol if pol == "goodput" else f"depth {DEPTH[pol]}")
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{hw}, {fmt_ctx(ctx)} (cap {rc[0]['memory_cap']})", fontsize=9)
        ax.set_xlabel("batch")
    axes[0].set_ylabel("decode speed-up over none")
    axes[-1].legend(fontsize=6)
    fig.suptitle("qwen3_30b_a3b (MoE, TP 1) + qwen3-0.6b draft")
    fig.tight_layout()
    atomic_savefig(fig, out_dir / "moe.png", dpi=110)
    plt.close(fig)
    return "moe.png"


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", default=str(HERE / "runs.csv"))
    a = ap.parse_args(argv)
    path = Path(a.runs)
    rows = load(path)
    parts = ["# long_context: tables (generated by analyze.py from runs.csv)\n",
             "## Crossover batch of fixed depths vs no speculation (decode throughput)\n", *crossover_table(rows),
             "\n## Best fixed depth per context and batch\n", *best_depth_table(rows),
             "\n## Policies tuned at 1k, relative to the best fixed depth of each cell\n", *tuned_table(rows),
             "\n## MoE: speed-up over none vs batch\n", *moe_table(rows)]
    atomic_write(path.parent / "results.md", "\n".join(parts) + "\n")
    print("\n".join(parts))
    print("figures:", ", ".join(figures(rows, path.parent)))


if __name__ == "__main__":
    main()
