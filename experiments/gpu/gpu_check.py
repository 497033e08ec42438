"""The real-hardware questions in one command, on one device, in under 8 minutes (experiments/gpu/README.md).

    python experiments/gpu/gpu_check.py OUT_DIR              # on a CUDA machine (run.sh wraps it)
    python experiments/gpu/gpu_check.py OUT_DIR --smoke      # the same code on CPU, tiny shapes, < 1 minute

Parts, each with its own time budget and guarded (a part that fails records its error and the script goes on):
  roofline   target and draft forward times over batch x query x context (profile.csv, specdepth-profile's
             format) beside the simulator's roofline prediction for the detected device (roofline.csv/.png)
  crossover  timing mode (backend.acceptance=simulated, acceptance=iid at two levels), fixed depths 0-6 and
             goodput, batch 1-256: measured speed-up over no speculation, the crossover batch, and the
             simulator's prediction of the same table from the measured profile (cost=table) and from the
             roofline (crossover.csv/.png)
  lossless   the shipped tiny pair and a random pair, greedy, every non-oracle policy: outputs equal to the
             target's own greedy output (HF generate) (lossless.csv)
  trees      timing mode, acceptance=iid (its geometric per-rank table): draft trees (tree_fixed: EAGLE's tree and
             a small product tree) against the chain fixed4 and no speculation at a few batch sizes, the same
             protocol and simulator predictions as the crossover (trees.csv)
  overhead   the real backend's framework overhead per step, and its throughput against HF generate (k = 0)
             and HF assisted generation (batch 1, same pair, same depth) (overhead.csv)
The 8B/1B-shaped models are random bf16 weights built on the device from their config (model.init=random):
nothing is downloaded and no weights touch the disk. Writes summary.md (README-ready), results.json and the
CSVs/PNGs into OUT_DIR (after every part), run dirs under OUT_DIR/runs, and prints the headline lines last.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

T0 = time.monotonic()
ROOT = Path(__file__).resolve().parents[2]
for sub in ("experiments/perf", "experiments/crossover", "experiments/roofline"):
    sys.path.insert(0, str(ROOT / sub))
for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(var, "1")

from cuda_roofline import DRAFT as LLAMA_1B  # noqa: E402  (Llama-3.2-1B config.json numbers)
from cuda_roofline import TARGET as LLAMA_8B  # noqa: E402  (Llama-3.1-8B)

SMOKE_TARGET = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16, vocab_size=1024, max_position_embeddings=2048)
SMOKE_DRAFT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                   num_key_value_heads=1, head_dim=16, vocab_size=1024, max_position_embeddings=2048)
FULL = dict(
    total_s=450, report_s=15, dtype="bfloat16", shapes=(LLAMA_8B, LLAMA_1B), name="llama8b_1b_random",
    grid=([1, 4, 16, 64, 256], [1, 2, 4, 7, 128], [0, 128, 256]), warmup=1, repeats=3,
    batches=[1, 2, 4, 8, 16, 32, 64, 128, 256], depths=[0, 1, 2, 4, 6], alphas=[0.6, 0.8], prompt_len=128,
    output_len=32, lossless=dict(batch=4, prompt_len=32, output_len=32, pair=dict()), overhead_len=32, k=4, reps=3,
    trees=dict(batches=[1, 8, 32, 128], alpha=0.8, chain="fixed4"),
    budgets=dict(roofline=60, crossover=225, trees=30, lossless=35, overhead=70), sim_reserve_s=45, compile_s=45)
SMOKE = dict(
    total_s=65, report_s=4, dtype="bfloat16", shapes=(SMOKE_TARGET, SMOKE_DRAFT), name="tiny_random",
    grid=([1, 2], [1, 2, 4, 16], [0, 16]), warmup=0, repeats=1,
    batches=[1, 2], depths=[0, 1, 2, 4, 6], alphas=[0.6, 0.8], prompt_len=16, output_len=8,
    lossless=dict(batch=2, prompt_len=16, output_len=8,
                  pair=dict(vocab=256, hidden=64, layers=2, heads=4, intermediate=128)),
    overhead_len=8, k=2, reps=2, trees=dict(batches=[1, 2], alpha=0.8, chain="fixed2"),
    budgets=dict(roofline=8, crossover=17, trees=8, lossless=12, overhead=10), sim_reserve_s=4,
    compile_s=1e9)
PARTS = ("roofline", "crossover", "trees", "lossless", "overhead")
# the trees part's tree policies: name -> tree_fixed overrides
TREE_SHAPES = {"tree_eagle": ["policy.shape=eagle"], "tree_2211": ["policy.widths=[2,2,1,1]"]}


# ------------------------------------------------------------------------------------------------ plumbing
class Budget:
    """Seconds a part may still spend: its own budget, and never past the run's deadline."""

    def __init__(self, seconds: float, deadline: float):
        self.end = min(time.monotonic() + seconds, deadline)

    def left(self) -> float:
        return self.end - time.monotonic()


class Ctx:
    """What the parts share: the plan, the device, the models' config dirs, the measured profile, results."""

    def __init__(self, out: Path, plan: dict, smoke: bool, device: str):
        self.out, self.plan, self.smoke, self.device = out, plan, smoke, device
        self.deadline = T0 + plan["total_s"] - plan["report_s"]
        self.parts: list[dict] = []
        self.profile: Path | None = None
        self.info: dict = {}
        self.log = open(out / "log.txt", "a")

    @property
    def torch_device(self):
        import torch
        return torch.device(self.device)

    def say(self, msg: str) -> None:
        line = f"[{time.monotonic() - T0:6.1f} s] {msg}"
        print(line, flush=True)
        self.log.write(line + "\n")
        self.log.flush()


def compose(overrides):
    from hf_backend import compose as _compose
    return _compose(list(overrides))


def with_values(cfg, **values):
    """A copy of a composed config with dotted keys set (keys written with __ for dots)."""
    from omegaconf import OmegaConf
    c = copy.deepcopy(cfg)
    for k, v in values.items():
        OmegaConf.update(c, k.replace("__", "."), v, merge=False)
    return c


def write_csv(path: Path, rows: list[dict]) -> None:
    from specdepth.results import atomic_write, csv_text
    cols = list(dict.fromkeys(k for r in rows for k in r))
    atomic_write(path, csv_text(cols, [[r.get(c) for c in cols] for r in rows]))


