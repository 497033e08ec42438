"""The oldest torch and transformers the real backend runs on: the one place that states them (pyproject's `hf`
extra repeats them, and a test keeps the two equal; CI runs the hf tests on the minimum transformers as well as on
the installed one, `make test-min`). Below them `backend=hf` and specdepth-profile refuse to start, in one line.

    python src/specdepth/versions.py --carry   # one line: what a machine without network must be given first

Standard library only, no package imports at load: it runs before anything it checks is installed.
"""
from __future__ import annotations

import argparse
import importlib.metadata as md
import re
import shlex
import sys
from pathlib import Path

MINIMUM = {"torch": "2.4.0", "transformers": "5.0.0"}

#: what experiments/gpu/run.sh imports, beside the core dependencies: the `hf` extra without datasets, and the
#: `report` extra's matplotlib
GPU_CHECK_EXTRAS = ("torch", "transformers", "safetensors", "matplotlib")


def _key(version: str) -> tuple:
    """The release numbers of a version string: '2.13.0+cpu' -> (2, 13, 0), '5.0' -> (5, 0)."""
    m = re.match(r"\d+(?:\.\d+)*", version.strip())
    return tuple(int(p) for p in m.group(0).split(".")) if m else ()


def below(installed: str, minimum: str) -> bool:
    """True when `installed` is an older release than `minimum` (missing trailing numbers count as 0)."""
    a, b = _key(installed), _key(minimum)
    n = max(len(a), len(b))
    return a + (0,) * (n - len(a)) < b + (0,) * (n - len(b))


def installed(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def require_hf(what: str = "backend=hf") -> None:
    """Raise a one-line BackendError when torch or transformers is missing or older than MINIMUM."""
    from .errors import BackendError
    missing = [n for n in MINIMUM if installed(n) is None]
    if missing:
        raise BackendError(f"{what} needs {' and '.join(missing)}: pip install 'specdepth[hf]'")
    for name, least in MINIMUM.items():
        have = installed(name)
        if below(have, least):
            raise BackendError(f"{what} needs {name}>={least} (installed {have}): pip install '{name}>={least}'")


# ---- what to carry to a machine without network (experiments/gpu/README.md) ----------------------------------
def _requirement_class():
    try:
        from packaging.requirements import Requirement
    except ImportError:   # pip vendors packaging; a machine with neither has nothing to install with anyway
        from pip._vendor.packaging.requirements import Requirement
    return Requirement


def _declared(Requirement) -> tuple[list, list]:
    """specdepth's requirements (core, extras): from the checkout's pyproject.toml when this file is in one,
    else from the installed metadata."""
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    if pyproject.is_file() and sys.version_info >= (3, 11):
        import tomllib
        project = tomllib.loads(pyproject.read_text())["project"]
        extras = [r for rs in project["optional-dependencies"].values() for r in rs]
        return [Requirement(r) for r in project["dependencies"]], [Requirement(r) for r in extras]
    reqs = [Requirement(r) for r in md.requires("specdepth") or []]
    return [r for r in reqs if r.marker is None], [r for r in reqs if r.marker is not None]


def _roots(Requirement) -> list:
    """The requirements the GPU check needs: specdepth's own without extras, plus GPU_CHECK_EXTRAS."""
    core, extras = _declared(Requirement)
    out = core + [r for r in extras if r.name in GPU_CHECK_EXTRAS]
    for r in out:
        r.marker = None
    return out


def carry() -> list[str]:
    """The requirement specifiers this interpreter does not satisfy for the GPU check: missing or out-of-range
    distributions among specdepth's requirements and, recursively, those of the installed distributions they
    lead to. Empty when everything is there."""
    Requirement = _requirement_class()
    need: dict[str, object] = {}
    seen: set[str] = set()
    stack = _roots(Requirement)
    while stack:
        r = stack.pop()
        name = re.sub(r"[-_.]+", "-", r.name).lower()
        have = installed(name)
        ok = have is not None and r.specifier.contains(have, prereleases=True) \
            and not (name in MINIMUM and below(have, MINIMUM[name]))
        if not ok:
            r.marker = None
            need.setdefault(name, Requirement(f"{name}>={MINIMUM[name]}") if name in MINIMUM else r)
            continue
        if name in seen:
            continue
        seen.add(name)
        for line in md.requires(name) or []:
            dep = Requirement(line)
            if dep.marker is None or dep.marker.evaluate({"extra": ""}):
                stack.append(dep)
    return [str(need[n]) for n in sorted(need)]


def carry_line() -> str:
    specs = carry()
    return "carry: " + (" ".join(shlex.quote(s) for s in specs) if specs else "nothing")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specdepth.versions", description=__doc__.split("\n\n")[0])
    ap.add_argument("--carry", action="store_true", help="print what the GPU check lacks here, in one line")
    ap.add_argument("--min", metavar="NAME", choices=sorted(MINIMUM), help="print the minimum version of NAME")
    args = ap.parse_args(argv)
    if args.min:
        print(MINIMUM[args.min])
    elif args.carry:
        print(carry_line())
    else:
        print(" ".join(f"{n}>={v}" for n, v in MINIMUM.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
