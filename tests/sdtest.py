"""Shared helpers for the tests: compose the real Hydra configs and run them in-process."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import compose as cfg  # noqa: F401  (the suite's one compose helper)
from specdepth.app import build, run

ROOT = Path(__file__).resolve().parents[1]
CLI = str(Path(sys.executable).with_name("specdepth"))


def run_sim(tmp_path, *overrides) -> dict:
    return run(cfg(*overrides), tmp_path)


def engine(*overrides):
    return build(cfg(*overrides))["engine"]


def cli(*args, cwd, env_extra=None, timeout=120):
    env = dict(os.environ, HYDRA_FULL_ERROR="0")
    env.update(env_extra or {})
    return subprocess.run([CLI, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


RESULT_FILES = ("summary.json", "steps.csv", "requests.csv", "config.yaml")


def result_files(root) -> list[str]:
    return sorted(str(p) for name in RESULT_FILES for p in Path(root).rglob(name))
