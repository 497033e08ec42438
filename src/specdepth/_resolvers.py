"""OmegaConf resolvers used by the configs (registered on `import specdepth`)."""
from __future__ import annotations

import os
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


def register() -> None:
    if not OmegaConf.has_resolver("sd.uid"):
        OmegaConf.register_new_resolver("sd.uid", _uid, use_cache=True)
    if not OmegaConf.has_resolver("sd.asset"):
        OmegaConf.register_new_resolver("sd.asset", _asset)


register()
