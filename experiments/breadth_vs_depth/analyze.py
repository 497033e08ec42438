"""Study `breadth_vs_depth` (simulator half): 5 sequences x 1 token vs 1 sequence x 5 tokens per verify.
Reads the sweep of `specdepth experiment=breadth_vs_depth`.

    .venv/bin/python experiments/breadth_vs_depth/analyze.py outputs/multirun/breadth_vs_depth [--out DIR]

Per alpha, from each run's steps.csv (decode steps only: the rows that admitted nothing):
  verify tokens per step, verify seconds per step, target FLOPs per step, tokens emitted per step (all
  sequences together), and the sequence's progress per step (summary tokens_per_step) against
  (1 - a^5) / (1 - a). Also, straight from the cost model (no run): one forward of 5 x 1 vs 1 x 5 tokens
  at context 512 on every hardware entry. Writes <out>/breadth_vs_depth.csv, <out>/cost_model.csv and
  <out>/breadth_vs_depth.png; prints the README's tables.
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import numpy as np

from specdepth.report import collect
from specdepth.results import atomic_open, atomic_savefig


def decode_steps(run_dir: str) -> dict:
    with open(Path(run_dir) / "steps.csv") as f:
        rows = [r for r in csv.DictReader(f) if int(r["admitted"]) == 0]
    n = len(rows)
    tot = lambda k: sum(float(r[k]) for r in rows)
    return dict(steps=n, verify_tokens=tot("verify_tokens") / n, verify_s=tot("verify_s") / n,
                draft_s=tot("draft_s") / n, target_flops=tot("target_flops") / n, emitted=tot("emitted") / n)


def cost_model_rows(ctx: int = 512) -> list[dict]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "roofline"))
    from roofline import cost_model

    out = []
    for hw in ("h100_sxm", "h200", "a100_80g"):
        cost, _ = cost_model(hw)
        t1, f1 = cost.target_forward(np.full(5, ctx), np.ones(5, dtype=np.int64))   # breadth
        t5, f5 = cost.target_forward(np.array([ctx]), np.array([5]))               # depth
        t0, _ = cost.target_forward(np.array([ctx]), np.array([1]))                # one token
        out.append(dict(hardware=hw, context=ctx, one_token_s=t0, breadth_5x1_s=t1, depth_1x5_s=t5,
                        time_ratio=t5 / t1, breadth_flops=f1, depth_flops=f5, flops_ratio=f5 / f1))
    return out


def analyze(sweep_dir, out_dir) -> tuple[list[dict], list[dict]]:
    rows = collect(sweep_dir)
    if not rows:
        raise SystemExit(f"no finished runs under {sweep_dir}")
    by = {}
    for r in rows:
        c = r["config"]
        by[(float(c["acceptance.alpha"]), c["shape.name"])] = (r, decode_steps(r["run_dir"]))
    table = []
    for a in sorted({k[0] for k in by}):
        if (a, "breadth") not in by or (a, "depth") not in by:
            continue
        (rb, sb), (rd, sd) = by[a, "breadth"], by[a, "depth"]
        closed = (1 - a ** 5) / (1 - a)
        table.append(dict(
            alpha=a,
            breadth_verify_tokens=sb["verify_tokens"], depth_verify_tokens=sd["verify_tokens"],
            breadth_verify_ms=sb["verify_s"] * 1e3, depth_verify_ms=sd["verify_s"] * 1e3,
            verify_time_ratio=sd["verify_s"] / sb["verify_s"],
            target_flops_ratio=sd["target_flops"] / sb["target_flops"],
            breadth_tokens_per_forward=sb["emitted"], depth_tokens_per_forward=sd["emitted"],
            depth_tokens_per_step=rd["tokens_per_step"], closed_form=closed,
            rel_err=rd["tokens_per_step"] / closed - 1,
            depth_draft_ms_per_step=sd["draft_s"] * 1e3,
            breadth_throughput=rb["throughput_tok_s"], depth_throughput=rd["throughput_tok_s"]))
    cm = cost_model_rows()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, data in (("breadth_vs_depth.csv", table), ("cost_model.csv", cm)):
        with atomic_open(out_dir / name) as f:
            w = csv.DictWriter(f, fieldnames=list(data[0]), lineterminator="\n")
            w.writeheader()
            for row in data:
                w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()})
    plot(table, out_dir / "breadth_vs_depth.png")
    return table, cm


def plot(table, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    a = np.array([t["alpha"] for t in table])
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    w = 0.025
    axes[0].bar(a - w / 2, [t["breadth_tokens_per_forward"] for t in table], w, label="5 seqs x 1 token (breadth)")
    axes[0].bar(a + w / 2, [t["depth_tokens_per_forward"] for t in table], w, label="1 seq x 5 tokens (depth 4)")
    xs = np.linspace(a.min() - 0.03, a.max() + 0.03, 50)
    axes[0].plot(xs, (1 - xs ** 5) / (1 - xs), "k-", lw=1, label="(1 - a^5) / (1 - a)")
    axes[0].set_ylabel("tokens emitted per verify forward")
    axes[0].set_xlabel("acceptance alpha (i.i.d.)")
    axes[0].legend(fontsize=8)
    axes[0].set_title("same verify forward, different progress", fontsize=10)
    axes[1].plot(a, [t["breadth_verify_ms"] for t in table], "o-", label="breadth: verify ms / step")
    axes[1].plot(a, [t["depth_verify_ms"] for t in table], "s--", label="depth: verify ms / step")
    axes[1].plot(a, [t["depth_verify_ms"] + t["depth_draft_ms_per_step"] for t in table], "^:",
                 label="depth: verify + 4 draft forwards")
    axes[1].set_ylim(bottom=0)
    axes[1].set_xlabel("acceptance alpha (i.i.d.)")
    axes[1].set_ylabel("ms per engine step")
    axes[1].legend(fontsize=8)
    axes[1].set_title("simulated time per step (h100_sxm, llama3_8b)", fontsize=10)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=90)
    plt.close(fig)


def markdown(table, cm) -> str:
    lines = ["| alpha | verify tokens / step (breadth, depth) | verify ms / step (breadth, depth) | target FLOPs "
             "ratio depth/breadth | tokens / forward, breadth | tokens / forward, depth | (1-a^5)/(1-a) | rel. err |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for t in table:
        lines.append(f"| {t['alpha']} | {t['breadth_verify_tokens']:.2f}, {t['depth_verify_tokens']:.2f} | "
                     f"{t['breadth_verify_ms']:.3f}, {t['depth_verify_ms']:.3f} | {t['target_flops_ratio']:.3f} | "
                     f"{t['breadth_tokens_per_forward']:.3f} | {t['depth_tokens_per_forward']:.3f} | "
                     f"{t['closed_form']:.3f} | {t['rel_err']:+.2%} |")
    lines += ["", "One target forward at context 512, from the cost model:", "",
              "| hardware | 1 x 1 (ms) | 5 x 1 (ms) | 1 x 5 (ms) | time 1x5 / 5x1 | FLOPs 1x5 / 5x1 |",
              "|---|---:|---:|---:|---:|---:|"]
    for r in cm:
        lines.append(f"| {r['hardware']} | {r['one_token_s'] * 1e3:.3f} | {r['breadth_5x1_s'] * 1e3:.3f} | "
                     f"{r['depth_1x5_s'] * 1e3:.3f} | {r['time_ratio']:.4f} | {r['flops_ratio']:.4f} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sweep_dir")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent))
    a = ap.parse_args(argv)
    table, cm = analyze(a.sweep_dir, a.out)
    print(markdown(table, cm))
    return 0


if __name__ == "__main__":
    sys.exit(main())
