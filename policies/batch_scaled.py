import numpy as np

from specdepth.errors import as_bool, as_int

from ._common import CostAwarePolicy, fit_token_cap


class BatchScaled(CostAwarePolicy):
    """One depth for the whole batch from the token budget and the batch: at most
    max(1, floor((budget - batch) / batch)) (deep when compute is idle, shallow when busy) and at most
    `max_depth`; within that, the depth that maximises the batch's expected
    tokens per second at the batch's acceptance level (the running requests' accepted drafts per verified
    draft token, shrunk toward all requests' rate: `_common.CostAwareDepth`), priced with the
    view's cost model corrected online by the measured step costs (`_common.CostCalibration`). So it never
    drafts a position whose expected gain is below its cost, on any hardware (the budget alone drafted 16
    deep at batch 1). `use_budget=false` drops the budget cap (the cost rule alone). `drain` (default on): once
    no request is left to join (view.requests_left == 0), the depth that finishes the batch soonest (its
    slowest row decides; `_common.uniform_depth`)."""

    name = "batch_scaled"
    depth_param = "max_depth"

    def __init__(self, max_depth: int = 8, min_depth: int = 0, use_budget: bool = True, drain: bool = True):
        self.max_depth = as_int(max_depth, "policy.max_depth", min=0)
        self.min_depth = as_int(min_depth, "policy.min_depth", min=0, max=self.max_depth)
        self.use_budget = bool(use_budget)
        self.drain = as_bool(drain, "policy.drain")
        self.reset()

    def plan(self, view):
        n = view.batch_size
        k = min(self.max_depth, view.max_depth)
        if self.use_budget:   # the budget caps the depth, but never below 1: the cost rule decides on 1
            k = min(k, max(1, view.verify_tokens_free // n))
        k = self._depth.depth(view, k)
        return fit_token_cap(np.full(n, max(self.min_depth, k), dtype=np.int64), view)
