import numpy as np

from specdepth.errors import as_int
from specdepth.policy import Policy


class BatchScaled(Policy):
    """One depth for the whole batch from the token budget: floor((budget - batch) / batch), capped by
    `max_depth`. Deep when compute is idle, shallow when busy, none once the batch fills the budget."""

    name = "batch_scaled"
    depth_param = "max_depth"

    def __init__(self, max_depth: int = 8, min_depth: int = 0):
        self.max_depth = as_int(max_depth, "policy.max_depth", min=0)
        self.min_depth = as_int(min_depth, "policy.min_depth", min=0, max=self.max_depth)

    def plan(self, view):
        n = view.batch_size
        k = max(self.min_depth, min(self.max_depth, view.max_depth, view.verify_tokens_free // n))
        return np.full(n, k, dtype=np.int64)
