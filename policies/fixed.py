import numpy as np

from specdepth.errors import as_int
from specdepth.policy import Policy


class FixedDepth(Policy):
    """Every sequence drafts `depth` tokens every step, whatever the batch (vLLM's default).
    `depth=0` is no speculation. Ignores the token budget and pays for it in step time."""

    name = "fixed"

    def __init__(self, depth: int = 4):
        self.depth = as_int(depth, "policy.depth", min=0)

    def plan(self, view):
        return np.full(view.batch_size, min(self.depth, view.max_depth), dtype=np.int64)

    @property
    def label(self):
        return "none" if self.depth == 0 else f"fixed({self.depth})"
