#!/usr/bin/env bash
# Study 6 with controlled acceptance (issue 15): the fidelity study in timing mode (backend=hf
# backend.acceptance=simulated) at two fixed acceptance levels, from the repository root, on a quiet machine:
#   bash experiments/fidelity/run_timing.sh                       # ALPHAS="0.6 0.85", 3 repetitions each
#   ALPHAS=0.6 REPS=0 EXTRA="workload.batch_size=1,2 pol=none,fixed2" OUT=/tmp/ft bash experiments/fidelity/run_timing.sh
# Each level is one `ALPHA=<a> bash experiments/fidelity/run.sh` (its own profile passes, real sweep, simulated
# sweeps, overhead fit and analysis -> ${OUT:-experiments/fidelity/timing}/a<a>/results.md). Every other
# variable of run.sh (EXTRA, REPS, PGRID, MODEL, PROFILE, OUT) passes through.
set -euo pipefail
for a in ${ALPHAS:-0.6 0.85}; do
  ALPHA=$a bash experiments/fidelity/run.sh
done
