import numpy as np

from specdepth.errors import as_int
from specdepth.policy import Policy

from .kit import fit_token_cap


class DisableByBatch(Policy):
    """vLLM V0 `speculative_disable_by_batch_size`: every sequence drafts `depth` tokens while the running
    batch is below `threshold` sequences; at `threshold` or more, speculation is off (depth 0)."""

    name = "disable_by_batch"
    depth_param = "depth"

    def __init__(self, depth: int = 4, threshold: int = 32):
        self.depth = as_int(depth, "policy.depth", min=0)
        self.threshold = as_int(threshold, "policy.threshold", min=1)

    def plan(self, view):
        k = min(self.depth, view.max_depth) if view.batch_size < self.threshold else 0
        return fit_token_cap(np.full(view.batch_size, k, dtype=np.int64), view)
