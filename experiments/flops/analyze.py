"""Study `flops`: FLOPs per emitted token and engine steps, speculation vs none, against the analytic
expectation. Reads the sweep of `specdepth experiment=flops`.

    .venv/bin/python experiments/flops/analyze.py outputs/multirun/flops [--out experiments/flops]

Writes <out>/flops.csv and <out>/flops.png and prints the markdown table for the README.

Decode-only numbers come from each run's steps.csv (the rows with no admission: the prefill, the same
in every run, is left out); the summary's flops_per_token (prefill included) is reported next to them.
Analytic expectation, per sequence-step at depth k with i.i.d. acceptance alpha:
    E = (1 - alpha^(k+1)) / (1 - alpha) emitted tokens (Leviathan et al.),
    target FLOPs = F_t(k+1 tokens), draft FLOPs = k draft forwards F_d(1 token),
so FLOPs per emitted token / no speculation = [F_t(k+1) + k F_d] / (E F_t(1)) ~ [(k+1) + k r] / E with
r = F_d / F_t; steps / no speculation = 1 / E. The exact expectation below evaluates F_t and F_d with the
cost model's own FLOP formula (attention included) at the run's mean context.
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import numpy as np

from specdepth.cost import forward_flops
from specdepth.models import ModelArch
from specdepth.report import collect
from specdepth.results import atomic_open, atomic_savefig


def decode_only(run_dir: str) -> tuple[float, float, int, float]:
    """(FLOPs, emitted tokens, steps, mean context) over the steps that admitted nothing."""
    with open(Path(run_dir) / "steps.csv") as f:
        rows = [r for r in csv.DictReader(f) if int(r["admitted"]) == 0]
    flops = sum(float(r["target_flops"]) + float(r["draft_flops"]) for r in rows)
    emitted = sum(int(r["emitted"]) for r in rows)
    return flops, emitted, len(rows), 0.0


def arch(cfg: dict, which: str) -> ModelArch:
    keys = {k.split(".", 2)[2]: v for k, v in cfg.items() if k.startswith(f"model.{which}_arch.")}
    return ModelArch.build(keys, f"model.{which}_arch")


def expected(alpha: float, k: int, t: ModelArch, d: ModelArch, ctx: float) -> tuple[float, float, float, float]:
    """(FLOPs ratio, steps ratio, extra from rejected verifies, extra from drafting), per emitted token,
    relative to no speculation at the same context."""
    E = (1 - alpha ** (k + 1)) / (1 - alpha) if alpha < 1 else k + 1.0
    c = np.array([ctx])
    base = forward_flops(t, c, np.array([1]))
    verify = forward_flops(t, c, np.array([k + 1]))
    draft = sum(forward_flops(d, c + p) for p in range(k))
    ratio = (verify + draft) / (E * base)
    # decomposition of the extra: verified tokens that were not emitted, and the draft forwards
    rejected = (verify - E * base) / (E * base)
    return ratio, 1.0 / E, rejected, draft / (E * base)


def analyze(sweep_dir, out_dir) -> list[dict]:
    rows = collect(sweep_dir)
    if not rows:
        raise SystemExit(f"no finished runs under {sweep_dir}")
    table = {}
    for r in rows:
        c = r["config"]
        f, e, s, _ = decode_only(r["run_dir"])
        table[(float(c["acceptance.alpha"]), int(c["policy.depth"]))] = dict(
            row=r, flops_tok=f / e, steps=r["steps"], t=arch(c, "target"), d=arch(c, "draft"),
            ctx=float(c["workload.prompt_len"]) + float(c["workload.output_len"]) / 2)
    out = []
    for (a, k), v in sorted(table.items()):
        base = table.get((a, 0))
        if base is None:
            continue
        r = v["row"]
        ratio_sim = v["flops_tok"] / base["flops_tok"]
        exp_ratio, exp_steps, rej, dr = expected(a, k, v["t"], v["d"], v["ctx"])
        # the same accounting with the run's own tokens per step instead of E: isolates the FLOP
        # bookkeeping from the sampling error of a 2048-token run
        E_exp = 1 / exp_steps
        acct = exp_ratio * E_exp / r["tokens_per_step"]
        out.append(dict(
            alpha=a, depth=k, tokens_per_step=r["tokens_per_step"],
            flops_per_token=v["flops_tok"], flops_ratio=ratio_sim, flops_ratio_expected=exp_ratio,
            flops_ratio_rel_err=ratio_sim / exp_ratio - 1,
            flops_ratio_given_tps=acct, accounting_rel_err=ratio_sim / acct - 1,
            extra_rejected_verify=rej, extra_draft=dr,
            summary_flops_ratio=r["flops_per_token"] / base["row"]["flops_per_token"],
            steps=v["steps"], steps_ratio=v["steps"] / base["steps"], steps_ratio_expected=exp_steps,
            speedup_h100=r["throughput_tok_s"] / base["row"]["throughput_tok_s"]))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with atomic_open(out_dir / "flops.csv") as f:
        w = csv.DictWriter(f, fieldnames=list(out[0]), lineterminator="\n")
        w.writeheader()
        for row in out:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()})
    plot(out, out_dir / "flops.png")
    return out


def plot(out: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    depths = sorted({r["depth"] for r in out if r["depth"] > 0})
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for i, k in enumerate(depths):
        pts = sorted((r["alpha"], r) for r in out if r["depth"] == k)
        a = [p for p, _ in pts]
        col = f"C{i}"
        axes[0].plot(a, [r["flops_ratio"] for _, r in pts], "o", color=col, ms=4, label=f"depth {k}")
        axes[0].plot(a, [r["flops_ratio_expected"] for _, r in pts], "-", color=col, lw=1)
        axes[1].plot(a, [r["steps_ratio"] for _, r in pts], "o", color=col, ms=4, label=f"depth {k}")
        axes[1].plot(a, [r["steps_ratio_expected"] for _, r in pts], "-", color=col, lw=1)
    axes[0].axhline(1, color="grey", ls=":", lw=0.8)
    axes[0].set_title("FLOPs per emitted token / no speculation (decode)", fontsize=10)
    axes[1].set_title("engine steps / no speculation", fontsize=10)
    for ax in axes:
        ax.set_xlabel("acceptance alpha (i.i.d.)")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8, ncol=2)
    fig.text(0.5, 0.005, "markers: simulator (llama3_8b + llama3.2-1b, batch 1, 2048 tokens); "
             "lines: analytic expectation", ha="center", fontsize=8)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    atomic_savefig(fig, path, dpi=90)
    plt.close(fig)


def markdown(out: list[dict]) -> str:
    alphas = sorted({r["alpha"] for r in out})
    depths = sorted({r["depth"] for r in out if r["depth"] > 0})
    cell = {(r["alpha"], r["depth"]): r for r in out}
    lines = ["FLOPs per emitted token / no speculation, simulated (expected); decode steps only:", "",
             "| alpha | " + " | ".join(f"depth {k}" for k in depths) + " |",
             "|---:|" + "---:|" * len(depths)]
    for a in alphas:
        lines.append(f"| {a} | " + " | ".join(
            f"{cell[a, k]['flops_ratio']:.3f} ({cell[a, k]['flops_ratio_expected']:.3f})" for k in depths) + " |")
    lines += ["", "Engine steps / no speculation, simulated (expected 1/E):", "",
              "| alpha | " + " | ".join(f"depth {k}" for k in depths) + " |",
              "|---:|" + "---:|" * len(depths)]
    for a in alphas:
        lines.append(f"| {a} | " + " | ".join(
            f"{cell[a, k]['steps_ratio']:.3f} ({cell[a, k]['steps_ratio_expected']:.3f})" for k in depths) + " |")
    lines += ["", "Where the extra FLOPs go (fraction of no speculation's FLOPs per token; expected): "
              "rejected verify tokens + draft forwards:", "",
              "| alpha | " + " | ".join(f"depth {k}" for k in depths) + " |",
              "|---:|" + "---:|" * len(depths)]
    for a in alphas:
        lines.append(f"| {a} | " + " | ".join(
            f"{cell[a, k]['extra_rejected_verify']:.2f} + {cell[a, k]['extra_draft']:.2f}" for k in depths) + " |")
    errs = [abs(r["flops_ratio_rel_err"]) for r in out if r["depth"] > 0]
    acct = [abs(r["accounting_rel_err"]) for r in out if r["depth"] > 0]
    lines += ["", f"max |simulated / expected - 1| of the FLOPs ratio over {len(errs)} cells: {max(errs):.2%} "
                  f"(mean {sum(errs) / len(errs):.2%}); with the run's own tokens per step in place of E "
                  f"(the FLOP bookkeeping alone, without the sampling error of E): max {max(acct):.2%}"]
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sweep_dir")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent))
    a = ap.parse_args(argv)
    out = analyze(a.sweep_dir, a.out)
    print(markdown(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
