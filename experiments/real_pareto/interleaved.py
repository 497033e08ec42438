"""Policies (or one policy's variants) side by side on the real backend, interleaved in one process: the cell of
`experiment=real_pareto` (model=tiny_pair, backend=hf, this machine's profile, a closed batch of 64-token
prompts and 128-token outputs), every variant once per repetition and batch size, in turn, so that a slow spell
of the machine hits them all. Run it pinned on a quiet machine:

    OMP_NUM_THREADS=1 taskset -c 1 .venv/bin/python experiments/real_pareto/interleaved.py --batch 2,4 --reps 2 \
        none goodput goodput:policies.goodput.row_calibration=0
    ... --gc-freeze none goodput confidence      # gc.collect(); gc.freeze() before each run

A variant is `pol[:override[:override...]]` (overrides of the real_pareto config). Prints, per batch and
variant, the mean over repetitions of the summary's verify, draft and overhead seconds and the decode time
(time_s - prefill_time_s), and the decode time's ratio to the first variant's. Runs go to a temporary folder.
"""
from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from specdepth.app import CONF_DIR, run

FIELDS = ("verify_time_s", "draft_time_s", "overhead_time_s")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("variants", nargs="+", help="pol[:override...], e.g. goodput:policies.goodput.probe=0")
    ap.add_argument("--batch", default="2")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--gc-freeze", action="store_true")
    a = ap.parse_args(argv)
    batches = [int(b) for b in a.batch.split(",")]
    res: dict = {}
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None), tempfile.TemporaryDirectory() as tmp:
        for _ in range(a.reps):
            for b in batches:
                for i, v in enumerate(a.variants):
                    pol, *over = v.split(":")
                    try:
                        cfg = compose("config", overrides=["experiment=real_pareto", f"pol={pol}", "hydra.mode=RUN",
                                                           f"workload.batch_size={b}", "resume=false", *over])
                        if a.gc_freeze:
                            gc.collect()
                            gc.freeze()
                        s = run(cfg, f"{tmp}/b{b}_{i}")
                    except Exception as e:   # one line naming the variant, not a traceback
                        sys.exit(f"interleaved.py: variant {v!r} at batch {b}: {type(e).__name__}: "
                                 f"{str(e).splitlines()[0] if str(e) else ''}")
                    res.setdefault((b, v), []).append([s[f] for f in FIELDS] + [s["time_s"] - s["prefill_time_s"]])
    print("| batch | variant | verify s | draft s | overhead s | decode s | decode / first |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for b in batches:
        first = statistics.mean(r[3] for r in res[(b, a.variants[0])])
        for v in a.variants:
            m = [statistics.mean(col) for col in zip(*res[(b, v)])]
            print(f"| {b} | {v} | {m[0]:.3f} | {m[1]:.3f} | {m[2]:.3f} | {m[3]:.3f} | {m[3] / first:.3f} |")


if __name__ == "__main__":
    main()
