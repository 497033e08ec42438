"""Run a robustness draw (issue 12) in-process, fast: every policy on every cell of `draw.py`'s draw.

    .venv/bin/python experiments/robustness/run.py --seed 1 [--cells 240] [--jobs 2] [--out outputs/robustness]
                                                   [--only pol=goodput,none --only kind=closed --only cell=0,5]
                                                   [--max-tokens 1000] [--replicate 3]

Each run is `specdepth experiment=robustness pol=<pol> cell=<cell>` (conf/experiment/robustness.yaml) and
writes exactly what that command writes (summary.json, config.yaml, steps.csv, requests.csv, through
`specdepth.app.run`) into <out>/seed<seed>/c<cell id>/<pol>/; the draw itself goes to
<out>/seed<seed>/cells.json. resume=true: a rerun skips the runs already finished with the same config.

Why not `--multirun`: Hydra's basic sweeper composes every job's config twice (to validate the batch, then
to launch it) and a single `specdepth` call pays its start-up (imports, composition, loading the compiled
kernels) each time; against ~0.06 s of simulation per run that dominated. Here the experiment is composed
once, before the worker processes fork (they inherit the composed config and the loaded kernels); its
constant nodes (the policy, hardware and model presets) are resolved once, and a job's config is built
from them and the cell (`job_config`), resolving to exactly what the CLI resolves. The biggest cells go
first so the two workers finish together.

`--replicate R` (R > 0) runs the same cells with another seed each, derived from the cell's seed and R (other
acceptance outcomes, and other lengths and arrivals where the workload draws them), for `replicates.py`, which
averages each policy's throughput over the replicates; give each replicate its own --out (its cells.json holds
its seeds). `--max-tokens W` keeps the cells with at most W output tokens in all (the short runs, where one
draw of outcomes decides).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

import numpy as np
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

sys.path.insert(0, str(Path(__file__).resolve().parent))
from draw import command, draw  # noqa: E402

from specdepth.app import CONF_DIR, run  # noqa: E402
from specdepth.errors import SpecdepthError  # noqa: E402
from specdepth.results import atomic_write  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
POLICIES = ("none", "fixed1", "fixed2", "fixed3", "fixed4", "fixed5", "fixed6", "fixed7", "fixed8",
            "goodput", "batch_scaled", "confidence", "ema", "heuristic", "bandit", "disable_by_batch", "batch_table",
            "oracle", "oracle_expected", "oracle_causal", "goodput_true", "goodput_model")
_BASE = {}


def base_config(extra: tuple = ()):
    """experiment=robustness, composed once per process (forked workers inherit it)."""
    if extra not in _BASE:
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            _BASE[extra] = compose("config", overrides=["experiment=robustness", *extra])
    return _BASE[extra]


def cell_node(cell: dict) -> dict:
    """The `cell` node of conf/experiment/robustness.yaml from a draw's cell."""
    return {k: cell[k] for k in ("hardware", "model", "tp", "batch", "seed", "acceptance", "workload", "backend")}


_PLAIN = {}
_JOB = {}


def job_config(cell: dict, pol: str, extra: tuple = ()):
    """The job's config: exactly what `specdepth experiment=robustness pol=<pol> cell=<cell>` resolves to
    (tests/test_robustness.py checks it), built without re-resolving the experiment's big constant nodes
    (policies, hardwares, models) for every job: they are resolved once per process, and the few keys that
    depend on the cell (conf/experiment/robustness.yaml's interpolations) are set directly.

    The process keeps one job config per `extra` and rewrites those keys in it for the next job (building the
    whole config, ~2,500 nodes, took a third of a short run's time): use it before the next call."""
    if extra not in _PLAIN:
        _PLAIN[extra] = OmegaConf.to_container(base_config(extra), resolve=False)
        for key in ("policies", "hardwares", "models"):
            _PLAIN[extra][key] = OmegaConf.to_container(base_config(extra)[key], resolve=True)
    base = _PLAIN[extra]
    node = cell_node(cell)
    job = dict(pol=pol, cell=node, seed=node["seed"], policy=base["policies"][pol],
               hardware=base["hardwares"][node["hardware"]], model=base["models"][node["model"]],
               acceptance=node["acceptance"], workload=node["workload"],
               engine=dict(base["engine"], max_batch_size=node["batch"]),
               backend=dict(base["backend"], **node["backend"]), parallel=dict(base["parallel"], tensor=node["tp"]))
    cfg = _JOB.get(extra)
    if cfg is None:
        cfg = _JOB[extra] = OmegaConf.create(dict(base, **job))
    else:
        for key, value in job.items():   # a dict replaces the node whole (OmegaConf copies it)
            cfg[key] = value
    return cfg


def run_job(args):
    cell, pol, run_dir, extra = args
    cfg = job_config(cell, pol, extra)
    t = time.perf_counter()
    try:
        s = run(cfg, run_dir)
    except SpecdepthError as e:   # one bad run does not stop the draw; it leaves no summary.json
        print(f"FAILED {run_dir}: {e}", flush=True)
        return cell["id"], pol, None, time.perf_counter() - t
    return cell["id"], pol, s.get("throughput_tok_s"), time.perf_counter() - t


