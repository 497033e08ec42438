"""Study `leviathan`: the simulator's tokens per step, speed-ups and optimal depth against Leviathan et
al.'s closed forms. Reads the sweep of `specdepth experiment=leviathan`.

    .venv/bin/python experiments/leviathan/analyze.py outputs/multirun/leviathan [--out experiments/leviathan]

Closed forms (i.i.d. acceptance a, depth g, draft/target cost ratio c; Leviathan et al. 2023):
    tokens per step  E(a, g) = (1 - a^(g+1)) / (1 - a)        (bonus token included, no cap)
    speed-up         S(a, g, c) = E(a, g) / (g c + 1)
    optimal depth    g* = argmax_g S(a, g, c) over g = 0..16 (the engine's max_depth)
Simulated: tokens_per_step from summary.json; speed-up = throughput / throughput of depth 0 (no
speculation) in the same (a, c) cell. Writes <out>/leviathan.csv, <out>/optimal_depth.csv,
<out>/leviathan.png and prints the README's markdown tables.
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

from specdepth.report import collect
from specdepth.results import atomic_open, atomic_savefig

# optimal depths quoted by the reference notes (shared/reference/anchors.md) for Leviathan et al.'s setting
ANCHORS = {(0.8, 0.02): 11, (0.8, 0.05): 8, (0.8, 0.1): 6, (0.8, 0.2): 4, (0.7, 0.05): 6, (0.9, 0.05): 13}


def tokens(a: float, g: int) -> float:
    return (1 - a ** (g + 1)) / (1 - a)


def speedup(a: float, g: int, c: float) -> float:
    return tokens(a, g) / (g * c + 1)


def analyze(sweep_dir, out_dir) -> tuple[list[dict], list[dict]]:
    rows = collect(sweep_dir)
    if not rows:
        raise SystemExit(f"no finished runs under {sweep_dir}")
    runs = {}
    for r in rows:
        c = r["config"]
        runs[(float(c["acceptance.alpha"]), float(c["cost.draft_ratio"]), int(c["policy.depth"]))] = r
    table = []
    for (a, c, g), r in sorted(runs.items()):
        base = runs.get((a, c, 0))
        if base is None:
            continue
        s_sim = r["throughput_tok_s"] / base["throughput_tok_s"]
        table.append(dict(alpha=a, c=c, depth=g, steps=r["steps"], tokens_per_step=r["tokens_per_step"],
                          tokens_closed=tokens(a, g), tokens_rel_err=r["tokens_per_step"] / tokens(a, g) - 1,
                          speedup=s_sim, speedup_closed=speedup(a, g, c),
                          speedup_rel_err=s_sim / speedup(a, g, c) - 1))
    opt = []
    for a, c in sorted({(t["alpha"], t["c"]) for t in table}):
        cells = {t["depth"]: t for t in table if t["alpha"] == a and t["c"] == c}
        g_sim = max(cells, key=lambda g: cells[g]["speedup"])
        g_closed = max(cells, key=lambda g: cells[g]["speedup_closed"])
        opt.append(dict(alpha=a, c=c, g_anchor=ANCHORS.get((a, c)), g_closed=g_closed, g_sim=g_sim,
                        speedup_closed_at_g_closed=cells[g_closed]["speedup_closed"],
                        speedup_sim_at_g_sim=cells[g_sim]["speedup"],
                        speedup_sim_at_g_closed=cells[g_closed]["speedup"],
                        # how flat the optimum is: the closed-form loss of using the simulator's g*
                        closed_loss_at_g_sim=1 - cells[g_sim]["speedup_closed"] / cells[g_closed]["speedup_closed"],
                        worth_speculating=a > c))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, data in (("leviathan.csv", table), ("optimal_depth.csv", opt)):
        with atomic_open(out_dir / name) as f:
            w = csv.DictWriter(f, fieldnames=list(data[0]), lineterminator="\n")
            w.writeheader()
            for row in data:
                w.writerow({k: ("" if v is None else f"{v:.6g}" if isinstance(v, float) else v)
                            for k, v in row.items()})
    plot(table, opt, out_dir / "leviathan.png")
    return table, opt


def seed_spread(seed_dir, table) -> list[dict]:
    """Tokens per step at the seeds of a second sweep (`specdepth experiment=leviathan name=leviathan_seeds
    seed=1,2,3 ...`), next to the main sweep's seed 0, as relative errors against the closed form."""
    rows = collect(seed_dir)
    per = {}
    for r in rows:
        c = r["config"]
        a, g = float(c["acceptance.alpha"]), int(c["policy.depth"])
        if g:
            per.setdefault((a, g), {})[int(r["seed"])] = r["tokens_per_step"] / tokens(a, g) - 1
    for t in table:
        if (t["alpha"], t["depth"]) in per:
            per[t["alpha"], t["depth"]].setdefault(0, t["tokens_rel_err"])
    out = []
    for (a, g), errs in sorted(per.items()):
        row = dict(alpha=a, depth=g)
        row.update({f"seed{s}": e for s, e in sorted(errs.items())})
        row["mean"] = sum(errs.values()) / len(errs)
        out.append(row)
    return out


