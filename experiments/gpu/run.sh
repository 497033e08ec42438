#!/usr/bin/env bash
# The real-hardware check in one command (experiments/gpu/README.md): on a CUDA machine with no network,
#   bash experiments/gpu/run.sh OUT_DIR            # < 8 minutes; OUT_DIR/summary.md, CSVs, PNGs, runs/
#   bash experiments/gpu/run.sh OUT_DIR --smoke    # the same code on CPU with tiny shapes, < 1 minute
#   PYTHON=python3 bash experiments/gpu/run.sh OUT_DIR --parts roofline,crossover
# Uses $PYTHON (default: the repository's .venv/bin/python if present, else python3). specdepth must be
# importable by it: this script tries an offline `pip install --no-deps --no-build-isolation -e .` when it is
# not; hydra-core, omegaconf, numba, torch, transformers and matplotlib must be installed (nothing is fetched).
set -uo pipefail
if [ $# -lt 1 ]; then
  echo "usage: bash experiments/gpu/run.sh OUT_DIR [--smoke] [--parts a,b] [--budget SECONDS]" >&2
  exit 2
fi
cd "$(dirname "$0")/../.."
OUT=$1; shift
mkdir -p "$OUT"
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export HYDRA_FULL_ERROR=1
case " $* " in *" --smoke "*) export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} ;; esac
# one line at start: the wheels this machine lacks (experiments/gpu/README.md, "Carrying wheels"), or "carry: nothing"
carry=$("$PYTHON" src/specdepth/versions.py --carry 2>&1) || { echo "run.sh: $carry" >&2; exit 2; }
echo "run.sh: $carry" | tee -a "$OUT/console.txt"
if [ "$carry" != "carry: nothing" ]; then
  echo "run.sh: install those first (pip install --no-index --no-deps --target ...); nothing is downloaded here" >&2
  exit 2
fi
if ! "$PYTHON" -c "import specdepth.conf, specdepth.policies" 2>/dev/null; then
  echo "run.sh: specdepth is not importable by $PYTHON: installing this checkout (offline, no dependencies)" >&2
  "$PYTHON" -m pip install -q --no-deps --no-build-isolation -e . || { echo "run.sh: install failed" >&2; exit 2; }
fi
# the driver stops itself before its budget (450 s, smoke 55 s); this is the hard stop behind it
LIMIT=475
case " $* " in *" --smoke "*) LIMIT=100 ;; esac
timeout -k 5 "$LIMIT" "$PYTHON" experiments/gpu/gpu_check.py "$OUT" "$@" 2>&1 | tee -a "$OUT/console.txt"
exit "${PIPESTATUS[0]}"
