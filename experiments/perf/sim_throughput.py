"""Benchmark: simulated output tokens per CPU-second of the simulator (engine loop + sim executor).

    .venv/bin/python experiments/perf/sim_throughput.py [--repeats 3] [--output-len 512]

Composes the real Hydra configs (default model llama3_8b on h100_sxm, confidence acceptance) and runs the
engine in-process, timing with time.process_time. Goal (issue 2): >= 1,000,000 tokens/s for `fixed`.
"""
from __future__ import annotations

import argparse
import json
import time

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from specdepth.app import CONF_DIR, build
from specdepth.results import atomic_open

STEADY = ["workload=poisson", "workload.rate=1e9", "workload.num_requests=1024", "engine.max_batch_size=64",
          "workload.max_concurrency=64", "workload.prompt_len=256"]
CASES = [
    ("fixed k=4, batch 64 (steady: 1024 requests, 64 running)", ["policy=fixed", "policy.depth=4"] + STEADY),
    ("confidence, batch 64 (steady)", ["policy=confidence"] + STEADY),
    ("fixed k=4, batch 64 (closed batch, tail included)", ["policy=fixed", "policy.depth=4", "workload.batch_size=64"]),
    ("confidence, batch 64", ["policy=confidence", "workload.batch_size=64"]),
    ("fixed k=4, batch 256", ["policy=fixed", "policy.depth=4", "workload.batch_size=256"]),
    ("confidence, batch 256", ["policy=confidence", "workload.batch_size=256"]),
    ("none, batch 256", ["policy=none", "workload.batch_size=256"]),
]


def measure(overrides, repeats):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    best = None
    for _ in range(repeats):
        engine = build(cfg)["engine"]
        t = time.process_time()
        res = engine.run()
        dt = time.process_time() - t
        tokens = sum(r[2] for r in res.requests)
        rate = tokens / dt
        best = rate if best is None else max(best, rate)
    return best, tokens, len(res.steps)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--output-len", type=int, default=512)
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    a = ap.parse_args()
    rows = []
    print(f"| case | simulated tokens | steps | tokens per CPU-second (best of {a.repeats}) |")
    print("|---|---|---|---|")
    for name, ov in CASES:
        steady = "workload=poisson" in ov
        rate, tokens, steps = measure(ov + [f"workload.output_len={128 if steady else a.output_len}"], a.repeats)
        rows.append(dict(case=name, tokens=tokens, steps=steps, tokens_per_cpu_s=rate))
        print(f"| {name} | {tokens} | {steps} | {rate:,.0f} |", flush=True)
    if a.json:
        with atomic_open(a.json) as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