def plot(table, opt, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = sorted({(t["alpha"], t["c"]) for t in table})
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, (a, c) in enumerate(cells):
        col = f"C{i}"
        sub = sorted((t["depth"], t) for t in table if t["alpha"] == a and t["c"] == c)
        g = [d for d, _ in sub]
        axes[1].plot(g, [t["speedup_closed"] for _, t in sub], "-", color=col, lw=1)
        axes[1].plot(g, [t["speedup"] for _, t in sub], "o", color=col, ms=3.5, label=f"a={a}, c={c}")
        o = next(o for o in opt if o["alpha"] == a and o["c"] == c)
        axes[1].plot([o["g_sim"]], [o["speedup_sim_at_g_sim"]], "*", color=col, ms=11, mec="k", mew=0.5)
    for a in sorted({t["alpha"] for t in table}):
        c0 = min(c for aa, c in cells if aa == a)
        sub = sorted((t["depth"], t) for t in table if t["alpha"] == a and t["c"] == c0)
        col = f"C{cells.index((a, c0))}"
        axes[0].plot([d for d, _ in sub], [t["tokens_closed"] for _, t in sub], "-", color=col, lw=1)
        axes[0].plot([d for d, _ in sub], [t["tokens_per_step"] for _, t in sub], "o", color=col, ms=3.5,
                     label=f"a={a}")
    axes[0].set_ylabel("tokens per step")
    axes[0].set_title("tokens per step: simulated (markers) vs (1-a^(g+1))/(1-a)", fontsize=9)
    axes[1].set_ylabel("speed-up over no speculation")
    axes[1].set_title("speed-up: simulated (markers, star = argmax) vs E/(gc+1)", fontsize=9)
    for ax in axes:
        ax.set_xlabel("depth g")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=90)
    plt.close(fig)


def markdown(table, opt) -> str:
    alphas = sorted({t["alpha"] for t in table})
    depths = sorted({t["depth"] for t in table})
    show = [g for g in depths if g in (1, 2, 3, 4, 6, 8, 10, 12, 14, 16)]
    first = {a: min(t["c"] for t in table if t["alpha"] == a) for a in alphas}
    cell = {(t["alpha"], t["c"], t["depth"]): t for t in table}
    lines = ["Tokens per step, simulated (closed form), relative error:", "",
             "| alpha | " + " | ".join(f"g={g}" for g in show) + " |", "|---:|" + "---:|" * len(show)]
    for a in alphas:
        lines.append(f"| {a} | " + " | ".join(
            f"{cell[a, first[a], g]['tokens_per_step']:.3f} ({cell[a, first[a], g]['tokens_closed']:.3f}) "
            f"{cell[a, first[a], g]['tokens_rel_err']:+.1%}" for g in show) + " |")
    lines += ["", "Speed-up over no speculation, simulated (closed form), relative error:", "",
              "| alpha | c | " + " | ".join(f"g={g}" for g in show) + " |", "|---:|---:|" + "---:|" * len(show)]
    for a, c in sorted({(t["alpha"], t["c"]) for t in table}):
        lines.append(f"| {a} | {c} | " + " | ".join(
            f"{cell[a, c, g]['speedup']:.3f} ({cell[a, c, g]['speedup_closed']:.3f}) {cell[a, c, g]['speedup_rel_err']:+.1%}"
            for g in show) + " |")
    errs_t = [abs(t["tokens_rel_err"]) for t in table if t["depth"] > 0]
    errs_s = [abs(t["speedup_rel_err"]) for t in table if t["depth"] > 0]
    lines += ["", f"Over all {len(errs_t)} (alpha, c, g>0) cells: |relative error| of tokens per step: max "
                  f"{max(errs_t):.2%}, mean {sum(errs_t) / len(errs_t):.2%}; of the speed-up: max {max(errs_s):.2%}, "
                  f"mean {sum(errs_s) / len(errs_s):.2%}.", "",
              "Optimal depth g* (speed-up at it):", "",
              "| alpha | c | anchors | closed form | simulator | S closed at closed g* | S sim at sim g* | "
              "S sim at closed g* | closed-form loss at sim g* |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for o in opt:
        lines.append(f"| {o['alpha']} | {o['c']} | {o['g_anchor'] if o['g_anchor'] is not None else '-'} | "
                     f"{o['g_closed']} | {o['g_sim']} | {o['speedup_closed_at_g_closed']:.3f} | "
                     f"{o['speedup_sim_at_g_sim']:.3f} | {o['speedup_sim_at_g_closed']:.3f} | "
                     f"{o['closed_loss_at_g_sim']:.2%} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sweep_dir")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent))
    ap.add_argument("--seeds", help="a sweep of the same cells at other seeds (see seed_spread)")
    a = ap.parse_args(argv)
    table, opt = analyze(a.sweep_dir, a.out)
    print(markdown(table, opt))
    if a.seeds:
        spread = seed_spread(a.seeds, table)
        if spread:
            seeds = [k for k in spread[0] if k.startswith("seed")]
            with atomic_open(Path(a.out) / "seeds.csv") as f:
                w = csv.DictWriter(f, fieldnames=list(spread[0]), lineterminator="\n")
                w.writeheader()
                for row in spread:
                    w.writerow({k: f"{v:.6g}" if isinstance(v, float) else v for k, v in row.items()})
            print("\nTokens per step, relative error against the closed form, by seed:\n")
            print("| alpha | g | " + " | ".join(seeds) + " | mean |\n|---:|---:|" + "---:|" * (len(seeds) + 1))
            for row in spread:
                print(f"| {row['alpha']} | {row['depth']} | " + " | ".join(
                    f"{row[s]:+.2%}" if s in row else "-" for s in seeds) + f" | {row['mean']:+.2%} |")
            allm = [row["mean"] for row in spread]
            print(f"\nmean over depths of the {len(seeds)}-seed mean: {sum(allm) / len(allm):+.2%}; "
                  f"max |4-seed mean|: {max(abs(x) for x in allm):.2%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
