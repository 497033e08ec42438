"""Study `breadth_vs_depth` (real-CPU half): time one target forward carrying the same number of new
tokens as breadth (m sequences x 1 token) or depth (1 sequence x m tokens), with real forwards of a
small Llama on this CPU, through the real backend's own forward path (specdepth.hf.Runner: the SlotCache
KV cache, explicit causal masks and position ids that `backend=hf` verifies with).

    .venv/bin/python experiments/breadth_vs_depth/cpu_forward.py [--out experiments/breadth_vs_depth]

Model: random weights (no download), LlamaConfig(vocab 32000, hidden 256, 8 layers, 8 heads, 4 KV heads,
intermediate 1024): 24M parameters, float32, one torch thread. Every row has `--context` tokens of KV
cache (values irrelevant to the timing). Shapes are timed interleaved (round-robin) to share the noise
of a busy machine; the median and the 10/90th percentiles of `--reps` forwards are reported.
Writes <out>/cpu_forward.csv and prints a markdown table.
"""
from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from pathlib import Path

import numpy as np

SHAPES = ((1, 1), (5, 1), (1, 5), (20, 1), (4, 5), (1, 20))   # (sequences, tokens each)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent))
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--reps", type=int, default=60)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from specdepth.hf import Runner
    from specdepth.results import atomic_open

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=32000, hidden_size=256, num_hidden_layers=8, num_attention_heads=8,
                      num_key_value_heads=4, intermediate_size=1024, max_position_embeddings=4096,
                      attn_implementation="sdpa")
    model = LlamaForCausalLM(cfg).eval()
    params = sum(p.numel() for p in model.parameters())
    runner = Runner(model, max_rows=max(s for s, _ in SHAPES), max_len=a.context + 32)
    rng = np.random.default_rng(0)
    times = {s: [] for s in SHAPES}
    with torch.inference_mode():
        for rep in range(a.reps + 3):
            for seqs, q in SHAPES:
                tokens = rng.integers(0, cfg.vocab_size, (seqs, q))
                lens = np.full(seqs, a.context)
                before = runner.forward_s
                runner.forward(np.arange(seqs), tokens, lens, want="all")   # verify returns every position
                if rep >= 3:
                    times[(seqs, q)].append(runner.forward_s - before)
    rows = []
    for (seqs, q), ts in times.items():
        ts = sorted(ts)
        rows.append(dict(sequences=seqs, tokens_each=q, tokens=seqs * q, context=a.context,
                         median_ms=statistics.median(ts) * 1e3, p10_ms=ts[len(ts) // 10] * 1e3,
                         p90_ms=ts[(9 * len(ts)) // 10] * 1e3, reps=len(ts), params=params, threads=a.threads,
                         torch=torch.__version__))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_open(out / "cpu_forward.csv") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in r.items()})
    print(f"{params / 1e6:.1f}M-parameter Llama (random weights, float32), {a.threads} torch thread(s), "
          f"context {a.context}, {a.reps} forwards per shape, {time.strftime('%Y-%m-%d %H:%M')}\n")
    print("| shape (sequences x tokens) | tokens | median ms | p10 ms | p90 ms |\n|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['sequences']} x {r['tokens_each']} | {r['tokens']} | {r['median_ms']:.2f} | {r['p10_ms']:.2f} | "
              f"{r['p90_ms']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
