"""Study `long_context` (issue 16): speculation against no speculation as contexts grow from 1k to 128k
tokens, with the running batch limited by GPU memory; and a mixture-of-experts target against batch size.

    OMP_NUM_THREADS=1 .venv/bin/python experiments/long_context/sweep.py [--out experiments/long_context/runs.csv]
                                                                           [--part dense,tuned,moe]

Runs in-process (Hydra composes one base config per deployment; each run sets prompt length, batch and
policy on a copy and goes through specdepth.app.build + Engine.run, the code path of `specdepth`), one
process. Parts:
  dense  llama3_8b (TP 1) and llama3_70b (experiment=llama3_70b_tp4) on h100_sxm and h200; prompt lengths
         1k..128k; batch 1..256 (engine.max_batch_size = the batch, as vLLM's max_num_seqs; a closed
         workload of max(4 x batch, 32) requests at t = 0, 128 output tokens each, so the batch stays full
         until the last requests drain); no speculation and fixed depth 1, 2, 3, 4, 6, 8.
  tuned  the same cells with batch_table and disable_by_batch tuned on the dense part's 1k results (their
         batch -> depth rules copied from the best fixed depth per batch at 1k) and goodput (untuned).
  moe    qwen3_30b_a3b (TP 1) on h100_sxm and h200, prompt 1k, 8k, 32k, the fixed depths and goodput.
Batches past the memory limit all run at that limit (admission holds the rest back): the grid stops at the
limit, which is run as one more batch point.
Every row of runs.csv: the deployment, prompt length, batch, requests, memory limit on the batch, policy,
decode throughput (tokens emitted by decode steps / their draft + verify seconds), end-to-end throughput,
mean and max running batch (steps.csv's batch_size column), peak_kv_gb, tokens per step, wall seconds.
"""
from __future__ import annotations

import argparse
import csv
import os
import sys
import time
from pathlib import Path

import numpy as np
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from specdepth.app import CONF_DIR, build
from specdepth.engine import STEP_COLUMNS
from specdepth.metrics import summarize
from specdepth.results import atomic_write, csv_text

HERE = Path(__file__).resolve().parent
OUTPUT = 128
CONTEXTS = (1024, 4096, 16384, 32768, 65536, 130928)   # 130928 + 128 + 16 = 131072, Llama-3.1's window
BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
DEPTHS = (0, 1, 2, 3, 4, 6, 8)
DENSE = (("llama3_8b", 1, ("model=llama3_8b",)), ("llama3_70b", 4, ("experiment=llama3_70b_tp4",)))
MOE = (("qwen3_30b_a3b", 1, ("model=qwen3_30b_a3b",)),)
MOE_CONTEXTS = (1024, 8192, 32768)
HARDWARE = ("h100_sxm", "h200")
COLUMNS = ("part", "model", "tp", "hardware", "context", "batch", "requests", "memory_cap", "policy",
           "decode_tok_s", "throughput_tok_s", "mean_running", "max_running", "peak_kv_gb", "tokens_per_step",
           "acceptance_rate", "wall_s")
_S = {c: i for i, c in enumerate(STEP_COLUMNS)}


def base(overrides) -> OmegaConf:
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("config", overrides=["engine.progress=false", f"workload.output_len={OUTPUT}", *overrides])


def policy_node(name: str, **keys) -> dict:
    node = OmegaConf.to_container(base([f"policy={name}"]).policy)
    node.update(keys)
    return node


