#!/usr/bin/env bash
# Download the wheels a machine without network lacks for the GPU check (experiments/gpu/README.md, "Carrying
# wheels"), on a machine with network, into the git-ignored .whl/ folder:
#   bash experiments/gpu/fetch_wheels.sh [--have FREEZE.txt] SPEC...
# SPEC...: the words of the `carry:` line that `python src/specdepth/versions.py --carry` printed on the GPU
# machine. --have: that machine's `python -m pip list --format=freeze`; the download then resolves against the
# versions it has and keeps only the wheels it lacks. PYVER (3.12) and PLATFORM (manylinux_2_28_x86_64) name
# the GPU machine's Python and platform.
set -euo pipefail
cd "$(dirname "$0")/../.."
have=
if [ "${1:-}" = --have ]; then have=$2; shift 2; fi
if [ $# -eq 0 ] || [ "$1" = nothing ]; then echo "fetch_wheels: nothing to carry"; exit 0; fi
PYVER=${PYVER:-3.12} PLATFORM=${PLATFORM:-manylinux_2_28_x86_64}
mkdir -p .whl
# omegaconf's antlr4-python3-runtime 4.9 is published as an sdist only: build its pure-Python wheel here
case " $* " in *hydra-core*|*omegaconf*) python3 -m pip wheel -q --no-deps -w .whl 'antlr4-python3-runtime==4.9.*' ;; esac
args=(--only-binary=:all: --python-version "$PYVER" --platform "$PLATFORM" --platform manylinux2014_x86_64
      --find-links .whl -d .whl)
if [ -n "$have" ]; then
  pins=$(mktemp); trap 'rm -f "$pins"' EXIT
  grep -E '^[A-Za-z0-9_.-]+==[^ ]+$' "$have" | sed 's/+[^ ]*$//' > "$pins"    # name==version (no local tags)
  args+=(-c "$pins")
fi
python3 -m pip download -q "${args[@]}" "$@"
if [ -n "$have" ]; then   # drop what the machine already has
  python3 - "$pins" <<'PY'
import re, sys
from pathlib import Path
norm = lambda s: re.sub(r"[-_.]+", "_", s).lower()
have = {norm(n) + "-" + v for n, v in (l.strip().split("==", 1) for l in open(sys.argv[1]) if "==" in l)}
for w in Path(".whl").glob("*.whl"):
    name, version = w.name.split("-")[:2]
    if norm(name) + "-" + version in have:
        w.unlink()
PY
fi
echo "fetch_wheels: $(ls .whl | wc -l) wheels in .whl/:"; ls .whl
