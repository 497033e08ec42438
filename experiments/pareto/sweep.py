"""Run the `experiment=pareto` grid in-process, fast.

    .venv/bin/python experiments/pareto/sweep.py [--out outputs/multirun/pareto] [--jobs 2] [--only pol=goodput]

Same grid, same run directories and the same resolved per-run config.yaml as

    specdepth experiment=pareto

but Hydra composes the config once per hardware instead of twice per job (its basic sweeper composes
every job to validate the batch, then again to launch it: ~1 CPU-second per job, 20+ minutes for the
1,280 runs here, against a few minutes of simulation). The grid's other axes are plain keys (pol, acc,
cell), so a job is the composed config with three keys set. Runs go through `specdepth.app.run`, so
resume=true skips runs already finished by either path.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

import yaml
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from specdepth.app import CONF_DIR, run
from specdepth.errors import SpecdepthError

ROOT = Path(__file__).resolve().parents[2]


def grid_params() -> dict[str, list]:
    """The sweep axes of conf/experiment/pareto.yaml, parsed with Hydra's override grammar."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    raw = yaml.safe_load((Path(CONF_DIR) / "experiment" / "pareto.yaml").read_text())
    params = raw["hydra"]["sweeper"]["params"]
    parser = OverridesParser.create()
    out = {}
    for key, spec in params.items():
        ov = parser.parse_override(f"{key}={spec}")
        out[key] = list(ov.sweep_iterator()) if ov.is_sweep_override() else [ov.value()]
    return out


def jobs(only: dict[str, set]) -> list[tuple]:
    p = grid_params()
    out = []
    for hw in p["hardware"]:
        for acc in p["acc"]:
            for cell in p["cell"]:
                for pol in p["pol"]:
                    j = dict(hardware=hw, acc=acc, cell=dict(cell), pol=pol)
                    if all(str(j[k] if k != "cell" else j[k]["batch"]) in v for k, v in only.items()):
                        out.append(j)
    return out


_BASE = {}


def _base(hw: str, extra: tuple):
    if hw not in _BASE:
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            cfg = compose("config", overrides=["experiment=pareto", f"hardware={hw}", *extra])
        _BASE[hw] = cfg
    return _BASE[hw]


def run_job(args):
    j, out_dir, extra = args
    cfg = _base(j["hardware"], extra).copy()
    cfg.pol, cfg.acc = j["pol"], j["acc"]
    cfg.cell = j["cell"]
    run_dir = Path(out_dir) / j["hardware"] / j["acc"] / f"b{j['cell']['batch']}" / j["pol"]
    t = time.perf_counter()
    try:
        s = run(cfg, run_dir)
    except SpecdepthError as e:   # one bad run does not stop the sweep; it has no summary.json
        print(f"FAILED {run_dir}: {e}", flush=True)
        return j, None, time.perf_counter() - t
    return j, s.get("throughput_tok_s"), time.perf_counter() - t


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "outputs" / "multirun" / "pareto"))
    ap.add_argument("--jobs", type=int, default=1, help="worker processes")
    ap.add_argument("--only", action="append", default=[],
                    help="restrict an axis, e.g. --only pol=goodput,fixed3 --only batch=1,2 (repeatable)")
    ap.add_argument("overrides", nargs="*", help="extra config overrides for every run (e.g. seed=1)")
    a = ap.parse_args(argv)
    only = {}
    for o in a.only:
        k, v = o.split("=", 1)
        only[k if k != "batch" else "cell"] = set(v.split(","))
    todo = jobs(only)
    print(f"{len(todo)} runs -> {a.out}", flush=True)
    t0 = time.perf_counter()
    work = [(j, a.out, tuple(a.overrides)) for j in todo]
    if a.jobs > 1:
        with mp.get_context("fork").Pool(a.jobs) as pool:
            results = pool.imap_unordered(run_job, work, chunksize=4)
            _report(results, len(work), t0)
    else:
        _report(map(run_job, work), len(work), t0)
    print(f"done: {len(work)} runs in {time.perf_counter() - t0:.0f} s wall", flush=True)


def _report(results, n, t0):
    for i, (j, thr, dt) in enumerate(results, 1):
        if dt > 5 or i % 50 == 0 or i == n:
            print(f"[{i}/{n}] {time.perf_counter() - t0:6.0f} s  {j['hardware']} {j['acc']} b{j['cell']['batch']} "
                  f"{j['pol']}: {'FAILED' if thr is None else format(thr, ',.0f')} tok/s ({dt:.1f} s)", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("HYDRA_FULL_ERROR", "1")
    sys.exit(main())
