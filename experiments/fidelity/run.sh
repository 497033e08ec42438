#!/usr/bin/env bash
# Studies 6 and 7 of issue 7, end to end, from the repository root:
#   bash experiments/fidelity/run.sh                 # the shipped pair (model=tiny_pair)
#   MODEL="model.target=/tmp/t model.draft=/tmp/d model.prompts=/tmp/p.jsonl" NAME=standin bash experiments/fidelity/run.sh
#   OUT=/tmp/x EXTRA="workload.batch_size=1,8 pol=none,fixed2,goodput" REPS=0 ...   # a small trial
# Steps: profile -> real sweep (experiment=real_pareto) -> traces -> simulated sweep (plain table) -> overhead
# fit (rep 0) -> simulated sweep (table + fitted overheads) -> both analyses. Each step resumes (finished runs are skipped).
set -euo pipefail
export OMP_NUM_THREADS=1
PY=.venv/bin/python
MODEL=${MODEL:-}
EXTRA=${EXTRA:-}   # extra overrides for both sweeps, e.g. "workload.batch_size=1,2 pol=none,goodput"
NAME=${NAME:-real_pareto}
PROFILE=${PROFILE:-experiments/fidelity/profile.csv}
REPS=${REPS:-0,1}
if [ ! -f "$PROFILE" ]; then
  .venv/bin/specdepth-profile model=tiny_pair $MODEL num_threads=1 'grid.batch=[1,2,4,8,16,32]' \
    'grid.query=[1,2,3,4,5,7,9,17,64]' 'grid.context=[0,128]' repeats=5 warmup=2 output="$PWD/$PROFILE"
fi
.venv/bin/specdepth experiment=real_pareto $MODEL cost.path="$PROFILE" name="$NAME" rep="$REPS" $EXTRA
$PY experiments/fidelity/prepare.py "outputs/multirun/$NAME" "outputs/fidelity_traces/$NAME"
.venv/bin/specdepth experiment=fidelity_sim $MODEL cost.path="$PROFILE" rep="$REPS" \
  fid.traces="outputs/fidelity_traces/$NAME" name="${NAME}_sim_table" $EXTRA
# fixed costs around the forwards, fitted on repetition 0 only (rep 1 is the out-of-sample check)
OH=$($PY experiments/fidelity/calibrate.py "outputs/multirun/$NAME" "outputs/multirun/${NAME}_sim_table" \
  --fit-rep "${FIT_REP:-0}" | tail -1)
.venv/bin/specdepth experiment=fidelity_sim $MODEL cost.path="$PROFILE" rep="$REPS" \
  fid.traces="outputs/fidelity_traces/$NAME" name="${NAME}_sim_overhead" $OH $EXTRA
if [ -n "${OUT:-}" ]; then   # a trial: figures and tables elsewhere, READMEs untouched
  FA=(--out "$OUT/fidelity"); RA=(--out "$OUT/real_pareto")
else
  FA=(--readme experiments/fidelity/README.md); RA=(--readme experiments/real_pareto/README.md)
fi
$PY experiments/fidelity/analyze.py "outputs/multirun/$NAME" "outputs/multirun/${NAME}_sim_table" \
  "outputs/multirun/${NAME}_sim_overhead" "${FA[@]}"
$PY experiments/real_pareto/analyze.py "outputs/multirun/$NAME" "${RA[@]}"
