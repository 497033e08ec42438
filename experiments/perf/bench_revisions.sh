#!/usr/bin/env bash
# The simulator benchmark (sim_throughput.py) of an older revision and of this working tree, side by side in
# one run, alternating (old, new, old, new) so that a slow spell of the machine hits both:
#   bash experiments/perf/bench_revisions.sh REV [ROUNDS] [REPEATS]   # e.g. REV=559880b (before the engine refactor)
# REPEATS: runs per case, best of which is reported (default 3; the closed-batch case runs ~6 ms, so its best
# of 3 moves by +-5 % from round to round on this machine: use 15 or more to compare revisions).
# The old revision is checked out into a temporary git worktree with its own small venv that reuses this
# project's installed packages (.venv) and installs only the old checkout itself (no network needed).
# Prints each round's table for both; compare the same row across them (tokens per CPU-second, best of REPEATS).
set -euo pipefail
cd "$(dirname "$0")/../.."
REV=${1:?usage: bench_revisions.sh REV [ROUNDS] [REPEATS]}
ROUNDS=${2:-2}
REPEATS=${3:-3}
PY=.venv/bin/python
[[ -x $PY ]] || { echo "run 'make setup' first" >&2; exit 2; }
TMP=$(mktemp -d)
trap 'git worktree remove --force "$TMP/old" >/dev/null 2>&1 || true; rm -rf "$TMP"' EXIT
git worktree add -q --detach "$TMP/old" "$REV"
python3 -m venv "$TMP/old/.venv"
SITE=$($PY -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
OLDSITE=$("$TMP/old/.venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$SITE" > "$OLDSITE/specdepth_deps.pth"      # the packages, not this checkout's editable install
"$TMP/old/.venv/bin/python" -m pip install -q --no-deps -e "$TMP/old" >/dev/null
export OMP_NUM_THREADS=1
for r in $(seq "$ROUNDS"); do
  echo "## round $r: $REV"
  (cd "$TMP/old" && .venv/bin/python experiments/perf/sim_throughput.py --repeats "$REPEATS")
  echo "## round $r: working tree ($(git rev-parse --short HEAD)$(git diff --quiet || echo +changes))"
  $PY experiments/perf/sim_throughput.py --repeats "$REPEATS"
done
