"""Benchmark: simulated output tokens per CPU-second of the simulator (engine loop + sim executor).

    .venv/bin/python experiments/perf/sim_throughput.py [--repeats 3] [--output-len 512]

Composes the real Hydra configs (default model llama3_8b on h100_sxm, confidence acceptance) and runs the
engine in-process, timing with time.process_time. Goal (issue 2): >= 1,000,000 tokens/s for `fixed`. Beside
each rate, the policy's own time per step (its plan + keep_drafting + observe hooks, wall time, the mean over a
run's steps, the least of the repeats); goal (issue 47): an adaptive policy's at most 100 us at batch 64 and 300 us
at 256.
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
    ("batch_scaled, batch 64 (steady)", ["policy=batch_scaled"] + STEADY),
    ("goodput, batch 64 (steady)", ["policy=goodput"] + STEADY),
    ("fixed k=4, batch 64 (closed batch, tail included)", ["policy=fixed", "policy.depth=4", "workload.batch_size=64"]),
    ("confidence, batch 64", ["policy=confidence", "workload.batch_size=64"]),
    ("batch_scaled, batch 64", ["policy=batch_scaled", "workload.batch_size=64"]),
    ("goodput, batch 64", ["policy=goodput", "workload.batch_size=64"]),
    ("fixed k=4, batch 256", ["policy=fixed", "policy.depth=4", "workload.batch_size=256"]),
    ("confidence, batch 256", ["policy=confidence", "workload.batch_size=256"]),
    ("batch_scaled, batch 256", ["policy=batch_scaled", "workload.batch_size=256"]),
    ("goodput, batch 256", ["policy=goodput", "workload.batch_size=256"]),
    ("none, batch 256", ["policy=none", "workload.batch_size=256"]),
    ("ema, batch 64 (steady)", ["policy=ema"] + STEADY),
    ("ema, batch 64", ["policy=ema", "workload.batch_size=64"]),
    ("ema, batch 256", ["policy=ema", "workload.batch_size=256"]),
    ("bandit, batch 64 (steady)", ["policy=bandit"] + STEADY),
    ("bandit, batch 64", ["policy=bandit", "workload.batch_size=64"]),
    ("bandit, batch 256", ["policy=bandit", "workload.batch_size=256"]),
    ("heuristic, batch 64 (steady)", ["policy=heuristic"] + STEADY),
    ("heuristic, batch 64", ["policy=heuristic", "workload.batch_size=64"]),
    ("heuristic, batch 256", ["policy=heuristic", "workload.batch_size=256"]),
    ("tree_confidence, batch 64 (steady)", ["policy=tree_confidence", "acceptance=ranked"] + STEADY),
    ("tree_confidence, batch 64", ["policy=tree_confidence", "acceptance=ranked", "workload.batch_size=64"]),
    ("tree_confidence, batch 256", ["policy=tree_confidence", "acceptance=ranked", "workload.batch_size=256"]),
    ("tree_goodput, batch 64 (steady)", ["policy=tree_goodput", "acceptance=ranked"] + STEADY),
    ("tree_goodput, batch 64", ["policy=tree_goodput", "acceptance=ranked", "workload.batch_size=64"]),
    ("tree_goodput, batch 256", ["policy=tree_goodput", "acceptance=ranked", "workload.batch_size=256"]),
]


def timed(policy) -> list:
    """Wrap the policy's plan, keep_drafting and observe hooks (instance attributes, which the engine reads at the
    run's start) to add their wall seconds to the returned one-element list."""
    spent = [0.0]

    def wrap(fn):
        def hook(*args):
            t = time.perf_counter()
            try:
                return fn(*args)
            finally:
                spent[0] += time.perf_counter() - t
        return hook

    for h in ("plan", "keep_drafting", "observe"):
        setattr(policy, h, wrap(getattr(policy, h)))
    return spent


def measure(overrides, repeats):
    """(best tokens per CPU-second, tokens, steps, the least of the runs' policy seconds per step)."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    best, policy_s = None, []
    for _ in range(repeats):
        engine = build(cfg)["engine"]
        spent = timed(engine.policy)
        t = time.process_time()
        res = engine.run()
        dt = time.process_time() - t
        tokens = sum(r[2] for r in res.requests)
        rate = tokens / dt
        policy_s.append(spent[0] / max(len(res.steps), 1))
        best = rate if best is None else max(best, rate)
    return best, tokens, len(res.steps), min(policy_s)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--output-len", type=int, default=512)
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    ap.add_argument("--only", default=None, help="comma-separated policy names: only their cases (e.g. goodput)")
    a = ap.parse_args()
    rows = []
    print(f"| case | simulated tokens | steps | tokens per CPU-second (best of {a.repeats}) | policy us per step |")
    print("|---|---|---|---|---|")
    for name, ov in CASES:
        if a.only and not any(name.startswith(p) for p in a.only.split(",")):
            continue
        steady = "workload=poisson" in ov
        rate, tokens, steps, pol = measure(ov + [f"workload.output_len={128 if steady else a.output_len}"], a.repeats)
        rows.append(dict(case=name, tokens=tokens, steps=steps, tokens_per_cpu_s=rate, policy_us_per_step=pol * 1e6))
        print(f"| {name} | {tokens} | {steps} | {rate:,.0f} | {pol * 1e6:,.1f} |", flush=True)
    if a.json:
        with atomic_open(a.json) as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
