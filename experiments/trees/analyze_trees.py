"""Study `trees`, analysis: runs.csv (run_trees.py) -> cells.csv, cells.md and trees.png.

    .venv/bin/python experiments/trees/analyze_trees.py experiments/trees/runs.csv [--out experiments/trees]

Per cell (deployment, profile, batch), each policy's end-to-end throughput averaged over the seeds, then: the
best fixed chain and the best static tree (the best of their families' means), and the ratios
  tree_vs_chain      max(none, best static tree) / max(none, best fixed chain) (tree_best may choose no tree)
  same_N             static tree of N nodes / chain of N, N = 2, 4, 8 (same node count)
  tg_vs_best         tree_goodput / max(none, best fixed chain, best static tree)    (goal >= 0.99)
  tg_vs_oracle       tree_goodput / tree_oracle                                      (goal >= 0.98)
  tg_vs_goodput      tree_goodput / goodput (the best adaptive chain)
  oracle_nodes       tree_oracle's mean nodes per sequence per step (the best node budget)
"""
from __future__ import annotations

import argparse
import csv
import sys
from collections import defaultdict
from pathlib import Path

from specdepth.results import atomic_savefig, atomic_write, csv_text

CELL = ("deployment", "profile", "batch")
OUT_COLUMNS = ("deployment", "profile", "batch", "none", "best_chain", "best_chain_policy", "best_static_tree",
               "best_static_tree_policy", "goodput", "tree_goodput", "tree_confidence", "tree_oracle",
               "tree_vs_chain", "same_N2", "same_N4", "same_N8", "tg_vs_best", "tg_vs_oracle", "tg_vs_goodput",
               "tc_vs_best", "oracle_nodes", "tg_nodes", "seeds")


def cells(path: Path) -> list[dict]:
    runs = list(csv.DictReader(open(path)))
    acc: dict = defaultdict(lambda: defaultdict(list))
    fam: dict = {}
    for r in runs:
        key = (r["deployment"], r["profile"], int(r["batch"]))
        acc[key][r["policy"]].append((float(r["throughput_tok_s"]), float(r["nodes_per_row"])))
        fam[r["policy"]] = r["family"]
    out = []
    for key, pols in acc.items():
        mean = {p: sum(v[0] for v in vs) / len(vs) for p, vs in pols.items()}
        nodes = {p: sum(v[1] for v in vs) / len(vs) for p, vs in pols.items()}
        out.append(_cell(key, mean, nodes, fam, min(len(vs) for vs in pols.values())))
    order = {d: i for i, d in enumerate(dict.fromkeys(r["deployment"] for r in runs))}
    return sorted(out, key=lambda c: (order[c["deployment"]], c["profile"], c["batch"]))


def _cell(key, mean: dict, nodes: dict, fam: dict, seeds: int) -> dict:
    chain = max((p for p in mean if fam[p] == "chain"), key=mean.get)
    static = max((p for p in mean if fam[p] == "static_tree"), key=mean.get)
    base = max(mean["none"], mean[chain], mean[static])
    c = dict(zip(CELL, key), none=mean["none"], best_chain=mean[chain], best_chain_policy=chain,
             best_static_tree=mean[static], best_static_tree_policy=static, seeds=seeds)
    for p in ("goodput", "tree_goodput", "tree_confidence", "tree_oracle"):
        c[p] = mean.get(p, float("nan"))
    c["tree_vs_chain"] = max(mean[static], mean["none"]) / max(mean[chain], mean["none"])   # either may not draft
    for n in (2, 4, 8):
        c[f"same_N{n}"] = mean.get(f"tree{n}", float("nan")) / mean.get(f"chain{n}", float("nan"))
    c["tg_vs_best"] = c["tree_goodput"] / base
    c["tg_vs_oracle"] = c["tree_goodput"] / c["tree_oracle"]
    c["tg_vs_goodput"] = c["tree_goodput"] / c["goodput"]
    c["tc_vs_best"] = c["tree_confidence"] / base
    c["oracle_nodes"] = nodes.get("tree_oracle", float("nan"))
    c["tg_nodes"] = nodes.get("tree_goodput", float("nan"))
    return c


