"""One-shot roofline measurement for a CUDA machine (a few minutes; no download, no network).

Builds a Llama-3.1-8B-architecture target and a Llama-3.2-1B-architecture draft from `LlamaConfig` with
random weights in bf16 on the GPU (the numbers are conf/model/llama3_8b.yaml's, i.e. the models'
public config.json), times one forward over n tokens for n = 1 .. 4096, and writes, beside the
simulator's roofline prediction for the same GPU:

    <out>/cuda_roofline.csv   gpu, model, shape, tokens, forward_s (median), p10_s, p90_s, predicted_s
    <out>/cuda_roofline.png   measured (markers) vs the simulator's roofline (lines), target and draft

Shapes (both with empty KV caches, like roofline.py's `n x 1 @ ctx 0` curve):
    batch:  n sequences x 1 token   (input [n, 1])
    verify: 1 sequence x n tokens   (input [1, n], causal)

    python experiments/roofline/cuda_roofline.py                       # on the GPU machine
    python experiments/roofline/cuda_roofline.py --hardware h100_sxm   # name the simulator's entry
    python experiments/roofline/cuda_roofline.py --device cpu --tiny   # smoke test of this script on CPU

Needs torch (a CUDA build) and transformers; the prediction needs specdepth importable (pip install -e .
or PYTHONPATH=src); without it the CSV's predicted_s is empty. Timing: CUDA events around each forward,
3 warm-up forwards, then `--reps` timed ones (median, p10, p90), torch.inference_mode, sdpa attention.
"""
from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# conf/model/llama3_8b.yaml (Llama-3.1-8B and Llama-3.2-1B config.json)
TARGET = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
              num_key_value_heads=8, head_dim=128, vocab_size=128256, tie_word_embeddings=False,
              rope_theta=500000.0, max_position_embeddings=131072, rms_norm_eps=1e-5)
DRAFT = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
             num_key_value_heads=8, head_dim=64, vocab_size=128256, tie_word_embeddings=True,
             rope_theta=500000.0, max_position_embeddings=131072, rms_norm_eps=1e-5)
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, vocab_size=256, tie_word_embeddings=False,
            max_position_embeddings=8192)
TOKENS = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 512, 768, 1024, 2048, 4096)


def build(spec: dict, device, dtype):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**spec, attn_implementation="sdpa")
    with torch.device(device):
        prev = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            model = LlamaForCausalLM(cfg)
        finally:
            torch.set_default_dtype(prev)
    return model.eval()


def time_forward(model, ids, reps: int, device) -> list[float]:
    import torch

    cuda = device.type == "cuda"
    out = []
    with torch.inference_mode():
        for i in range(3 + reps):
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                model(input_ids=ids, use_cache=False)
                end.record()
                torch.cuda.synchronize()
                dt = start.elapsed_time(end) / 1e3
            else:
                t0 = time.perf_counter()
                model(input_ids=ids, use_cache=False)
                dt = time.perf_counter() - t0
            if i >= 3:
                out.append(dt)
    return out


def predictor(hardware: str | None):
    """(target, draft) -> seconds for n x 1 @ ctx 0 from the simulator's roofline, or None."""
    if hardware is None:
        return None
    try:
        sys.path.insert(0, str(ROOT / "src"))
        sys.path.insert(0, str(ROOT / "experiments" / "roofline"))
        import numpy as np
        from roofline import cost_model
        cost, _ = cost_model(hardware, "llama3_8b")
    except Exception as e:  # specdepth or hydra not importable here: measure anyway
        print(f"no prediction (cannot build the simulator's cost model: {e})", file=sys.stderr)
        return None

    def predict(which: str, n: int) -> float:
        fwd = cost.target_forward if which == "target" else cost.draft_forward
        return fwd(np.zeros(n, dtype=np.int64))[0]
    return predict


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, which in enumerate(("target", "draft")):
        for shape, marker in (("batch", "o"), ("verify", "s")):
            sub = [r for r in rows if r["model"] == which and r["shape"] == shape]
            if sub:
                ax.plot([r["tokens"] for r in sub], [r["forward_s"] * 1e3 for r in sub], marker, color=f"C{i}",
                        ms=4, fillstyle="none" if shape == "verify" else "full",
                        label=f"{which}: measured, {'n x 1' if shape == 'batch' else '1 x n'}")
        sub = [r for r in rows if r["model"] == which and r["shape"] == "batch" and r["predicted_s"] != ""]
        if sub:
            ax.plot([r["tokens"] for r in sub], [r["predicted_s"] * 1e3 for r in sub], "-", color=f"C{i}",
                    label=f"{which}: simulator roofline")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("tokens per forward")
    ax.set_ylabel("forward time (ms)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "cuda"))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--hardware", default=None, help="simulator hardware entry (default: from the GPU name)")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=4096)
    ap.add_argument("--tiny", action="store_true", help="tiny models in float32 (smoke test, any device)")
    a = ap.parse_args(argv)

    import torch
    device = torch.device(a.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("no CUDA device: run on a GPU machine (or --device cpu --tiny to smoke-test)")
        gpu = torch.cuda.get_device_name(device)
        torch.backends.cuda.matmul.allow_tf32 = True
    else:
        gpu = "cpu"
    sys.path.insert(0, str(ROOT / "src"))
    try:
        from specdepth.cost import hardware_for_device
    except ImportError:   # specdepth not importable: measure without a prediction
        def hardware_for_device(name):
            return None
    hardware = a.hardware or hardware_for_device(gpu)
    predict = None if a.tiny else predictor(hardware)
    dtype = torch.float32 if a.tiny else torch.bfloat16
    tokens = [n for n in TOKENS if n <= a.max_tokens]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    t_start = time.time()
    for which, spec in (("target", TARGET), ("draft", DRAFT)):
        model = build(TINY if a.tiny else spec, device, dtype)
        vocab = model.config.vocab_size
        params = sum(p.numel() for p in model.parameters())
        print(f"{which}: {params / 1e9:.2f} B parameters, {dtype}, on {gpu}", flush=True)
        gen = torch.Generator(device="cpu").manual_seed(0)
        for n in tokens:
            for shape in ("batch", "verify"):
                ids = torch.randint(0, vocab, (n, 1) if shape == "batch" else (1, n), generator=gen).to(device)
                ts = sorted(time_forward(model, ids, a.reps, device))
                q = lambda p: ts[min(len(ts) - 1, int(p * len(ts)))]
                pred = predict(which, n) if predict is not None else ""
                rows.append(dict(gpu=gpu, hardware=hardware or "", model=which, shape=shape, tokens=n,
                                 forward_s=statistics.median(ts), p10_s=q(0.1), p90_s=q(0.9), predicted_s=pred))
                r = rows[-1]
                print(f"  {which} {shape:6s} n={n:5d}: {r['forward_s'] * 1e3:9.3f} ms"
                      + (f"  (roofline {pred * 1e3:.3f} ms)" if pred != "" else ""), flush=True)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    with open(out / "cuda_roofline.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
    title = (f"{gpu}: Llama-3.1-8B / 3.2-1B architecture, random bf16 weights"
             + (f"; lines: simulator roofline ({hardware})" if predict else ""))
    plot(rows, out / "cuda_roofline.png", title)
    print(f"wrote {out / 'cuda_roofline.csv'} and {out / 'cuda_roofline.png'} in {time.time() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
