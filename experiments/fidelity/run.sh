#!/usr/bin/env bash
# Studies 6 and 7 of issue 7, end to end, from the repository root:
#   bash experiments/fidelity/run.sh                 # the shipped pair (model=tiny_pair)
#   MODEL="model.target=/tmp/t model.draft=/tmp/d model.prompts=/tmp/p.jsonl" NAME=standin bash experiments/fidelity/run.sh
#   OUT=/tmp/x EXTRA="workload.batch_size=1,8 pol=none,fixed2,goodput" REPS=0 ...   # a small trial
#   ALPHA=0.6 bash experiments/fidelity/run.sh       # timing mode at a fixed acceptance level (issue 15;
#                                                     # run_timing.sh runs both levels)
# Steps: profile (the policies' table) -> per repetition: a profile pass, then the real sweep (experiment=real_pareto,
# or experiment=fidelity_timing with ALPHA); a last profile pass; their median = the clock profile -> traces (not in
# timing mode: the simulator draws the same outcomes from the same acceptance model) -> simulated sweep (plain table)
# -> overhead fit (rep 0) -> simulated sweep (table + fitted overheads) -> the analyses. Each step resumes
# (finished runs are skipped).
set -euo pipefail
export OMP_NUM_THREADS=1
PY=.venv/bin/python
MODEL=${MODEL:-}
EXTRA=${EXTRA:-}   # extra overrides for both sweeps, e.g. "workload.batch_size=1,2 pol=none,goodput"
ALPHA=${ALPHA:-}   # set: timing mode (backend.acceptance=simulated, acceptance=iid at this alpha)
PROFILE=${PROFILE:-experiments/fidelity/profile.csv}
REPS=${REPS:-0,1,2}
if [ -n "$ALPHA" ]; then
  NAME=${NAME:-fidelity_timing_a$ALPHA}
  REAL=(experiment=fidelity_timing "acceptance.alpha=$ALPHA")
  SIM=(experiment=fidelity_timing_sim "acceptance.alpha=$ALPHA")
  CLOCK=${CLOCK:-outputs/fidelity_profiles/$NAME/clock_profile.csv}
else
  NAME=${NAME:-real_pareto}
  REAL=(experiment=real_pareto)
  SIM=(experiment=fidelity_sim "fid.traces=outputs/fidelity_traces/$NAME")
  CLOCK=${CLOCK:-experiments/fidelity/clock_profile.csv}
fi
# the profile grid (PGRID: space-separated overrides, e.g. a smaller grid for a trial)
PGRID=${PGRID:-"grid.batch=[1,2,4,8,16,32] grid.query=[1,2,3,4,5,7,9,17,64] grid.context=[0,128,256] repeats=5 warmup=2"}
PROFILE_ARGS=(model=tiny_pair $MODEL num_threads=1 $PGRID)
# the clock profile's passes (not the policies' table): in timing mode each draft point is timed as the executor
# runs it, after a target forward, plus the draft_next rows (specdepth-profile interleave=true, issue 15), and
# the fixed-cost fit also reads the verify phase's host work (calibrate.py --phases)
if [ -n "$ALPHA" ]; then INTERLEAVE=${INTERLEAVE:-true}; PHASES=${PHASES:-draft,overhead,verify}
else INTERLEAVE=${INTERLEAVE:-false}; PHASES=${PHASES:-draft,overhead}; fi
CLOCK_ARGS=("${PROFILE_ARGS[@]}" interleave=$INTERLEAVE)
# the table the policies see (cost.path), in the real runs and in the simulation alike
if [ ! -f "$PROFILE" ]; then
  .venv/bin/specdepth-profile "${PROFILE_ARGS[@]}" rounds=3 output="$PWD/$PROFILE"
fi
# the machine's speed drifts by ~10 % over minutes (shared memory bandwidth): one pass of the grid before each
# repetition and one after the last; their median is what the machine did during the real runs, and is what
# the simulated clock charges (backend.clock_profile). Skipped when CLOCK exists (and the real runs too).
PDIR=outputs/fidelity_profiles/$NAME
if [ ! -f "$CLOCK" ]; then
  mkdir -p "$PDIR"
  for r in ${REPS//,/ }; do
    .venv/bin/specdepth-profile "${CLOCK_ARGS[@]}" output="$PWD/$PDIR/before_r$r.csv"
    .venv/bin/specdepth "${REAL[@]}" $MODEL cost.path="$PROFILE" name="$NAME" rep="$r" $EXTRA
  done
  .venv/bin/specdepth-profile "${CLOCK_ARGS[@]}" output="$PWD/$PDIR/after.csv"
  $PY experiments/fidelity/merge_profiles.py "$CLOCK" "$PDIR"/before_r*.csv "$PDIR/after.csv"
fi
if [ -z "$ALPHA" ]; then
  $PY experiments/fidelity/prepare.py "outputs/multirun/$NAME" "outputs/fidelity_traces/$NAME"
fi
.venv/bin/specdepth "${SIM[@]}" $MODEL cost.path="$PROFILE" rep="$REPS" fid.clock_profile="$CLOCK" \
  name="${NAME}_sim_table" $EXTRA
# fixed costs around the forwards, fitted on repetition 0 only (the other repetitions are the out-of-sample check)
OH=$($PY experiments/fidelity/calibrate.py "outputs/multirun/$NAME" "outputs/multirun/${NAME}_sim_table" \
  --fit-rep "${FIT_REP:-0}" --phases "$PHASES" | tail -1)
.venv/bin/specdepth "${SIM[@]}" $MODEL cost.path="$PROFILE" rep="$REPS" fid.clock_profile="$CLOCK" \
  name="${NAME}_sim_overhead" $OH $EXTRA
if [ -n "$ALPHA" ]; then   # timing mode: tables and figures in their own folder; the study READMEs untouched
  FA=(--out "${OUT:-experiments/fidelity/timing}/a$ALPHA")
elif [ -n "${OUT:-}" ]; then   # a trial: figures and tables elsewhere, READMEs untouched
  FA=(--out "$OUT/fidelity"); RA=(--out "$OUT/real_pareto")
else
  FA=(--readme experiments/fidelity/README.md)
  RA=(--table experiments/real_pareto/variants.csv --variant default)
fi
$PY experiments/fidelity/analyze.py "outputs/multirun/$NAME" "outputs/multirun/${NAME}_sim_table" \
  "outputs/multirun/${NAME}_sim_overhead" "${FA[@]}"
if [ -z "$ALPHA" ]; then
  $PY experiments/real_pareto/analyze.py "outputs/multirun/$NAME" "${RA[@]}"
fi
