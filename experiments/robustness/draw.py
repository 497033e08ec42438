"""The robustness protocol's draw (issue 12): a seeded random set of simulator cells nobody tuned a policy on.

    .venv/bin/python experiments/robustness/draw.py --seed 1 [--cells 240]      # print the draw's summary

`draw(seed, cells)` returns a list of cells; each one is the `cell` node of `conf/experiment/robustness.yaml`
(hardware, model, batch, seed, acceptance, workload, backend), so any run of the draw can be repeated alone (`command(cell, pol)`; cells.json holds each cell's):

    specdepth experiment=robustness pol=goodput '~cell' "+cell={hardware: 'h200', model: ..., backend: {...}}"

Axes (each cell drawn independently):
  hardware    a100_80g, h100_sxm, h200, b200 (uniform)
  model       llama3_8b, llama3_70b, qwen2_5_7b (uniform), each with its draft
  acceptance  iid alpha ~ U[0.3, 0.95]; beta mean ~ U[0.3, 0.95], concentration ~ logU[2, 50];
              confidence mean ~ U[0.5, 0.9], spread ~ U[1, 3], calibration ~ U[0.6, 1.6];
              decay first ~ U[0.6, 0.95], decay ~ U[0.5, 0.9] (uniform over the four)
  batch       integer in 1..512, log-uniform
  workload    closed (batch requests at t = 0, the run ends with the last one); continuous (a queue of
              2-4 x batch requests at t = 0, at most batch running); poisson (3 x batch requests, at least 24,
              arriving at 50-100 % of the no-speculation capacity, at most batch running), uniform over the three
  output len  L ~ logU[16, 2048]; fixed (every request L) or mixed (uniform in [L/2, 3L/2]), half each
  prompt len  P ~ logU[64, 8192]; fixed or mixed the same way
  backend     half the cells: the clock also charges what a cost model of forwards misses and a real
              engine pays (backend.step_overhead_s ~ logU[0.1, 3] ms, backend.position_overhead_s ~
              logU[0.05, 1.5] ms, backend.pad_ragged and backend.draft_catch_up each with probability 1/2);
              the policies' view.cost does not know it. The other half: the clock charges the cost model.
Work cap: a cell's total output tokens are capped at `MAX_TOKENS` (the output lengths shrink to fit, the
prompt lengths and request counts stay), so that the whole draw runs in minutes.
Poisson capacity: requests/s that `none` serves at the full batch, from the cost model at the mean context:
1 / (E[output] x verify_time(batch) / batch + prefill_time(1 request)).
"""
from __future__ import annotations

import argparse
import json
import math
from collections import Counter

import numpy as np

HARDWARE = ("a100_80g", "h100_sxm", "h200", "b200")
MODELS = ("llama3_8b", "llama3_70b", "qwen2_5_7b")
ACCEPTANCE = ("iid", "beta", "confidence", "decay")
WORKLOADS = ("closed", "continuous", "poisson")
MAX_TOKENS = 120_000
DRAW_KEY = 0xD8A3


def _logu(rng, lo, hi) -> float:
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def _acceptance(rng) -> tuple[str, dict]:
    kind = ACCEPTANCE[rng.integers(len(ACCEPTANCE))]
    r = lambda lo, hi: round(float(rng.uniform(lo, hi)), 3)   # noqa: E731
    if kind == "iid":
        return kind, {"_target_": "specdepth.acceptance.IID", "alpha": r(0.3, 0.95)}
    if kind == "beta":
        return kind, {"_target_": "specdepth.acceptance.Beta", "mean": r(0.3, 0.95),
                      "concentration": round(_logu(rng, 2, 50), 2)}
    if kind == "confidence":
        return kind, {"_target_": "specdepth.acceptance.Confidence", "mean": r(0.5, 0.9), "spread": r(1, 3),
                      "seq_concentration": 20.0, "calibration": r(0.6, 1.6)}
    return kind, {"_target_": "specdepth.acceptance.Decay", "first": r(0.6, 0.95), "decay": r(0.5, 0.9)}


