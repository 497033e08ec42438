from specdepth.errors import as_int

from .kit import CostAwarePolicy


class BatchScaled(CostAwarePolicy):
    """One depth for the whole batch, deep when compute is idle and shallow when busy.

    Rule: each step, the depth in [min_depth, max_depth] with the most expected tokens per second at the batch's
    acceptance level (`kit.CostAwareDepth`), so no position is drafted whose expected gain is below its cost.
    Budget: the cost model, corrected online by the measured step costs, prices the verify: free up to the cost
    model's ridge (the token budget's source), dearer past it. `use_budget=true` also caps the depth at
    max(1, (token_budget - batch) // batch), the seed's rule.
    Parameters: `max_depth`, `min_depth`, `use_budget`; `drain` (once no request is left to join, the depth that
    finishes the batch soonest); `idle_replan`, `policy_time`, `catch_up` (the kit's idle, policy-time and
    catch-up blocks); the `level` node: `probe`, `positions`, `position_prior`, `position_optimism`.
    No row drafts past its request's end (`kit.draft_caps`)."""

    name = "batch_scaled"
    depth_param = "max_depth"

    def __init__(self, max_depth: int = 8, min_depth: int = 0, use_budget: bool = False, drain: bool = True,
                 idle_replan: int = 64, policy_time: bool = True, catch_up: bool = True, level=None):
        super().__init__(max_depth, use_budget, drain, idle_replan, policy_time, catch_up, level)
        self.min_depth = as_int(min_depth, "policy.min_depth", min=0, max=self.max_depth)

    def plan(self, view):
        n = view.batch_size
        k = self.cap(view)
        if self.use_budget:   # the budget caps the depth, but never below 1: the cost rule decides on 1
            k = min(k, max(1, view.verify_tokens_free // n))
        k = self._depth.depth(view, k)
        return self.uniform(view, max(self.min_depth, k), self.min_depth)
