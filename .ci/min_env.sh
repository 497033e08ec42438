#!/usr/bin/env bash
# A second environment for the hf tests on another transformers (CI: the minimum pyproject declares):
#   .ci/min_env.sh BASE_VENV NEW_VENV VERSION [MORE_REQUIREMENTS...]     (e.g. torch==2.6.0)
# NEW_VENV sees every package of BASE_VENV (its torch, this checkout) through a .pth file, and holds of its
# own only transformers==VERSION and what that version needs that BASE_VENV lacks (huggingface-hub,
# tokenizers, and the `kernels` release it was built against when BASE_VENV has kernels: transformers uses
# kernels whenever it is importable). pip runs from BASE_VENV against NEW_VENV; nothing in BASE_VENV changes.
set -euo pipefail
base=$1 new=$2 version=$3; shift 3
purelib() { "$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
pipnew() { "$base/bin/python" -m pip --python "$new/bin/python" install -q "$@" 2> >(grep -v "is ignored: it is neither" >&2); }
rm -rf "$new"
"$base/bin/python" -m venv --without-pip "$new"
echo "import site; site.addsitedir('$(purelib "$base")')" > "$(purelib "$new")/_base_venv.pth"
pipnew "transformers==$version" "$@"
kernels=$("$new/bin/python" -c '
import importlib.metadata as m, importlib.util as u
reqs = [r.split(";")[0].replace(" ", "") for r in m.requires("transformers") or [] if r.startswith("kernels")]
print(reqs[0] if reqs and u.find_spec("kernels") else "")')
[ -z "$kernels" ] || pipnew "$kernels"
# console scripts (tests/test_hf_app.py runs them next to the interpreter), bound to NEW_VENV's python
for s in "$base"/bin/specdepth*; do
  sed "1s|.*|#!$(cd "$new" && pwd)/bin/python|" "$s" > "$new/bin/${s##*/}"
  chmod +x "$new/bin/${s##*/}"
done
"$new/bin/python" -c 'import transformers, torch; print(f"{transformers.__version__=}, {torch.__version__=}")'