def _fmt(v) -> str:
    return f"{v:.3f}" if isinstance(v, float) and abs(v) < 100 else (f"{v:.0f}" if isinstance(v, float) else str(v))


def markdown(rows: list[dict]) -> str:
    cols = ("deployment", "profile", "batch", "best_chain_policy", "best_static_tree_policy", "tree_vs_chain",
            "same_N4", "tg_vs_best", "tg_vs_oracle", "tg_vs_goodput", "tc_vs_best", "oracle_nodes")
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_fmt(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def headline(rows: list[dict]) -> str:
    """The goals, counted over cells, and the ratios' ranges by batch."""
    n = len(rows)
    best = sum(r["tg_vs_best"] >= 0.99 for r in rows)
    orc = sum(r["tg_vs_oracle"] >= 0.98 for r in rows)
    out = [f"cells: {n}; tree_goodput >= 0.99 x best of (none, best chain, best static tree): {best}/{n} "
           f"(min {min(r['tg_vs_best'] for r in rows):.3f}); within 2 % of tree_oracle: {orc}/{n} "
           f"(min {min(r['tg_vs_oracle'] for r in rows):.3f})", "",
           "| batch | best static tree / best chain (either or none): min, median, max | tree_goodput / best baseline: min, median, "
           "max | tree_goodput / goodput: median | tree_oracle nodes per sequence: min-max |", "|---|---|---|---|---|"]
    for b in sorted({r["batch"] for r in rows}):
        at = [r for r in rows if r["batch"] == b]
        out.append(f"| {b} | {_spread([r['tree_vs_chain'] for r in at])} | {_spread([r['tg_vs_best'] for r in at])} "
                   f"| {_median([r['tg_vs_goodput'] for r in at]):.3f} | "
                   f"{min(r['oracle_nodes'] for r in at):.1f}-{max(r['oracle_nodes'] for r in at):.1f} |")
    return "\n".join(out) + "\n"


def _median(v):
    v = sorted(v)
    return v[len(v) // 2] if len(v) % 2 else 0.5 * (v[len(v) // 2 - 1] + v[len(v) // 2])


def _spread(v) -> str:
    return f"{min(v):.3f}, {_median(v):.3f}, {max(v):.3f}"


def figure(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(1, 3, figsize=(15, 4.2))
    deps = list(dict.fromkeys(r["deployment"] for r in rows))
    profs = list(dict.fromkeys(r["profile"] for r in rows))
    for j, (key, title) in enumerate((("tree_vs_chain", "best static tree / best fixed chain (or none)"),
                                      ("tg_vs_best", "tree_goodput / best of none, chain, static tree"))):
        for p in profs:
            for d in deps:
                at = sorted((r for r in rows if r["profile"] == p and r["deployment"] == d), key=lambda r: r["batch"])
                ax[j].plot([r["batch"] for r in at], [r[key] for r in at], marker="o", ms=3, alpha=0.6,
                           color=f"C{profs.index(p)}", label=p if d == deps[0] else None)
        ax[j].axhline(1.0, color="k", lw=0.8)
        ax[j].set(xscale="log", xlabel="batch", title=title)
        ax[j].legend(title="profile (all deployments)", fontsize=8)
    for d in deps:
        at = sorted((r for r in rows if r["deployment"] == d and r["profile"] == profs[0]), key=lambda r: r["batch"])
        ax[2].plot([r["batch"] for r in at], [r["oracle_nodes"] for r in at], marker="o", label=d)
    ax[2].set(xscale="log", xlabel="batch", title=f"tree_oracle's nodes per sequence per step ({profs[0]})")
    ax[2].set_yscale("symlog", linthresh=1.0)   # 0: no speculation
    ax[2].set_ylim(bottom=0)
    ax[2].legend(fontsize=7)
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", type=Path)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    out = args.out or args.runs.parent
    rows = cells(args.runs)
    atomic_write(out / "cells.csv", csv_text(OUT_COLUMNS, [[r[c] for c in OUT_COLUMNS] for r in rows]))
    text = headline(rows)
    atomic_write(out / "cells.md", text + "\n" + markdown(rows))
    figure(rows, out / "trees.png")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