def fmt(x, spec=".2f", none="-"):
    return none if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


# ------------------------------------------------------------------------------------------------ setup
def detect(ctx: Ctx) -> None:
    import torch
    import transformers

    from specdepth.cost import hardware_for_device
    name = torch.cuda.get_device_name(0) if ctx.device == "cuda" else "cpu"
    hw = hardware_for_device(name)
    ctx.info = dict(device=name, hardware=hw or "h200", hardware_matched=hw is not None, torch=torch.__version__,
                    transformers=transformers.__version__, smoke=ctx.smoke, dtype=ctx.plan["dtype"],
                    memory_gb=(torch.cuda.get_device_properties(0).total_memory / 2**30 if ctx.device == "cuda"
                               else None))
    ctx.say(f"device {name} -> simulator hardware {ctx.info['hardware']}"
            + ("" if hw else " (no entry for this device: h200 stands in, predictions are not this device's)")
            + f"; torch {torch.__version__}, transformers {transformers.__version__}")


def model_dirs(ctx: Ctx) -> None:
    """config.json of the 8B- and 1B-shaped models (a few hundred bytes each; weights are built on the device)."""
    from transformers import LlamaConfig
    for which, spec in zip(("target", "draft"), ctx.plan["shapes"]):
        d = ctx.out / "_models" / which
        LlamaConfig(**spec, bos_token_id=None, eos_token_id=None, pad_token_id=0).save_pretrained(d)


def big_pair(ctx: Ctx) -> list[str]:
    """Overrides for the random 8B/1B-shaped pair (the tiny pair's tokenizer: ids < 1024 fit any vocabulary)."""
    from specdepth._resolvers import _asset
    m = ctx.out / "_models"
    return [f"model.target={m / 'target'}", f"model.draft={m / 'draft'}", "model.target_arch=null",
            "model.draft_arch=null", "model.init=random", f"model.tokenizer={_asset('tiny_pair/target')}",
            "model.prompts=null", f"model.dtype={ctx.plan['dtype']}", f"model.device={ctx.device}",
            f"model.name={ctx.plan['name']}", "workload=closed", "engine.progress=false", "seed=0"]


def run_dir(ctx: Ctx, *parts) -> Path:
    return ctx.out.joinpath("runs", *[str(p) for p in parts])


def run_engine(cfg) -> dict:
    """One run in-process, with what the result files do not hold: forward time and the executor's outputs."""
    from specdepth.app import build
    from specdepth.engine import STEP_COLUMNS
    parts = build(cfg)
    ex, eng = parts["executor"], parts["engine"]
    res = eng.run()
    tokens = sum(r.output_len for r in eng.requests)
    drafted = sum(s[STEP_COLUMNS.index("drafted")] for s in res.steps)
    accepted = sum(s[STEP_COLUMNS.index("accepted")] for s in res.steps)
    step_s = sum(s[STEP_COLUMNS.index("step_s")] for s in res.steps)
    gens = {g["request_id"]: g["output_ids"] for g in res.extra.get("generations.jsonl", [])}
    return dict(tok_s=tokens / res.wall_s, wall_s=res.wall_s, steps=len(res.steps), step_s=step_s,
                forward_s=ex.forward_s, acceptance=accepted / drafted if drafted else None,
                outputs=[gens.get(r.request_id) for r in eng.requests], prompts=[r.prompt_ids for r in eng.requests],
                target=ex.target_model, draft=ex.draft_model)


# ------------------------------------------------------------------------------------------------ roofline
def part_roofline(ctx: Ctx, budget: Budget) -> dict:
    import numpy as np

    from specdepth.app import build, make
    from specdepth.gpuinfo import snapshot
    from specdepth.profile import measure, write_profile
    p = ctx.plan
    cfg = compose([*big_pair(ctx), "backend=hf", "policy=none", "workload.batch_size=1", "workload.output_len=1"])
    ex = build(cfg)["executor"]
    rows = []
    before = snapshot(ctx.torch_device)
    for which, model in (("target", ex.target_model), ("draft", ex.draft_model)):
        if budget.left() <= 0:
            break
        # the executor's path (static shapes, graphs captured once per shape after the warm-up forwards)
        rows += measure([(which, model)], p["grid"], p["warmup"], p["repeats"], 1, p["dtype"], p["name"],
                        static="graphs")
        ctx.say(f"roofline: {which} profiled ({len(rows)} points)")
    after = snapshot(ctx.torch_device)
    write_profile(rows, ctx.out / "profile.csv")
    complete = {r[0] for r in rows} == {"target", "draft"}
    if complete:
        ctx.profile = ctx.out / "profile.csv"
    rc = compose([*big_pair(ctx), "cost=roofline", f"hardware={ctx.info['hardware']}"])   # backend=sim: no load
    pair, hw = make(rc, "model"), make(rc, "hardware")
    roof = make(rc, "cost", target=pair.target_arch, draft=pair.draft_arch, hardware=hw)
    out = []
    for which, b, q, c, sec, *rest in rows:
        fwd = roof.target_forward if which == "target" else roof.draft_forward
        pred = fwd(np.full(b, c, np.int64), np.full(b, q, np.int64))[0]
        out.append(dict(model=which, batch=b, query=q, context=c, tokens=b * q, measured_s=sec, roofline_s=pred,
                        measured_over_roofline=sec / pred, model_s=rest[4], spread=rest[5], warmup=rest[6],
                        repeats=rest[7], path=("static" if q <= 17 else "eager") + f" ({rest[8]})"))
    write_csv(ctx.out / "roofline.csv", out)
    plot_roofline(out, ctx.out / "roofline.png", f"{ctx.info['device']}: measured vs roofline "
                  f"({ctx.info['hardware']})")
    return dict(status="ok" if complete else "partial", gpu_before=before, gpu_after=after,
                **roofline_text(ctx, out))


