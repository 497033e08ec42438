"""Shared helpers for the tests: compose the real Hydra configs and run them in-process."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from specdepth.app import CONF_DIR, build, run

ROOT = Path(__file__).resolve().parents[1]
CLI = str(Path(sys.executable).with_name("specdepth"))


def cfg(*overrides, hydra_cfg: bool = False):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=hydra_cfg)


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
