"""The minimum torch/transformers: one place (specdepth.versions), the same numbers in pyproject.toml, a one-line
refusal below them for backend=hf and specdepth-profile, and the GPU check's carry line."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from specdepth import versions

ROOT = Path(__file__).resolve().parents[1]


def test_pyproject_states_the_minimums():
    hf = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["hf"]
    stated = dict(re.fullmatch(r"([a-z]+)>=([\d.]+)", r).groups() for r in hf if re.fullmatch(r"[a-z]+>=[\d.]+", r))
    assert {n: stated.get(n) for n in versions.MINIMUM} == versions.MINIMUM


@pytest.mark.parametrize("have, least, older", [("2.13.0+cpu", "2.6", False), ("2.5.1+cu124", "2.6", True),
                                                ("5.0", "5.0.0", False), ("4.57.6", "5.0.0", True),
                                                ("5.10.4", "5.9", False), ("2.6.0rc1", "2.6", False)])
def test_below(have, least, older):
    assert versions.below(have, least) is older


def _cli_below_minimum(name, entry, args, tmp_path):
    """The real console entry point in a fresh interpreter whose MINIMUM[name] is above what is installed."""
    code = (f"import sys; from specdepth import versions; versions.MINIMUM[{name!r}] = '999'; "
            f"from {entry} import main; sys.argv = ['x'] + {args!r}; main()")
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=300)


@pytest.mark.parametrize("name", sorted(versions.MINIMUM))
def test_hf_run_below_the_minimum_is_one_line(name, tiny_pair, tmp_path):
    pytest.importorskip("transformers")
    from conftest import hf_overrides
    out = tmp_path / "run"
    r = _cli_below_minimum(name, "specdepth.app", hf_overrides(tiny_pair, f"hydra.run.dir={out}"), tmp_path)
    assert r.returncode == 2, r.stderr[-2000:]
    have = versions.installed(name)
    line = f"backend=hf needs {name}>=999 (installed {have}): pip install '{name}>=999'"
    assert r.stderr.strip().endswith(line) and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (out / "summary.json").exists()


def test_profile_below_the_minimum_is_one_line(tiny_pair, tmp_path):
    out = tmp_path / "prof"
    r = _cli_below_minimum("transformers", "specdepth.profile",
                           [f"model.target={tiny_pair['target']}", f"model.draft={tiny_pair['draft']}",
                            "model.target_arch=null", "model.draft_arch=null", "model.prompts=null",
                            "model.device=cpu", f"hydra.run.dir={out}"], tmp_path)
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.strip() == (f"specdepth-profile: error: specdepth-profile needs transformers>=999 (installed "
                                f"{versions.installed('transformers')}): pip install 'transformers>=999'")
    assert not (out / "profile.csv").exists()


def test_carry_names_what_is_missing_or_too_old(monkeypatch):
    pytest.importorskip("transformers")
    assert versions.carry_line() == "carry: nothing"    # this environment has all the GPU check needs
    monkeypatch.setitem(versions.MINIMUM, "transformers", "999")
    assert versions.carry_line() == "carry: 'transformers>=999'"
