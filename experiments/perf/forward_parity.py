"""One model forward through our Runner (slot KV cache, explicit 4D mask, position ids) vs the same model's own
forward with a transformers DynamicCache, at batch 1, on the benchmark pair of hf_backend.py.

    OMP_NUM_THREADS=1 .venv/bin/python experiments/perf/forward_parity.py [--profile]

Prints ms per forward for the draft and the target at 1 and 5 query tokens over a 100-token cache (best
structure for HF: no mask, contiguous cache, crop after each call). Used to explain benchmark (1) of
hf_backend.py: if the forwards cost the same, a speculative loop with the same forwards cannot be much
faster than HF assisted generation, whatever the framework around them costs. --profile adds torch's
operator profile of 20 one-token draft forwards (where the time goes: the weight matmuls).
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hf_backend  # noqa: E402


def main(argv=None):
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM, DynamicCache

    from specdepth.hf import Runner
    root = Path(tempfile.mkdtemp(prefix="parity_"))
    hf_backend.build_pair(root)
    ctx, n = 100, 50
    for name in ("draft", "target"):
        m = AutoModelForCausalLM.from_pretrained(root / name, dtype=torch.float32).eval()
        r = Runner(m, 1, 512)
        prefix = np.arange(ctx)[None, :] % 4000 + 3
        with torch.inference_mode():
            r.forward(np.array([0]), prefix, np.array([0]), None, "none")
            cache = DynamicCache()
            m(input_ids=torch.tensor(prefix), cache=cache, use_cache=True)
            for Q in (1, 5):
                toks, want = np.full((1, Q), 7), ("last" if Q == 1 else "all")
                x = torch.full((1, Q), 7)
                for _ in range(3):
                    r.forward(np.array([0]), toks, np.array([ctx]), None, want)
                    m(input_ids=x, cache=cache, use_cache=True)
                    cache.crop(-Q)
                t0 = time.perf_counter()
                for _ in range(n):
                    r.forward(np.array([0]), toks, np.array([ctx]), None, want)
                ours = (time.perf_counter() - t0) / n
                t0 = time.perf_counter()
                for _ in range(n):
                    m(input_ids=x, cache=cache, use_cache=True)
                    cache.crop(-Q)
                hf = (time.perf_counter() - t0) / n
                print(f"{name} ({sum(p.numel() for p in m.parameters()) / 1e6:.1f}M), {Q} query token(s): "
                      f"ours {ours * 1e3:.2f} ms, HF {hf * 1e3:.2f} ms", flush=True)
            if a.profile and name == "draft":
                with torch.profiler.profile() as prof:
                    for _ in range(20):
                        r.forward(np.array([0]), np.full((1, 1), 7), np.array([ctx]), None, "last")
                print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=8), flush=True)


if __name__ == "__main__":
    main()
