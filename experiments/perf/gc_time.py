"""Benchmark: time spent in Python's garbage collector inside a real-backend run, with and without
`engine.gc_freeze`, on the cell of experiment=real_pareto (model=tiny_pair, backend=hf, a closed batch of
64-token prompts and 128-token outputs).

    OMP_NUM_THREADS=1 taskset -c 1 .venv/bin/python experiments/perf/gc_time.py [--batch 4,32] [--policies none,goodput]

Each (batch, policy, gc_freeze) runs twice in one process (the first loads the models); the second is measured
with gc.callbacks: per generation, the collections and their milliseconds, next to the run's decode seconds
(time_s - prefill_time_s) and the tracked objects alive after it.
"""
from __future__ import annotations

import argparse
import gc
import tempfile
import time

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from specdepth.app import CONF_DIR, run


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", default="4,32")
    ap.add_argument("--policies", default="none,goodput")
    a = ap.parse_args(argv)
    stats: dict = {}
    began = [0.0]

    def callback(phase, info):
        if phase == "start":
            began[0] = time.perf_counter()
        else:
            n, t = stats.get(info["generation"], (0, 0.0))
            stats[info["generation"]] = (n + 1, t + time.perf_counter() - began[0])

    GlobalHydra.instance().clear()
    print("| batch | policy | gc_freeze | decode s | collections (ms) by generation | objects after |")
    print("|---:|---|---|---:|---|---:|")
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None), tempfile.TemporaryDirectory() as d:
        for b in (int(x) for x in a.batch.split(",")):
            for pol in a.policies.split(","):
                for freeze in ("true", "false"):
                    cfg = compose("config", overrides=["experiment=real_pareto", f"pol={pol}", "hydra.mode=RUN",
                                                       f"workload.batch_size={b}", "resume=false",
                                                       f"engine.gc_freeze={freeze}"])
                    run(cfg, f"{d}/warm")
                    stats.clear()
                    gc.callbacks.append(callback)
                    try:
                        s = run(cfg, f"{d}/timed")
                    finally:
                        gc.callbacks.remove(callback)
                    per = ", ".join(f"gen {g}: {n} ({t * 1e3:.1f})" for g, (n, t) in sorted(stats.items()))
                    print(f"| {b} | {pol} | {freeze} | {s['time_s'] - s['prefill_time_s']:.3f} | {per or 'none'} | "
                          f"{len(gc.get_objects())} |")


if __name__ == "__main__":
    main()
