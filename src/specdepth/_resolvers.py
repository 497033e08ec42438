"""OmegaConf resolvers used by the configs (registered on `import specdepth`, so in every process that
unpickles the app's task function too: submitit workers on SLURM or locally)."""
from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import time
from pathlib import Path

from omegaconf import OmegaConf

ASSETS = Path(__file__).resolve().parent / "assets"


def _uid() -> str:
    """Unique per process and call: keeps two runs started in the same second out of each other's dir."""
    return f"{time.strftime('%H-%M-%S')}_{os.getpid()}_{secrets.token_hex(2)}"


def _asset(rel: str) -> str:
    return str(ASSETS / rel)


# Keys that do not change a run's results: left out of its identity (run dir hash and the resume check),
# so that `resume=false`, `logger=wandb` or another sweep name still find the same finished run.
VOLATILE = ("resume", "name", "logger", "engine.progress")
# Keys added after runs were recorded, with the value that reproduces the old behaviour: left out of the
# identity while they hold it, so runs recorded before the key existed keep their hash (and resume).
DEFAULTED = {"backend.acceptance": "model", "model.init": "pretrained", "model.tokenizer": None}


def run_identity(config: dict) -> dict:
    """The part of a resolved task config (a plain dict, no `hydra` node) that determines the results."""
    ident = json.loads(json.dumps(config, default=str))  # a deep copy with plain types
    ident.pop("hydra", None)
    for key in (*VOLATILE, *DEFAULTED):
        *parents, leaf = key.split(".")
        node = ident
        for p in parents:
            node = node.get(p) if isinstance(node, dict) else None
        if isinstance(node, dict) and (key not in DEFAULTED or node.get(leaf, DEFAULTED[key]) == DEFAULTED[key]):
            node.pop(leaf, None)
    return ident


def config_hash(config: dict, n: int = 10) -> str:
    """Short, stable hash of run_identity(config)."""
    text = json.dumps(run_identity(config), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:n]


def _safe_label(label: str, limit: int = 80) -> str:
    label = re.sub(r"[^A-Za-z0-9._=,+-]+", "_", str(label or "")).strip("._")
    return label[:limit].rstrip("._,") or "run"


def _run_id(label: str = "", *, _root_) -> str:
    """`${sd.run_id:${hydra.job.override_dirname}}`: a sweep job's run dir name, `<overrides>-<config hash>`.

    The readable part comes from the job's overrides; the hash from the job's whole resolved config, so
    different configs never share a dir and a rerun of the same config lands in the same dir (resume)."""
    task = {}
    for key in _root_:
        if key == "hydra":
            continue
        node = _root_[key]
        task[key] = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
    return f"{_safe_label(label)}-{config_hash(task)}"


def register() -> None:
    if not OmegaConf.has_resolver("sd.uid"):
        OmegaConf.register_new_resolver("sd.uid", _uid, use_cache=True)
    if not OmegaConf.has_resolver("sd.asset"):
        OmegaConf.register_new_resolver("sd.asset", _asset)
    if not OmegaConf.has_resolver("sd.run_id"):
        OmegaConf.register_new_resolver("sd.run_id", _run_id, use_cache=False)


register()