def memory_cap(cfg, context: int) -> int:
    c = cfg.copy()
    c.workload.prompt_len, c.workload.batch_size = context, 1
    cap = build(c)["capacity"]
    return int(cap.kv_tokens // (context + OUTPUT + cap.max_depth))


def requests(batch: int) -> int:
    return max(4 * batch, 32)


def run(cfg, context: int, batch: int, pol: dict) -> dict:
    c = cfg.copy()
    c.workload.prompt_len, c.workload.batch_size, c.engine.max_batch_size = context, requests(batch), batch
    c.policy = pol
    parts = build(c)
    t0 = time.perf_counter()
    res = parts["engine"].run()
    wall = time.perf_counter() - t0
    s = summarize(res)
    st = np.array(res.steps, float).reshape(-1, len(STEP_COLUMNS))
    decode_s = st[:, _S["draft_s"]].sum() + st[:, _S["verify_s"]].sum()
    return dict(decode_tok_s=st[:, _S["emitted"]].sum() / decode_s, throughput_tok_s=s["throughput_tok_s"],
                mean_running=st[:, _S["batch_size"]].mean(), max_running=int(st[:, _S["batch_size"]].max()),
                peak_kv_gb=parts["capacity"].peak_kv_gb, tokens_per_step=s["tokens_per_step"],
                acceptance_rate=s["acceptance_rate"], wall_s=wall)


def batches(cap: int) -> list[int]:
    """The batch grid below the memory cap, then the cap itself."""
    return [b for b in BATCHES if b < cap] + ([cap] if cap <= BATCHES[-1] else [])


def cells(part: str, models, contexts, policies, rows: list, out: Path):
    for model, tp, ov in models:
        for hw in HARDWARE:
            cfg = base([*ov, f"hardware={hw}"])
            for ctx in contexts:
                cap = memory_cap(cfg, ctx)
                for b in batches(cap):
                    for label, pol in policies(model, hw):
                        r = dict(part=part, model=model, tp=tp, hardware=hw, context=ctx, batch=b,
                                 requests=requests(b), memory_cap=cap, policy=label)
                        r.update(run(cfg, ctx, b, pol))
                        rows.append(r)
                print(f"{part} {model} {hw} ctx {ctx}: cap {cap}, {len(rows)} runs", flush=True)
                save(rows, out)


def fixed_policies(model, hw):
    return [("none" if k == 0 else f"fixed{k}", dict(_target_="specdepth.policies.fixed.FixedDepth", depth=k))
            for k in DEPTHS]


def tuned_at_1k(rows: list) -> dict:
    """Per (model, hardware): batch_table and disable_by_batch rules read off the dense 1k results."""
    out = {}
    for (model, hw) in {(r["model"], r["hardware"]) for r in rows if r["part"] == "dense"}:
        at = [r for r in rows if (r["model"], r["hardware"], r["context"], r["part"]) == (model, hw, 1024, "dense")]
        tput = {(r["batch"], r["policy"]): r["decode_tok_s"] for r in at}
        bs = sorted({r["batch"] for r in at})
        best = {b: max(DEPTHS, key=lambda k: tput[(b, "none" if k == 0 else f"fixed{k}")]) for b in bs}
        table = [[b, (bs[i + 1] - 1) if i + 1 < len(bs) else 1 << 30, best[b]] for i, b in enumerate(bs)]
        k1 = best[bs[0]]
        lose = [b for b in bs if tput[(b, f"fixed{k1}")] < tput[(b, "none")]] if k1 else []
        out[(model, hw)] = dict(
            batch_table=policy_node("batch_table", table=table, default=0),
            disable_by_batch=policy_node("disable_by_batch", depth=k1, threshold=lose[0] if lose else 1 << 30))
    return out


def save(rows: list, out: Path) -> None:
    fmt = lambda v: f"{v:.6g}" if isinstance(v, float) else v
    atomic_write(out, csv_text(COLUMNS, [[fmt(r[c]) for c in COLUMNS] for r in rows]))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(HERE / "runs.csv"))
    ap.add_argument("--part", default="dense,tuned,moe")
    a = ap.parse_args(argv)
    out, parts = Path(a.out), set(a.part.split(","))
    rows = list(csv.DictReader(open(out))) if out.is_file() and parts != {"dense", "tuned", "moe"} else []
    for r in rows:   # a partial rerun keeps the other parts' rows
        for c in ("tp", "context", "batch", "requests", "memory_cap"):
            r[c] = int(r[c])
        r["decode_tok_s"] = float(r["decode_tok_s"])
    rows = [r for r in rows if r["part"] not in parts]
    t0 = time.perf_counter()
    goodput = policy_node("goodput")
    if "dense" in parts:
        cells("dense", DENSE, CONTEXTS, fixed_policies, rows, out)
    if "tuned" in parts:
        tuned = tuned_at_1k(rows)
        pols = lambda m, hw: [*tuned[(m, hw)].items(), ("goodput", goodput)]
        cells("tuned", DENSE, CONTEXTS, pols, rows, out)
        print("tuned at 1k:", {f"{m}/{hw}": v for (m, hw), v in tuned.items()}, flush=True)
    if "moe" in parts:
        cells("moe", MOE, MOE_CONTEXTS, lambda m, hw: [*fixed_policies(m, hw), ("goodput", goodput)], rows, out)
    save(rows, out)
    print(f"{len(rows)} runs in {time.perf_counter() - t0:.0f} s of wall time -> {out}", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