def _tokens(cell: dict) -> float:
    """A cell's output tokens in all: mean length x requests (a closed batch: the batch)."""
    return (cell["workload"].get("num_requests") or cell["batch"]) * cell["out_mean"]


def work_estimate(cell: dict) -> float:
    """Relative simulation cost of a cell: its verify steps (tokens / batch) plus per-row work."""
    return _tokens(cell) / cell["batch"] * (1.0 + cell["batch"] / 64.0)


def replicate(cell: dict, r: int) -> dict:
    """The cell with the seed of its replicate r (0: itself)."""
    if not r:
        return cell
    return dict(cell, seed=int(np.random.SeedSequence([int(cell["seed"]), int(r)]).generate_state(1)[0]))


def output_tokens(cell: dict) -> int:
    """A cell's output tokens in all, whole (--max-tokens)."""
    return int(_tokens(cell))


def select(cells: list[dict], only: dict) -> list[tuple[dict, str]]:
    pols = only.get("pol", POLICIES)
    out = []
    for c in cells:
        if "cell" in only and str(c["id"]) not in only["cell"]:
            continue
        if any(k in only and str(c[k]) not in only[k] for k in ("kind", "acc", "hardware", "model")):
            continue
        out += [(c, p) for p in POLICIES if p in pols]
    unknown = set(pols) - set(POLICIES)
    if unknown:
        raise SystemExit(f"run.py: unknown policy {sorted(unknown)}; choose from {', '.join(POLICIES)}")
    return sorted(out, key=lambda cp: -work_estimate(cp[0]))


def _warm():
    """Load the compiled kernels once in the parent (the workers inherit them)."""
    cfg = base_config().copy()
    cfg.workload.output_len = 8
    from specdepth.app import build
    build(cfg)["engine"].run()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, required=True, help="the draw's seed")
    ap.add_argument("--cells", type=int, default=240)
    ap.add_argument("--out", default=str(ROOT / "outputs" / "robustness"))
    ap.add_argument("--jobs", type=int, default=2, help="worker processes")
    ap.add_argument("--only", action="append", default=[],
                    help="restrict: pol=a,b  cell=0,3  kind=closed  acc=iid  hardware=h200  model=llama3_8b")
    ap.add_argument("--replicate", type=int, default=0,
                    help="R > 0: every cell with a seed derived from its own and R (replicates.py)")
    ap.add_argument("--max-tokens", type=int, default=None, help="only cells with at most this many output tokens")
    ap.add_argument("overrides", nargs="*", help="config overrides for every run (e.g. policy.calibration.memory=100)")
    a = ap.parse_args(argv)
    only = {k: set(v.split(",")) for k, v in (o.split("=", 1) for o in a.only)}
    t0 = time.perf_counter()
    if a.replicate < 0:
        raise SystemExit(f"run.py: --replicate must be >= 0, got {a.replicate}")
    cells = [replicate(c, a.replicate) for c in draw(a.seed, a.cells)]
    if a.max_tokens is not None:
        only["cell"] = {str(c["id"]) for c in cells if output_tokens(c) <= a.max_tokens} & only.get("cell", {
            str(c["id"]) for c in cells})
    out = Path(a.out) / f"seed{a.seed}"
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "cells.json", json.dumps([dict(c, command=command(c)) for c in cells], indent=1))
    todo = select(cells, only)
    extra = tuple(a.overrides)
    base_config(extra)
    _warm()
    work = [(c, p, str(out / f"c{c['id']}" / p), extra) for c, p in todo]
    print(f"{len(work)} runs ({len({c['id'] for c, _ in todo})} cells) -> {out}; set-up {time.perf_counter() - t0:.1f} s",
          flush=True)
    t1 = time.perf_counter()
    if a.jobs > 1:
        with mp.get_context("fork").Pool(a.jobs) as pool:
            busy = _report(pool.imap_unordered(run_job, work, chunksize=1), len(work), t1)
    else:
        busy = _report(map(run_job, work), len(work), t1)
    wall = time.perf_counter() - t1
    print(f"done: {len(work)} runs in {wall:.0f} s wall ({busy:.0f} s in jobs, {a.jobs} workers; "
          f"{wall * a.jobs / max(len(work), 1) * 1e3:.0f} ms of worker time per run)", flush=True)


def _report(results, n, t0) -> float:
    busy = 0.0
    for i, (cid, pol, thr, dt) in enumerate(results, 1):
        busy += dt
        if dt > 20 or i % 200 == 0 or i == n:
            print(f"[{i}/{n}] {time.perf_counter() - t0:6.0f} s  c{cid} {pol}: "
                  f"{'FAILED' if thr is None else format(thr, ',.0f')} tok/s ({dt:.1f} s)", flush=True)
    return busy


if __name__ == "__main__":
    os.environ.setdefault("HYDRA_FULL_ERROR", "1")
    sys.exit(main())
