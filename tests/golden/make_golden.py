"""Record (or check) the golden results that guard refactors: summary.json and digests of steps.csv,
requests.csv, acceptance_trace.jsonl and generations.jsonl of a fixed set of runs.

    .venv/bin/python tests/golden/make_golden.py            # rewrite tests/golden/*.json
    .venv/bin/python tests/golden/make_golden.py --check    # compare, print the differences

Regenerate only on purpose (a change meant to alter results), and say so in the commit message.
Timing fields of real runs (backend=hf) are not recorded: they are wall-clock measurements.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

POLICIES = ["none", "fixed", "batch_scaled", "confidence", "disable_by_batch", "batch_table", "heuristic", "ema",
            "goodput", "bandit", "oracle"]
# simulator cells: (name, overrides)
SIM_CELLS = [
    ("b1_iid", ["workload.batch_size=1", "acceptance=iid", "acceptance.alpha=0.8", "workload.output_len=96"]),
    ("b24_conf_a100", ["workload.batch_size=24", "hardware=a100_80g", "workload.output_len=64",
                       "workload.prompt_len={dist: uniform, low: 32, high: 900}"]),
    ("poisson_beta_h200", ["workload=poisson", "workload.rate=200", "workload.num_requests=40", "acceptance=beta",
                           "hardware=h200", "engine.max_batch_size=16", "workload.output_len={dist: uniform, low: 8, high: 80}"]),
    # llama3_70b does not fit one h100_sxm (issue 16 refuses it); memory_gb=null is the unlimited-memory GPU
    # these results were recorded on (the roofline times do not depend on memory)
    ("b160_70b", ["workload.batch_size=160", "model=llama3_70b", "workload.output_len=32", "acceptance.calibration=1.4",
                  "hardware.memory_gb=null"]),
]
# simulator switches and the engine's optional paths
SIM_EXTRA = [
    ("switches_goodput", ["policy=goodput", "workload.batch_size=12", "workload.output_len=48", "backend.pad_ragged=true",
                          "backend.draft_catch_up=true", "backend.step_overhead_s=0.001",
                          "backend.position_overhead_s=0.0005"]),
    ("switches_fixed", ["policy=fixed", "workload.batch_size=12", "workload.output_len=48", "backend.pad_ragged=true",
                        "backend.draft_catch_up=true"]),
    ("trace_confidence", ["policy=confidence", "workload.batch_size=6", "workload.output_len=40",
                          "engine.record_trace=true", "engine.max_depth=6", "policy.max_depth=6"]),
    ("constant_leviathan", ["policy=fixed", "policy.depth=3", "cost=constant", "acceptance=iid",
                            "workload.batch_size=4", "workload.output_len=64"]),
    ("len1", ["policy=fixed", "workload.batch_size=5", "workload.output_len={dist: uniform, low: 1, high: 3}"]),
]
HF_CELLS = [
    # backend=hf: the calibrated cost (goodput's default, confidence's cost-aware cap) follows the measured wall
    # times, so its decisions depend on the machine's timing: these cases pin the cost model to keep them exact,
    # and goodput's policy_time (its own measured seconds) and catch_up (a padding verdict from measured draft
    # seconds), which read wall time too (the case's decisions once followed the machine's speed, 2026-12-02)
    ("hf_greedy_goodput", ["policy=goodput", "policy.cost=model", "policy.policy_time=false", "policy.catch_up=false",
                           "cost=constant", "workload.batch_size=4", "workload.output_len=24",
                           "workload.prompt_len={dist: uniform, low: 4, high: 40}"]),
    ("hf_greedy_confidence", ["policy=confidence", "policy.cost_aware=false", "workload.batch_size=3",
                              "workload.output_len=20"]),
    ("hf_greedy_fixed", ["policy=fixed", "policy.depth=3", "workload.batch_size=5", "workload.output_len=16",
                         "workload.prompt_len={dist: uniform, low: 2, high: 30}"]),
    ("hf_sampled_fixed", ["policy=fixed", "policy.depth=2", "workload.batch_size=3", "workload.output_len=20",
                          "decode.temperature=0.8", "decode.top_p=0.9"]),
    ("hf_sampled_heuristic", ["policy=heuristic", "workload.batch_size=2", "workload.output_len=20",
                              "decode.temperature=1.0"]),
]
HF_BASE = ["backend=hf", "model=tiny_pair", "model.device=cpu", "backend.num_threads=1", "workload.prompt_len=16"]
COMMON = ["engine.progress=false", "resume=false", "logger=none"]
# wall-clock measurements (backend=hf) and fields derived from them
TIMING = {"time_s", "throughput_tok_s", "tpot_p50_s", "tpot_p99_s", "ttft_p50_s", "ttft_p99_s", "e2e_p50_s",
          "e2e_p99_s", "draft_time_s", "verify_time_s", "prefill_time_s", "overhead_time_s"}
HF_TIMED_COLUMNS = {"time_s", "draft_s", "verify_s", "prefill_s", "overhead_s", "step_s", "arrival_s",
                    "first_token_s", "finish_s", "ttft_s", "e2e_s", "tpot_s"}


def cases():
    out = []
    for cell, ov in SIM_CELLS:
        for p in POLICIES:
            out.append((f"sim_{cell}_{p}", [f"policy={p}", *ov], False))
    out += [(f"sim_{n}", ov, False) for n, ov in SIM_EXTRA]
    out += [(n, HF_BASE + ov, True) for n, ov in HF_CELLS]
    return out


def _digest_csv(path: Path, drop: set) -> str:
    import csv
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    keep = [i for i, c in enumerate(rows[0]) if c not in drop]
    text = "\n".join(",".join(r[i] for i in keep) for r in rows)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _digest(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16] if path.is_file() else None


def _rounded(x, places=3):
    if isinstance(x, float):
        return round(x, places)
    if isinstance(x, list):
        return [_rounded(v, places) for v in x]
    if isinstance(x, dict):
        return {k: _rounded(v, places) for k, v in x.items()}
    return x


def _digest_trace(path: Path) -> str | None:
    """acceptance_trace.jsonl with its floats (the draft's float32 confidences) rounded to 3 decimals: their
    last bits differ between CPUs (the kernels' vector width), the tokens and decisions do not."""
    if not path.is_file():
        return None
    lines = [json.dumps(_rounded(json.loads(line))) for line in path.read_text().splitlines() if line.strip()]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


def record(name, overrides, real, tmp: Path) -> dict:
    from sdtest import run_sim
    d = tmp / name
    s = run_sim(d, *COMMON, *overrides)
    drop = HF_TIMED_COLUMNS if real else set()
    out = {"overrides": overrides,
           "summary": {k: v for k, v in s.items() if not (real and k in TIMING)},
           "steps_csv": _digest_csv(d / "steps.csv", drop),
           "requests_csv": _digest_csv(d / "requests.csv", drop),
           "acceptance_trace": _digest_trace(d / "acceptance_trace.jsonl"),
           "generations": _digest(d / "generations.jsonl")}
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--only", default=None, help="substring of the case names")
    a = ap.parse_args()
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, ov, real in cases():
            if a.only and a.only not in name:
                continue
            got = record(name, ov, real, Path(tmp))
            f = HERE / f"{name}.json"
            if a.check:
                want = json.loads(f.read_text())
                diff = [k for k in want if k != "summary" and want[k] != got[k]]
                diff += [f"summary.{k}" for k in want["summary"] if want["summary"][k] != got["summary"].get(k)]
                print(f"{name}: {'ok' if not diff else 'DIFF ' + ', '.join(diff)}", flush=True)
                bad += bool(diff)
            else:
                f.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
                print(f"wrote {f.name}", flush=True)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
