"""Study `roofline` (simulator half): forward time vs tokens per forward, as the simulator's roofline cost
model predicts it for the llama3_8b target (and its llama3.2-1b draft) on h100_sxm, h200 and a100_80g.

    .venv/bin/python experiments/roofline/roofline.py [--out experiments/roofline] [--profile CSV ...]

No sweep: the cost model objects are built from the project's configs (conf/model, conf/hardware,
conf/cost) exactly as a run builds them, and asked for the time of one forward carrying n tokens:
  - `n x 1 @ ctx 0`: n sequences, one token each, empty KV caches (weights only; identical to one
    sequence carrying n tokens at context 0);
  - `n x 1 @ ctx 512`: n sequences, one token each, 512 tokens of KV cache each (decode of a batch).
Writes <out>/roofline.csv, <out>/roofline.png and prints a markdown table. `--profile` overlays measured
curves: CSVs with columns `tokens` and `forward_s` (optional `label`), e.g. cuda_roofline.py's output.
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import numpy as np
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from specdepth.app import CONF_DIR, make
from specdepth.results import atomic_open, atomic_savefig

HARDWARE = ("h100_sxm", "h200", "a100_80g")
TOKENS = sorted({int(round(2 ** (i / 4))) for i in range(0, 4 * 13 + 1)})   # 1 .. 8192, 4 points per octave


def cost_model(hardware: str, model: str = "llama3_8b"):
    """The run's cost model for (hardware, model), built from the configs like tests/test_core_formulas.py."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        c = compose("config", overrides=[f"hardware={hardware}", f"model={model}", "cost=roofline"])
    pair, hw = make(c, "model"), make(c, "hardware")
    return make(c, "cost", target=pair.target_arch, draft=pair.draft_arch, hardware=hw), hw


def curves(model: str = "llama3_8b") -> list[dict]:
    rows = []
    for name in HARDWARE:
        cost, hw = cost_model(name, model)
        ridge = cost.ridge_tokens(0.05)
        for n in TOKENS:
            for which, fwd in (("target", cost.target_forward), ("draft", cost.draft_forward)):
                for ctx in (0, 512):
                    t, flops = fwd(np.full(n, ctx, dtype=np.int64))
                    rows.append(dict(hardware=name, model=which, tokens=n, context=ctx, forward_s=t, flops=flops,
                                     ridge_tokens=ridge, nominal_ridge=hw.peak_tflops / hw.bandwidth_tbs,
                                     achieved_ridge=hw.ridge))
    return rows


def load_profiles(paths) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """Measured curves: CSVs with `tokens`, `forward_s` (and `label`), or specdepth-profile's CSV (model,
    batch, query, context, seconds, device, ...: one curve per (model, batch, context), tokens = batch x
    query), or cuda_roofline.py's (model, shape, tokens, forward_s)."""
    out = []
    for p in paths or []:
        with open(p) as f:
            rows = list(csv.DictReader(f))
        groups = {}
        for r in rows:
            if "seconds" in r:      # specdepth-profile
                key = f"{r['device']} {r['model']}, {r['batch']} seq x q tokens @ ctx {r['context']}"
                groups.setdefault(key, []).append((float(r["batch"]) * float(r["query"]), float(r["seconds"])))
                continue
            label = r.get("label") or (f"{r['gpu']} {r['model']} {r['shape']}" if "gpu" in r else Path(p).stem)
            groups.setdefault(label, []).append((float(r["tokens"]), float(r["forward_s"])))
        for label, pts in groups.items():
            pts.sort()
            out.append((label, np.array([x for x, _ in pts]), np.array([y for _, y in pts])))
    return out


def plot(rows: list[dict], path: Path, profiles=()) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, name in enumerate(HARDWARE):
        col = f"C{i}"
        for ctx, style in ((0, "-"), (512, "--")):
            sub = [r for r in rows if r["hardware"] == name and r["model"] == "target" and r["context"] == ctx]
            x = np.array([r["tokens"] for r in sub])
            y = np.array([r["forward_s"] for r in sub])
            lab = f"{name}, n x 1 @ ctx {ctx}"
            axes[0].plot(x, y * 1e3, style, color=col, label=lab)
            axes[1].plot(x, y / y[0], style, color=col, label=lab)
        ridge = next(r["ridge_tokens"] for r in rows if r["hardware"] == name)
        for ax in axes:
            ax.axvline(ridge, color=col, lw=0.7, ls=":")
        sub = [r for r in rows if r["hardware"] == name and r["model"] == "draft" and r["context"] == 0]
        axes[0].plot([r["tokens"] for r in sub], [r["forward_s"] * 1e3 for r in sub], "-", color=col, lw=0.8,
                     alpha=0.5, label=f"{name}, draft (1B) @ ctx 0")
    for j, (label, x, y) in enumerate(profiles):
        axes[0].plot(x, y * 1e3, "o-", color=f"C{3 + j}", ms=3, label=f"measured: {label}")
        axes[1].plot(x, y / y[0], "o-", color=f"C{3 + j}", ms=3, label=f"measured: {label}")
    axes[0].set_ylabel("forward time (ms)")
    axes[1].set_ylabel("forward time / time at 1 token")
    axes[0].set_title("llama3_8b target: roofline forward time", fontsize=10)
    axes[1].set_title("normalised (dotted: the engine's auto token budget)", fontsize=10)
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("tokens per forward")
        ax.grid(alpha=0.3, which="both")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=90)
    plt.close(fig)


def markdown(rows: list[dict]) -> str:
    show = (1, 8, 64, 128, 256, 512, 1024, 4096, 8192)
    lines = ["Target forward time (ms), n sequences x 1 token at context 0 (context 512 in brackets):", "",
             "| hardware | ridge (nominal FLOP/B) | ridge (achieved, mfu/mbu) | auto budget (tokens) | "
             + " | ".join(f"n={n}" for n in show) + " |",
             "|---|---:|---:|---:|" + "---:|" * len(show)]
    for name in HARDWARE:
        t = {(r["tokens"], r["context"]): r for r in rows if r["hardware"] == name and r["model"] == "target"}
        r0 = t[1, 0]
        lines.append(f"| {name} | {r0['nominal_ridge']:.0f} | {r0['achieved_ridge']:.0f} | {r0['ridge_tokens']} | "
                     + " | ".join(f"{t[n, 0]['forward_s'] * 1e3:.2f} ({t[n, 512]['forward_s'] * 1e3:.2f})"
                                  for n in show) + " |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent))
    ap.add_argument("--profile", nargs="*", help="measured CSVs (columns tokens, forward_s[, label]) to overlay")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = curves()
    with atomic_open(out / "roofline.csv") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
    plot(rows, out / "roofline.png", load_profiles(a.profile))
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