def _length(rng, lo, hi, mixed) -> tuple[int, object]:
    """(mean, spec): a log-uniform length, fixed or mixed (uniform in [L/2, 3L/2])."""
    L = int(round(_logu(rng, lo, hi)))
    if not mixed:
        return L, L
    low, high = max(1, L // 2), max(1, (3 * L) // 2)
    return L, {"dist": "uniform", "low": low, "high": high}


def _scaled(spec, f: float):
    if isinstance(spec, int):
        return max(1, int(spec * f))
    return {"dist": "uniform", "low": max(1, int(spec["low"] * f)), "high": max(1, int(spec["high"] * f))}


def _backend(rng) -> dict:
    if rng.random() < 0.5:
        return {"step_overhead_s": 0.0, "position_overhead_s": 0.0, "pad_ragged": False, "draft_catch_up": False}
    return {"step_overhead_s": round(_logu(rng, 1e-4, 3e-3), 6), "position_overhead_s": round(_logu(rng, 5e-5, 1.5e-3), 6),
            "pad_ragged": bool(rng.random() < 0.5), "draft_catch_up": bool(rng.random() < 0.5)}


# Tensor-parallel degree of a deployment (issue 16: the weights must fit each GPU): the smallest power of two
# leaving at least ~40 % of hardware.memory_gb x 0.9 for the KV cache. llama3_70b + 1B draft holds 133.7 GB of
# weights: TP 4 on the 80 GB parts, TP 2 on h200 (141 GB) and b200 (180 GB); the 7-8B pairs fit one GPU.
TENSOR_PARALLEL = {("a100_80g", "llama3_70b"): 4, ("h100_sxm", "llama3_70b"): 4, ("h200", "llama3_70b"): 2,
                   ("b200", "llama3_70b"): 2}


def _cell(rng, i: int) -> dict:
    hw = HARDWARE[rng.integers(len(HARDWARE))]
    model = MODELS[rng.integers(len(MODELS))]
    acc_kind, acc = _acceptance(rng)
    batch = int(min(512, max(1, math.floor(_logu(rng, 1, 513)))))
    kind = WORKLOADS[rng.integers(len(WORKLOADS))]
    out_mean, out = _length(rng, 16, 2048, rng.random() < 0.5)
    p_mean, prompt = _length(rng, 64, 8192, rng.random() < 0.5)
    q = float(rng.uniform(2, 4))
    util = round(float(rng.uniform(0.5, 1.0)), 3)
    backend = _backend(rng)
    seed = int(rng.integers(1 << 31))
    n = batch if kind == "closed" else (int(round(q * batch)) if kind == "continuous" else max(24, 3 * batch))
    if n * out_mean > MAX_TOKENS:   # the work cap: shorter outputs, same requests
        f = MAX_TOKENS / (n * out_mean)
        out, out_mean = _scaled(out, f), max(1, int(out_mean * f))
    if kind == "closed":
        wl = {"_target_": "specdepth.workload.Closed", "batch_size": batch, "prompt_len": prompt, "output_len": out}
    else:
        wl = {"_target_": "specdepth.workload.Poisson", "rate": 1.0e9, "num_requests": n, "prompt_len": prompt,
              "output_len": out, "max_concurrency": batch}
    return {"id": i, "hardware": hw, "model": model, "tp": TENSOR_PARALLEL.get((hw, model), 1), "batch": batch,
            "seed": seed, "kind": kind, "acc": acc_kind,
            "util": util if kind == "poisson" else None, "out_mean": out_mean, "prompt_mean": p_mean,
            "acceptance": acc, "workload": wl, "backend": backend}


def capacity(cost, batch: int, prompt_mean: float, out_mean: float) -> float:
    """Requests/s that no speculation serves at the full batch (the cost model at the mean context)."""
    ctx = np.full(batch, int(prompt_mean + out_mean / 2), np.int64)
    t_step = cost.verify_time(ctx, np.zeros(batch, np.int64))
    z, p = np.zeros(1, np.int64), np.array([int(prompt_mean)], np.int64)
    t_pf = cost.target_forward(z, p)[0] + cost.draft_forward(z, p)[0]
    return 1.0 / (out_mean * t_step / batch + t_pf)


def _costs():
    """One cost model per (hardware, model), from the shipped configs (conf/hardware, conf/model, cost=roofline)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from specdepth.app import CONF_DIR, make
    out = {}
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        for hw in HARDWARE:
            for model in MODELS:
                tp = TENSOR_PARALLEL.get((hw, model), 1)
                cfg = compose("config", overrides=[f"hardware={hw}", f"model={model}", "cost=roofline",
                                                   f"parallel.tensor={tp}"])
                m, h, par = make(cfg, "model"), make(cfg, "hardware"), make(cfg, "parallel")
                out[hw, model] = make(cfg, "cost", target=m.target_arch, draft=m.draft_arch or m.target_arch,
                                      hardware=h, parallel=par)
    GlobalHydra.instance().clear()
    return out


def flow(v) -> str:
    """A value in Hydra's override grammar (what follows `+cell=` on the command line)."""
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {flow(x)}" for k, x in v.items()) + "}"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, str):
        return f"'{v}'"
    return repr(v)


def command(cell: dict, pol: str = "goodput") -> str:
    """The command line that runs one policy on one cell alone (the `cell` node is replaced whole)."""
    node = {k: cell[k] for k in ("hardware", "model", "tp", "batch", "seed", "acceptance", "workload", "backend")}
    return f"specdepth experiment=robustness pol={pol} '~cell' \"+cell={flow(node)}\""


def draw(seed: int, cells: int = 240) -> list[dict]:
    """The draw: `cells` cells from `seed` (the same list on every machine)."""
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), DRAW_KEY]))
    out = [_cell(rng, i) for i in range(cells)]
    if any(c["kind"] == "poisson" for c in out):
        costs = _costs()
        for c in out:
            if c["kind"] == "poisson":
                cap = capacity(costs[c["hardware"], c["model"]], c["batch"], c["prompt_mean"], c["out_mean"])
                c["workload"]["rate"] = float(f"{c['util'] * cap:.6g}")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--cells", type=int, default=240)
    ap.add_argument("--json", action="store_true", help="print the cells as JSON")
    a = ap.parse_args(argv)
    cells = draw(a.seed, a.cells)
    if a.json:
        print(json.dumps(cells, indent=1))
        return
    for key in ("hardware", "model", "acc", "kind"):
        print(key, dict(Counter(c[key] for c in cells)))
    print("engine overheads (+oh)", sum(bool(c["backend"]["step_overhead_s"] or c["backend"]["position_overhead_s"])
                                        for c in cells), "of which padded (backend.pad_ragged)",
          sum(bool(c["backend"]["pad_ragged"]) for c in cells))
    print("batch quartiles", np.percentile([c["batch"] for c in cells], [25, 50, 75]).tolist())
    print("output tokens per cell, total", sum(c["out_mean"] * (c["workload"].get("num_requests") or c["batch"])
                                                for c in cells))


if __name__ == "__main__":
    main()
