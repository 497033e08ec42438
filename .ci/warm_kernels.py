"""Compile (and cache on disk) the numba kernels of the simulator and the built-in policies, by running each
adaptive policy on small simulator cells. .ci/run starts it in the background on the second core while the
suite runs on the first, so the suite mostly loads kernels instead of compiling them; a kernel the suite reaches
first compiles there as usual (numba's cache writes are atomic), so the results do not depend on it."""
from __future__ import annotations

from hydra import compose, initialize_config_dir

from specdepth.app import CONF_DIR, build

CELLS = (["workload.batch_size=24", "workload.output_len={dist: uniform, low: 8, high: 64}"],
         ["workload=poisson", "workload.rate=1e9", "workload.num_requests=64", "engine.max_batch_size=24",
          "workload.max_concurrency=24", "workload.output_len=32"])
POLICIES = (["policy=goodput"], ["policy=confidence"], ["policy=batch_scaled"], ["policy=fixed"],
            ["policy=tree_goodput", "acceptance=ranked"], ["policy=tree_confidence", "acceptance=ranked"],
            ["policy=oracle_expected"], ["policy=heuristic"], ["policy=ema"], ["policy=bandit"])

with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
    for policy in POLICIES:
        for cell in CELLS:
            build(compose("config", overrides=[*policy, *cell]))["engine"].run()
