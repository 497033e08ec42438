"""Benchmark: a policy's own time per engine step (plan + observe + keep_drafting), in the simulator, on the
cell experiments/real_pareto runs on the real backend: model=tiny_pair, this machine's profile as the cost
model (cost=table, experiments/fidelity/profile.csv), a closed batch of 64-token prompts and 128-token outputs,
padded verifies and small per-step / per-position overheads.

    OMP_NUM_THREADS=1 taskset -c 1 .venv/bin/python experiments/perf/policy_step_time.py \
        [--policies goodput,batch_scaled,confidence] [--batch 1,8,32] [--seed 3]

Each cell runs twice (the first run loads the compiled kernels) and the second is timed with
time.perf_counter around the three hooks. Prints microseconds per step per hook. On the real backend a step
of this pair takes ~5 ms at batch 1, so 0.5 ms of policy time is ~10 % of it.
`--real`: the same on the real backend itself, experiment=real_pareto's cell (model=tiny_pair, backend=hf, its
closed batch of 64-token prompts and 128-token outputs), where the decisions, and so the hooks' work, follow
the measured step times.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from specdepth.app import CONF_DIR, build

ROOT = Path(__file__).resolve().parents[2]
HOOKS = ("plan", "observe", "keep_drafting")


def cell(policy: str, batch: int, seed: int) -> list[str]:
    return ["engine.progress=false", "model=tiny_pair", "cost=table",
            f"cost.path={ROOT / 'experiments/fidelity/profile.csv'}", "workload=closed",
            f"workload.batch_size={batch}", "workload.output_len=128", "workload.prompt_len=64",
            f"policy={policy}", "backend.pad_ragged=true", "backend.step_overhead_s=0.0003",
            "backend.position_overhead_s=0.0002", f"seed={seed}"]


def timed(cfg) -> tuple[int, dict[str, float]]:
    build(cfg)["engine"].run()   # warm: the compiled kernels load on the first run
    engine = build(cfg)["engine"]
    spent = dict.fromkeys(HOOKS, 0.0)
    for name in HOOKS:
        hook = getattr(engine.policy, name)

        def wrapped(*args, _hook=hook, _name=name):
            t = time.perf_counter()
            out = _hook(*args)
            spent[_name] += time.perf_counter() - t
            return out
        setattr(engine.policy, name, wrapped)
    steps = len(engine.run().steps)
    return steps, spent


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policies", default="goodput,batch_scaled,confidence")
    ap.add_argument("--batch", default="1,8,32")
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--real", action="store_true", help="experiment=real_pareto's cell on backend=hf")
    a = ap.parse_args(argv)
    GlobalHydra.instance().clear()
    print("Cell: experiment=real_pareto on backend=hf, this machine (wall clock)" if a.real else
          "Cell: simulator, model=tiny_pair, cost=table (experiments/fidelity/profile.csv), closed batch")
    print("| policy | batch | steps | " + " | ".join(f"{h} (us/step)" for h in HOOKS) + " | total (us/step) |")
    print("|---|---:|---:|" + "---:|" * (len(HOOKS) + 1))
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        for pol in a.policies.split(","):
            for b in (int(x) for x in a.batch.split(",")):
                over = (["experiment=real_pareto", f"pol={pol}", f"workload.batch_size={b}", f"seed={a.seed}"]
                        if a.real else cell(pol, b, a.seed))
                steps, spent = timed(compose("config", overrides=over))
                per = [spent[h] / steps * 1e6 for h in HOOKS]
                print(f"| {pol} | {b} | {steps} | " + " | ".join(f"{x:.0f}" for x in per) + f" | {sum(per):.0f} |")


if __name__ == "__main__":
    main()