def roofline_text(ctx: Ctx, rows: list[dict]) -> dict:
    ctxs = sorted({r["context"] for r in rows})
    mid = ctxs[len(ctxs) // 2] if ctxs else 0
    lines = [f"Forward time, measured vs the simulator's roofline ({ctx.info['hardware']}), context {mid} "
             "tokens per sequence (all points: roofline.csv):", "",
             "| model | batch | query | tokens | path | measured (ms) | spread | roofline (ms) | measured / roofline |",
             "|---|---:|---:|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        if r["context"] == mid:
            lines.append(f"| {r['model']} | {r['batch']} | {r['query']} | {r['tokens']} | {r['path']} | "
                         f"{r['measured_s'] * 1e3:.3f} | {fmt(r['spread'] * 100, '.1f')}% | {r['roofline_s'] * 1e3:.3f} | "
                         f"{r['measured_over_roofline']:.2f} |")
    head = []
    for which in ("target", "draft"):
        d = [r for r in rows if r["model"] == which and r["query"] == 1 and r["context"] == mid]
        if d:
            lo, hi = min(d, key=lambda r: r["batch"]), max(d, key=lambda r: r["batch"])
            ratio = statistics.median(r["measured_over_roofline"] for r in rows if r["model"] == which)
            head.append(f"{which} decode b{lo['batch']} {lo['measured_s'] * 1e3:.2f} ms (roofline "
                        f"{lo['roofline_s'] * 1e3:.2f}), b{hi['batch']} {hi['measured_s'] * 1e3:.2f} ms (roofline "
                        f"{hi['roofline_s'] * 1e3:.2f}); median measured/roofline {ratio:.2f}")
    drops = monotonic_drops(rows)
    head.append(f"{len(drops)} points more than 5% faster than a point with fewer tokens")
    if drops:
        lines += ["", "Forward time falling with more tokens (> 5 %): " + "; ".join(drops)]
    return dict(markdown="\n".join(lines), headline="roofline: " + "; ".join(head))


def monotonic_drops(rows: list[dict], tol: float = 0.05) -> list[str]:
    """Points whose forward is more than `tol` faster than one with fewer tokens (same model and context):
    the forward time should not fall as the tokens grow."""
    out = []
    for which in ("target", "draft"):
        for c in sorted({r["context"] for r in rows}):
            pts = sorted((r for r in rows if r["model"] == which and r["context"] == c), key=lambda r: r["tokens"])
            slowest = None
            for r in pts:
                if slowest is not None and r["tokens"] > slowest["tokens"] and \
                        r["measured_s"] < slowest["measured_s"] * (1 - tol):
                    out.append(f"{which} ctx {c}: {r['batch']}x{r['query']} {r['measured_s'] * 1e3:.2f} ms < "
                               f"{slowest['batch']}x{slowest['query']} {slowest['measured_s'] * 1e3:.2f} ms")
                if slowest is None or r["measured_s"] > slowest["measured_s"]:
                    slowest = r
    return out


def plot_roofline(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from specdepth.results import atomic_savefig
    ctxs = sorted({r["context"] for r in rows})
    mid = ctxs[len(ctxs) // 2] if ctxs else 0
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, which in enumerate(("target", "draft")):
        for q, marker in ((1, "o"), (max((r["query"] for r in rows), default=1), "s")):
            sub = sorted((r for r in rows if r["model"] == which and r["context"] == mid and r["query"] == q),
                         key=lambda r: r["tokens"])
            if sub:
                x = [r["tokens"] for r in sub]
                ax.plot(x, [r["measured_s"] * 1e3 for r in sub], marker, color=f"C{i}", label=f"{which} b x {q}: measured")
                ax.plot(x, [r["roofline_s"] * 1e3 for r in sub], "-" if q == 1 else "--", color=f"C{i}",
                        label=f"{which} b x {q}: roofline")
    ax.set(xscale="log", yscale="log", xlabel="tokens per forward (batch x query)", ylabel="forward time (ms)")
    ax.set_title(f"{title}; context {mid}", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=100)
    plt.close(fig)


# ------------------------------------------------------------------------------------------------ crossover
def policies(ctx: Ctx) -> list[str]:
    return [f"fixed{k}" for k in ctx.plan["depths"]] + ["goodput"]


def bases(ctx: Ctx, backend: list[str], cost: list[str], kinds=("fixed", "goodput")) -> dict:
    """Composed once per (backend, cost, policy kind); cells set alpha, batch and depth on a copy. A kind of
    TREE_SHAPES is tree_fixed with that shape."""
    p = ctx.plan
    common = [*big_pair(ctx), *backend, *cost, "acceptance=iid", f"workload.prompt_len={p['prompt_len']}",
              f"workload.output_len={p['output_len']}"]
    return {kind: compose([*common, *(["policy=tree_fixed", *TREE_SHAPES[kind]] if kind in TREE_SHAPES
                                      else [f"policy={kind}"])]) for kind in kinds}


def cell(base: dict, alpha: float, batch: int, pol: str):
    if pol == "goodput" or pol in TREE_SHAPES:
        return with_values(base[pol], acceptance__alpha=alpha, workload__batch_size=batch)
    return with_values(base["fixed"], acceptance__alpha=alpha, workload__batch_size=batch, policy__depth=int(pol[5:]))


def crossover_cells(ctx: Ctx, batch: int) -> list[tuple]:
    """(alpha key, policy) of one batch size: no speculation once (it never consults the acceptance model),
    then every drafting policy at each acceptance level."""
    a = ctx.plan["alphas"]
    return [(None, "fixed0")] + [(x, pol) for x in a for pol in policies(ctx) if pol != "fixed0"]


def real_crossover(ctx: Ctx, budget: Budget, base: dict, batches=None, cells_of=None,
                   tag: str = "crossover") -> tuple[dict, list, list]:
    """The measurement protocol, per batch size in increasing order: a warm-up pass (every cell once, untimed:
    first use of each shape, its graph capture; recorded in crossover_runs.csv), then `reps` timed passes over
    the same cells in the same order (A B C ... A B C ...: interleaved, so a slow spell of the GPU spreads
    over every cell). A batch size starts only when its passes fit the budget (estimated from the last one).
    Returns ({cell: [summary of each timed pass]}, the cells not run, the run log). batches / cells_of(ctx, b):
    another grid (the trees part's); default the crossover's."""
    from specdepth.app import run
    p, done, skipped, log_rows, last = ctx.plan, {}, [], [], None
    for b in batches or p["batches"]:
        cells = (cells_of or crossover_cells)(ctx, b)
        need = None if last is None else last[1] * (1 + p["reps"]) * (b / last[0]) ** 0.5
        if skipped or (need is not None and budget.left() - p["sim_reserve_s"] < need):
            skipped += [(a, b, pol) for a, pol in cells]
            continue
        t_batch = time.monotonic()
        for rep in range(-1, p["reps"]):   # -1: the warm-up pass
            for akey, pol in cells:
                alpha = p["alphas"][0] if akey is None else akey
                d = run_dir(ctx, tag, "real" if rep >= 0 else "warmup", f"a{akey}", f"b{b}", pol, f"r{max(rep, 0)}")
                t = time.monotonic()
                s = run(with_values(cell(base, alpha, b, pol), resume=False), d)
                log_rows.append(dict(seq=len(log_rows), pass_=("warmup" if rep < 0 else rep), batch=b, alpha=akey,
                                     policy=pol, tok_s=s["throughput_tok_s"], seconds=round(time.monotonic() - t, 4),
                                     captured=sum(s.get("static_shapes", {}).get(m, {}).get("captured", 0)
                                                  for m in ("target", "draft"))))
                if rep >= 0:
                    done.setdefault((akey, b, pol), []).append(s)
        last = (b, (time.monotonic() - t_batch) / (1 + p["reps"]))
        ctx.say(f"{tag}: batch {b}: warm-up + {p['reps']} interleaved passes of {len(cells)} cells in "
                f"{time.monotonic() - t_batch:.1f} s")
    if skipped:
        ctx.say(f"{tag}: budget spent, {len(skipped)} cells not run (from batch {skipped[0][1]})")
    return done, skipped, log_rows


def sim_crossover(ctx: Ctx, base: dict, done: dict, name: str, tag: str = "crossover") -> dict:
    """The simulator's run of every cell measured (backend=sim, the backend's padding and catch-up charged):
    deterministic, once each."""
    from specdepth.app import run
    out = {}
    for (akey, b, pol) in done:
        if time.monotonic() > ctx.deadline:
            break
        alpha = ctx.plan["alphas"][0] if akey is None else akey
        out[(akey, b, pol)] = [run(cell(base, alpha, b, pol), run_dir(ctx, tag, name, f"a{akey}", f"b{b}", pol))]
    return out


REAL = ["backend=hf", "backend.acceptance=simulated", "backend.static_shapes=graphs"]
SIM = ["backend=sim", "backend.pad_ragged=true", "backend.draft_catch_up=true", "engine.charge_policy_time=true"]


def costs(ctx: Ctx) -> tuple[list, list | None]:
    """The simulator's cost overrides: the roofline of the detected device, and the measured profile if any."""
    return (["cost=roofline", f"hardware={ctx.info['hardware']}"],
            ["cost=table", f"cost.path={ctx.profile}"] if ctx.profile else None)


def predictions(ctx: Ctx, done: dict, kinds=("fixed", "goodput"), tag: str = "crossover") -> dict:
    """The simulator's prediction of every measured cell, from the measured profile (if any) and the roofline."""
    hw, table = costs(ctx)
    return {"table": sim_crossover(ctx, bases(ctx, SIM, table, kinds), done, "sim_table", tag) if table else {},
            "roofline": sim_crossover(ctx, bases(ctx, SIM, hw, kinds), done, "sim_roofline", tag)}


def part_crossover(ctx: Ctx, budget: Budget) -> dict:
    from specdepth.gpuinfo import snapshot
    hw, table = costs(ctx)
    before = snapshot(ctx.torch_device)
    done, skipped, log_rows = real_crossover(ctx, budget, bases(ctx, REAL, table or hw))
    after = snapshot(ctx.torch_device)
    preds = predictions(ctx, done)
    rows = crossover_rows(ctx, done, preds)
    write_csv(ctx.out / "crossover.csv", rows)
    write_csv(ctx.out / "crossover_runs.csv", [{("pass" if k == "pass_" else k): v for k, v in r.items()}
                                                for r in log_rows])
    plot_crossover(ctx, rows, ctx.out / "crossover.png")
    text = crossover_text(ctx, rows, table is not None)
    text["markdown"] += "\n\n" + protocol_text(ctx, rows, log_rows, before, after)
    text["headline"] += "; " + protocol_headline(rows, table is not None)
    if skipped:
        text["markdown"] += (f"\n\nBudget spent: {len(skipped)} cells not run (from batch {skipped[0][1]} on).")
    return dict(status="partial" if skipped else "ok", gpu_before=before, gpu_after=after, **text)


BOUND_TOL = 0.03   # a measured speed-up more than 3 % above its tokens-per-step bound is a measurement error


def crossover_rows(ctx: Ctx, done: dict, preds: dict, grid=None) -> list[dict]:
    """One row per (alpha, batch, policy): per source (real: the median of the timed passes, with their
    relative spread; table, roofline: the simulator) throughput, speed-up over no speculation and tokens per
    step. A real speed-up above the cell's tokens-per-step bound (no step can cost less than a step without
    drafts) is not reported: `flag` says so and gives the figure. grid: (alphas, batches, policies), default the
    crossover's."""
    rows = []
    alphas, batches, pols = grid or (ctx.plan["alphas"], ctx.plan["batches"], policies(ctx))
    for a in alphas:
        for b in batches:
            for pol in pols:
                key = (None if pol == "fixed0" else a, b, pol)
                row = dict(alpha=a, batch=b, policy=pol)
                for src, runs in (("real", done), *preds.items()):
                    ss, base = runs.get(key), runs.get((None, b, "fixed0"))
                    tput = statistics.median(s["throughput_tok_s"] for s in ss) if ss else None
                    btput = statistics.median(s["throughput_tok_s"] for s in base) if base else None
                    row[f"{src}_tok_s"] = tput
                    row[f"{src}_speedup"] = tput / btput if tput and btput else None
                    row[f"{src}_tokens_per_step"] = statistics.median(s["tokens_per_step"] for s in ss) if ss else None
                    if src == "real":
                        v = [s["throughput_tok_s"] for s in ss] if ss else []
                        row["real_reps"] = len(v)
                        row["real_spread"] = (max(v) - min(v)) / tput if len(v) > 1 else None
                rows.append(row)
    for r in rows:
        base_tps = next((x["real_tokens_per_step"] for x in rows if x["batch"] == r["batch"]
                         and x["policy"] == "fixed0"), None)
        r["bound"] = r["real_tokens_per_step"] / base_tps if r["real_tokens_per_step"] and base_tps else None
        r["flag"] = None
        if r["real_speedup"] is not None and r["bound"] is not None and r["real_speedup"] > r["bound"] * (1 + BOUND_TOL):
            r["flag"] = f"measurement error: speed-up {r['real_speedup']:.3f} above its bound {r['bound']:.3f}"
            r["real_speedup"] = None
        for src in ("table", "roofline"):
            x, y = r.get(f"{src}_speedup"), r["real_speedup"]
            r[f"{src}_vs_real"] = x / y - 1 if x and y else None
    return rows


def protocol_headline(rows: list[dict], have_table: bool) -> str:
    spreads = [r["real_spread"] for r in rows if r.get("real_spread") is not None]
    flags = sum(bool(r["flag"]) for r in rows)
    out = (f"protocol: {max((r['real_reps'] for r in rows), default=0)} interleaved passes after a warm-up, "
           f"spread median {fmt(statistics.median(spreads) * 100 if spreads else None, '.1f')}% / max "
           f"{fmt(max(spreads) * 100 if spreads else None, '.1f')}%, {flags} speed-ups above their bound")
    if have_table:
        dev = [abs(r["table_vs_real"]) for r in rows if r.get("table_vs_real") is not None and r["policy"] != "fixed0"]
        if dev:
            out += (f"; sim (cost=table) vs measured speed-up: median {statistics.median(dev) * 100:.1f}%, max "
                    f"{max(dev) * 100:.1f}%, {sum(d <= 0.10 for d in dev)} of {len(dev)} within 10%")
    return out


def protocol_text(ctx: Ctx, rows: list[dict], log_rows: list[dict], before: dict, after: dict) -> str:
    warm = [r for r in log_rows if r["pass_"] == "warmup"]
    lines = ["Protocol: per batch size a warm-up pass (every cell once, untimed: "
             f"{sum(r['seconds'] for r in warm):.1f} s, {sum(r['captured'] for r in warm)} graphs captured), then "
             f"{ctx.plan['reps']} timed passes in the same order (crossover_runs.csv lists every run in order); "
             "a cell's figure is the median of its passes, its spread (max - min) / median. "
             "GPU state (NVML) before / after: " + json.dumps(before) + " / " + json.dumps(after), ""]
    flagged = [r for r in rows if r["flag"]]
    if flagged:
        lines += ["Not reported (measurement errors):", ""] + [f"* alpha {r['alpha']}, batch {r['batch']}, "
                                                                f"{r['policy']}: {r['flag']}" for r in flagged]
    return "\n".join(lines)


def crossover_text(ctx: Ctx, rows: list[dict], have_table: bool) -> dict:
    from analyze import crossover
    srcs = ["real", "table", "roofline"] if have_table else ["real", "roofline"]
    lines = ["Crossover batch of fixed depth k (speed-up over no speculation falls below 1; interpolated in "
             "log2 batch): measured / simulator from the measured profile (cost=table) / from the roofline; "
             "speed-up at the smallest and largest batch, same order.", "",
             "| alpha | depth | crossover batch | speed-up b" + str(ctx.plan["batches"][0]) + " | speed-up b"
             + str(ctx.plan["batches"][-1]) + " |", "|---:|---:|---|---|---|"]
    heads = []
    for a in ctx.plan["alphas"]:
        best = None
        for pol in [q for q in policies(ctx) if q != "fixed0"]:
            sub = [r for r in rows if r["alpha"] == a and r["policy"] == pol]
            cross = [crossover([(r["batch"], r[f"{s}_speedup"]) for r in sub])[0] for s in srcs]
            ends = [" / ".join(fmt(e[f"{s}_speedup"]) for s in srcs) for e in (sub[0], sub[-1])]
            lines.append(f"| {a} | {pol} | {' / '.join(cross)} | {ends[0]} | {ends[1]} |")
            b1 = sub[0]["real_speedup"]
            if pol != "goodput" and b1 is not None and (best is None or b1 > best[1]):
                best = (pol, b1, cross, ends[0])
        if best:
            heads.append(f"a={a}: best at b{ctx.plan['batches'][0]} {best[0]} ({best[3]} = "
                         f"{'/'.join(srcs)}), its crossover {' / '.join(best[2])}; " + goodput_gap(rows, a))
    return dict(markdown="\n".join(lines + ["", speedup_table(ctx, rows)]), headline="crossover " + " | ".join(heads))


def goodput_gap(rows: list[dict], a: float) -> str:
    """goodput's measured speed-up against the best fixed depth's, worst batch."""
    gaps = []
    for b in sorted({r["batch"] for r in rows}):
        sub = {r["policy"]: r["real_speedup"] for r in rows if r["alpha"] == a and r["batch"] == b}
        fixed = [v for p, v in sub.items() if p != "goodput" and v is not None]
        if sub.get("goodput") is not None and fixed:
            gaps.append((sub["goodput"] / max(fixed), b))
    if not gaps:
        return "goodput: -"
    gap, b = min(gaps)
    return f"goodput / best fixed >= {gap:.2f} (worst at b{b})"


def speedup_table(ctx: Ctx, rows: list[dict]) -> str:
    pols = [q for q in policies(ctx) if q != "fixed0"]
    out = ["Measured speed-up over no speculation (timing mode), by batch:", ""]
    for a in ctx.plan["alphas"]:
        out += [f"alpha {a}:", "", "| batch | " + " | ".join(pols) + " |", "|---:|" + "---:|" * len(pols)]
        for b in ctx.plan["batches"]:
            v = {r["policy"]: r["real_speedup"] for r in rows if r["alpha"] == a and r["batch"] == b}
            out.append(f"| {b} | " + " | ".join(fmt(v.get(p)) for p in pols) + " |")
        out.append("")
    return "\n".join(out)


def plot_crossover(ctx: Ctx, rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from specdepth.results import atomic_savefig
    alphas = ctx.plan["alphas"]
    fig, axes = plt.subplots(1, len(alphas), figsize=(6 * len(alphas), 4.2), squeeze=False)
    for ax, a in zip(axes[0], alphas):
        for i, pol in enumerate(q for q in policies(ctx) if q != "fixed0"):
            sub = [r for r in rows if r["alpha"] == a and r["policy"] == pol]
            color = "k" if pol == "goodput" else f"C{i}"
            for src, style in (("real", "-o"), ("table", "--"), ("roofline", ":")):
                pts = [(r["batch"], r.get(f"{src}_speedup")) for r in sub if r.get(f"{src}_speedup") is not None]
                if pts:
                    ax.plot(*zip(*pts), style, color=color, ms=3, label=pol if src == "real" else None)
        ax.axhline(1, color="grey", lw=0.8)
        ax.set(xscale="log", xlabel="batch size", ylabel="speed-up over no speculation",
               title=f"alpha {a}: measured (solid), sim table (dashed), sim roofline (dotted)")
        ax.title.set_fontsize(8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=100)
    plt.close(fig)


# ------------------------------------------------------------------------------------------------ trees
def tree_cells(ctx: Ctx, batch: int) -> list[tuple]:
    """The trees part's cells of one batch size: no speculation, the chain, each tree of TREE_SHAPES."""
    T = ctx.plan["trees"]
    return [(None, "fixed0"), (T["alpha"], T["chain"])] + [(T["alpha"], t) for t in TREE_SHAPES]


def part_trees(ctx: Ctx, budget: Budget) -> dict:
    """Draft trees against a chain in timing mode (acceptance=iid: a chain accepts as at alpha, a tree by the
    geometric per-rank table of that alpha), with the crossover's protocol and its simulator predictions."""
    T = ctx.plan["trees"]
    hw, table = costs(ctx)
    kinds = ("fixed", *TREE_SHAPES)
    pols = [p for _, p in tree_cells(ctx, 1)]
    done, skipped, log_rows = real_crossover(ctx, budget, bases(ctx, REAL, table or hw, kinds), T["batches"],
                                             tree_cells, tag="trees")
    preds = predictions(ctx, done, kinds, "trees")
    rows = crossover_rows(ctx, done, preds, ([T["alpha"]], T["batches"], pols))
    write_csv(ctx.out / "trees.csv", rows)
    srcs = ["real", "table", "roofline"] if table else ["real", "roofline"]
    md = [f"Draft trees vs the chain {T['chain']}, timing mode, alpha {T['alpha']} (trees: the geometric per-rank "
          f"table of that alpha); speed-up over no speculation, {' / '.join(srcs)}; tokens per step measured; "
          f"spread of the {ctx.plan['reps']} interleaved passes:", "",
          "| batch | policy | speed-up | tokens/step | spread | flag |", "|---:|---|---|---:|---:|---|"]
    for r in rows:
        if r["policy"] != "fixed0":
            md.append(f"| {r['batch']} | {r['policy']} | {' / '.join(fmt(r.get(f'{x}_speedup')) for x in srcs)} | "
                      f"{fmt(r['real_tokens_per_step'])} | {fmt(r['real_spread'], '.1%')} | {r['flag'] or ''} |")
    if skipped:
        md.append(f"\nBudget spent: {len(skipped)} cells not run (from batch {skipped[0][1]} on).")
    ends = [b for b in T["batches"] if any(r["batch"] == b and r["real_speedup"] is not None for r in rows)]
    head = "trees: " + ("; ".join(
        f"b{b}: " + ", ".join(f"{r['policy']} {fmt(r['real_speedup'])}x" for r in rows
                              if r["batch"] == b and r["policy"] != "fixed0") for b in sorted({ends[0], ends[-1]}))
        if ends else "no cell measured")
    return dict(status="partial" if skipped else "ok", markdown="\n".join(md), headline=head)


# ------------------------------------------------------------------------------------------------ lossless
def lossless_policies() -> list[str]:
    """Every policy config of conf/policy but those that need the simulator's knowledge (oracle: outcomes;
    oracle_expected: acceptance probabilities and the clock's cost), read from an instance of each preset (a
    policy may set them per instance: goodput's requires_true_cost follows its `cost`)."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from specdepth.app import CONF_DIR
    return [f.stem for f in sorted(Path(CONF_DIR, "policy").glob("*.yaml"))
            if not any(getattr(instantiate(OmegaConf.load(f)), a, False)
                       for a in ("requires_oracle", "requires_accept_prob", "requires_true_cost"))]


def first_divergence(got: list, want: list):
    """(request index, token index) of the first output token that differs, or None."""
    for i, (g, w) in enumerate(zip(got, want)):
        if g != w:
            return (i, next((j for j, (x, y) in enumerate(zip(g or [], w)) if x != y), min(len(g or []), len(w))))
    return None


def part_lossless(ctx: Ctx, budget: Budget) -> dict:
    from hf_backend import build_pair, hf_generate
    L = ctx.plan["lossless"]
    rp = ctx.out / "_models" / "random_pair"
    if not (rp / "draft" / "config.json").is_file():
        build_pair(rp, **L["pair"])   # a random target and a draft made of its first layer (float32, saved)
    pairs = (("tiny_pair", ["model=tiny_pair"]),
             ("random_pair", [f"model.target={rp / 'target'}", f"model.draft={rp / 'draft'}", "model.target_arch=null",
                              "model.draft_arch=null", "model.prompts=null", "model.dtype=float32",
                              "model.name=random_pair"]))
    common = ["backend=hf", "backend.static_shapes=graphs", f"model.device={ctx.device}", "workload=closed",
              f"workload.batch_size={L['batch']}",
              f"workload.prompt_len={L['prompt_len']}", f"workload.output_len={L['output_len']}",
              "engine.progress=false", "seed=0"]
    rows = []
    for name, ov in pairs:
        ref = None
        for pol in lossless_policies():
            if budget.left() <= 0:
                rows.append(dict(pair=name, policy=pol, equal=None))
                continue
            r = run_engine(compose([*common, *ov, f"policy={pol}"]))
            if ref is None:   # the target alone, HF generate, greedy, the same prompts (one batch, equal lengths)
                ref = hf_generate(r["target"], None, r["prompts"], L["output_len"])["outputs"]
            rows.append(dict(pair=name, policy=pol, equal=r["outputs"] == ref, acceptance=r["acceptance"],
                             first_divergence=first_divergence(r["outputs"], ref)))
        ctx.say(f"lossless: {name}: {sum(bool(r['equal']) for r in rows if r['pair'] == name)} of "
                f"{sum(r['pair'] == name for r in rows)} policies equal to target-only greedy")
    write_csv(ctx.out / "lossless.csv", rows)
    ran = [r for r in rows if r["equal"] is not None]
    ok = sum(bool(r["equal"]) for r in ran)
    md = ["Greedy outputs vs the target alone (HF generate), every non-oracle policy, batch "
          f"{L['batch']}, {L['output_len']} tokens:", "", "| pair | policy | equal | acceptance | first divergence |",
          "|---|---|---|---:|---|"]
    md += [f"| {r['pair']} | {r['policy']} | {r['equal']} | {fmt(r.get('acceptance'))} | "
           f"{r.get('first_divergence') or '-'} |" for r in rows]
    status = "ok" if len(ran) == len(rows) else "partial"
    return dict(status=status, markdown="\n".join(md),
                headline=f"lossless: {ok} of {len(ran)} runs equal to target-only greedy ("
                         + ", ".join(f"{n} {sum(bool(r['equal']) for r in ran if r['pair'] == n)}/"
                                     f"{sum(r['pair'] == n for r in ran)}" for n, _ in pairs)
                         + (f"; {len(rows) - len(ran)} not run" if len(ran) < len(rows) else "") + ")")


# ------------------------------------------------------------------------------------------------ overhead
def duel(budget: Budget, ours, theirs, reps: int) -> tuple[list, list]:
    """Warm-up each, then `reps` interleaved pairs of runs (fewer when the budget runs out)."""
    t = time.monotonic()
    o = [ours()]
    h = [theirs(o[0])]
    pair_s = time.monotonic() - t
    o, h = [], []
    for _ in range(reps):
        if o and budget.left() < 1.2 * pair_s:
            break
        o.append(ours())
        h.append(theirs(o[-1]))
    return o, h


def part_overhead(ctx: Ctx, budget: Budget) -> dict:
    """Batch 1: our backend graphed (static shapes, CUDA graphs) and eager (the dynamic path) against HF generate
    (k = 0) and HF assisted generation (k = 4), eager, in interleaved pairs after a warm-up; HF generate with a
    static cache compiled into CUDA graphs (torch.compile, mode reduce-overhead) where the budget leaves a
    minute for its compile; and timing mode's cost per step against the lossless run's."""
    from hf_backend import hf_generate
    p, k, n = ctx.plan, ctx.plan["k"], ctx.plan["overhead_len"]
    base = [*big_pair(ctx), "backend=hf", "workload.batch_size=1", f"workload.prompt_len={p['prompt_len']}",
            f"workload.output_len={n}", "policy=fixed"]
    cases, ours_runs = [], []
    for path in ("graphs", "off"):
        label = "graphed" if path == "graphs" else "eager"
        ours0 = compose([*base, "policy.depth=0", f"backend.static_shapes={path}"])
        oursk = compose([*base, f"policy.depth={k}", f"backend.static_shapes={path}"])
        o, h = duel(budget, lambda: run_engine(ours0), lambda r: hf_generate(r["target"], None, r["prompts"], n),
                    p["reps"])
        ours_runs += o if path == "graphs" else []
        cases.append(case_row(f"k=0 {label} vs HF generate", f"ours k=0 ({label}) vs HF generate (eager), batch 1",
                              o, h))
        o, h = duel(budget, lambda: run_engine(oursk),
                    lambda r: hf_generate(r["target"], r["draft"], r["prompts"], n, k), p["reps"])
        ours_runs += o if path == "graphs" else []
        cases.append(case_row(f"k={k} {label} vs HF assisted", f"ours fixed k={k} ({label}, lossless) vs HF assisted "
                              f"k={k} (eager), batch 1", o, h))
        if path == "graphs":
            graphed = o
    if budget.left() > p["compile_s"] and ctx.device == "cuda":
        ours0 = compose([*base, "policy.depth=0", "backend.static_shapes=graphs"])
        o, h = duel(budget, lambda: run_engine(ours0), lambda r: hf_compiled(r["target"], r["prompts"], n), p["reps"])
        cases.append(case_row("k=0 graphed vs HF generate compiled", "ours k=0 (graphed) vs HF generate (static "
                              "cache, torch.compile reduce-overhead), batch 1", o, h))
    alpha = min(max(round(statistics.fmean(r["acceptance"] or 0.0 for r in graphed), 2), 0.0), 0.99)
    timed = compose([*base, f"policy.depth={k}", "backend.acceptance=simulated", "acceptance=iid",
                     f"acceptance.alpha={alpha}", "backend.static_shapes=graphs"])
    t, _ = duel(budget, lambda: run_engine(timed), lambda r: None, p["reps"])
    cases.append(dict(label="timing mode vs lossless, per step",
                      case=f"fixed k={k}: timing mode (iid alpha={alpha}, the measured acceptance) vs lossless",
                      ours_tok_s=max(r["tok_s"] for r in t), other_tok_s=max(r["tok_s"] for r in graphed),
                      ours_ms_per_step=min(r["wall_s"] / r["steps"] for r in t) * 1e3,
                      other_ms_per_step=min(r["wall_s"] / r["steps"] for r in graphed) * 1e3))
    cases[-1]["ratio"] = cases[-1]["ours_ms_per_step"] / cases[-1]["other_ms_per_step"]
    step = sum(r["step_s"] for r in ours_runs)
    outside = step - sum(r["forward_s"] for r in ours_runs)
    steps = sum(r["steps"] for r in ours_runs)
    write_csv(ctx.out / "overhead.csv", cases)
    return overhead_text(cases, outside / step, outside / steps)


def hf_compiled(target, prompts, n):
    """HF generate over a static cache with the model's forward compiled into CUDA graphs (the model's own
    forward is restored afterwards; the first call pays the compile, which duel's warm-up absorbs)."""
    from hf_backend import hf_generate
    import torch
    gc, fwd = target.generation_config, target.forward
    old = getattr(gc, "cache_implementation", None)
    compiled = target.__dict__.get("_specdepth_compiled") or torch.compile(fwd, mode="reduce-overhead")
    target.__dict__["_specdepth_compiled"] = compiled
    try:
        gc.cache_implementation = "static"
        target.forward = compiled
        return hf_generate(target, None, prompts, n)
    finally:
        gc.cache_implementation, target.forward = old, fwd


def case_row(label: str, name: str, ours: list, theirs: list) -> dict:
    o, h = max(ours, key=lambda r: r["tok_s"]), max(theirs, key=lambda r: r["tok_s"])
    return dict(label=label, case=name, ours_tok_s=o["tok_s"], other_tok_s=h["tok_s"], ratio=o["tok_s"] / h["tok_s"],
                identical_outputs=o["outputs"] == h["outputs"], acceptance=o["acceptance"],
                overhead=1 - sum(r["forward_s"] for r in ours) / sum(r["step_s"] for r in ours))


def overhead_text(cases: list[dict], share: float, per_step_s: float) -> dict:
    md = [f"Framework overhead (step time outside the model forwards, CUDA events): {share * 100:.1f}% of step "
          f"time, {per_step_s * 1e3:.2f} ms per step.", "",
          "| case | ours | other | ratio | identical outputs | acceptance |", "|---|---:|---:|---:|---|---:|"]
    for c in cases:
        unit = "ms/step" if "ours_ms_per_step" in c else "tok/s"
        a, b = (c["ours_ms_per_step"], c["other_ms_per_step"]) if unit == "ms/step" else (c["ours_tok_s"], c["other_tok_s"])
        md.append(f"| {c['case']} | {a:.2f} {unit} | {b:.2f} {unit} | {c['ratio']:.2f} | "
                  f"{c.get('identical_outputs', '-')} | {fmt(c.get('acceptance'))} |")
    head = (f"overhead: {share * 100:.1f}% of step time ({per_step_s * 1e3:.2f} ms/step); "
            + "; ".join(f"{c['label']}: {c['ratio']:.2f}x" for c in cases))
    return dict(status="ok", markdown="\n".join(md), headline=head)


# ------------------------------------------------------------------------------------------------ driver
def guarded(ctx: Ctx, name: str, fn, seconds: float) -> None:
    """Run one part; any failure is recorded (with its traceback in log.txt) and the script goes on."""
    t = time.monotonic()
    rec = dict(part=name, budget_s=seconds)
    ctx.say(f"{name}: start (budget {seconds:.0f} s, {ctx.deadline - t:.0f} s left in all)")
    try:
        rec.update(fn(ctx, Budget(seconds, ctx.deadline)) or {})
    except Exception as e:   # noqa: BLE001  (a part's failure must not stop the others)
        rec.update(status="error", error=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
                   headline=f"{name}: ERROR {type(e).__name__}")
        ctx.log.write(traceback.format_exc())
        free_memory()
    rec["seconds"] = round(time.monotonic() - t, 1)
    ctx.parts.append(rec)
    ctx.say(f"{name}: {rec.get('status', 'ok')} in {rec['seconds']} s" + (f" ({rec['error']})" if "error" in rec else ""))
    write_report(ctx)


def free_memory() -> None:
    try:
        import torch
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:   # noqa: BLE001
        pass


def write_report(ctx: Ctx) -> list[str]:
    from specdepth.results import atomic_write
    i = ctx.info
    heads = [f"device: {i.get('device')} (simulator entry {i.get('hardware')}), torch {i.get('torch')}, transformers "
             f"{i.get('transformers')}, {i.get('dtype')} random-weight {ctx.plan['name']}"
             + (", SMOKE (CPU, tiny shapes: no figure here is a result)" if ctx.smoke else "")]
    heads += [r["headline"] for r in ctx.parts if r.get("headline")]
    heads.append("parts: " + ", ".join(f"{r['part']} {r.get('status', 'ok')} {r['seconds']} s" for r in ctx.parts)
                 + f"; total {time.monotonic() - T0:.0f} s")
    md = ["# GPU check: " + i.get("device", "?"), "", "```", *heads, "```", ""]
    for r in ctx.parts:
        md += [f"## {r['part']} ({r.get('status', 'ok')}, {r['seconds']} s of {r['budget_s']} s)", ""]
        md += [r.get("markdown") or r.get("error") or "", ""]
    atomic_write(ctx.out / "summary.md", "\n".join(md))
    atomic_write(ctx.out / "results.json", json.dumps(dict(info=i, parts=ctx.parts, headlines=heads), indent=2,
                                                      default=str) + "\n")
    return heads


def setup(ctx: Ctx, budget: Budget) -> dict:
    detect(ctx)
    model_dirs(ctx)
    return dict(status="ok")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny shapes, the same code (< 1 minute)")
    ap.add_argument("--parts", default=",".join(PARTS), help="comma-separated subset of " + ",".join(PARTS))
    ap.add_argument("--budget", type=float, default=None, help="seconds in all (default 450; smoke 55)")
    a = ap.parse_args(argv)
    plan = dict(SMOKE if a.smoke else FULL)
    if a.budget:
        scale = a.budget / plan["total_s"]
        plan.update(total_s=a.budget, budgets={k: v * scale for k, v in plan["budgets"].items()})
    import torch
    if not a.smoke and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; run it on a GPU machine, or --smoke on CPU", file=sys.stderr)
        return 2
    unknown = sorted(set(a.parts.split(",")) - set(PARTS))
    if unknown:
        print(f"gpu_check: --parts: unknown {unknown}; known: {list(PARTS)}", file=sys.stderr)
        return 2
    a.out.mkdir(parents=True, exist_ok=True)
    ctx = Ctx(a.out, plan, a.smoke, "cpu" if a.smoke else "cuda")
    from specdepth.hf_runner import MODELS
    with MODELS.keep():
        guarded(ctx, "setup", setup, 30)
        for part in PARTS:
            if part in a.parts.split(","):
                guarded(ctx, part, globals()[f"part_{part}"], plan["budgets"][part])
    heads = write_report(ctx)
    print("\n".join(["", "=" * 100, *heads]), flush=True)
    return 1 if any(r.get("status") == "error" for r in ctx.parts) else 0


if __name__ == "__main__":
    sys.exit(main())
