import numpy as np

from specdepth.errors import as_int
from specdepth.policy import Policy


class FixedDepth(Policy):
    """Every sequence drafts `depth` tokens every step, whatever the batch (vLLM's default).
    `depth=0` is no speculation. Ignores the token budget and pays for it in step time."""

    name = "fixed"
    depth_param = "depth"

    def __init__(self, depth: int = 4):
        self.depth = as_int(depth, "policy.depth", min=0)
        self.reset()

    def reset(self):
        self._key, self._plan = None, None

    def plan(self, view):
        key = (view.batch_size, view.max_depth)
        if key != self._key:   # the same (read-only) answer while the batch size holds
            self._plan = np.full(view.batch_size, min(self.depth, view.max_depth), dtype=np.int64)
            self._plan.flags.writeable = False
            self._key = key
        return self._plan

    @property
    def label(self):
        return "none" if self.depth == 0 else f"fixed({self.depth})"
