"""Deprecated: the helpers moved to the public policy kit, `specdepth.policies.kit`. This alias re-exports them for
one release and warns on import; `PerRequest` keeps its old form here (a column count, indexed by number)."""
import warnings

import numpy as np

from . import kit
from .kit import *  # noqa: F401,F403
from .kit import __all__  # noqa: F401

warnings.warn("specdepth.policies._common is deprecated: import from specdepth.policies.kit (PerRequest there has "
              "named fields: PerRequest(accepted=0.0, ...), rows.accepted)", DeprecationWarning, stacklevel=2)

_expected_tokens = kit.expected_tokens


class PerRequest:
    """The old form: `n` float columns starting at `init`, `align(ids)` -> [batch, n] (kit.PerRequest's array)."""

    def __init__(self, n: int, init=0.0):
        start = np.broadcast_to(np.asarray(init, dtype=float), (n,))
        self._rows = kit.PerRequest(**{f"col{i}": float(v) for i, v in enumerate(start)})

    def reset(self) -> None:
        self._rows.reset()

    def align(self, ids: np.ndarray) -> np.ndarray:
        return self._rows.align(ids).array
