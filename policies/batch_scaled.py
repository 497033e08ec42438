import numpy as np

from specdepth.errors import as_int

from .kit import CostAwarePolicy


class BatchScaled(CostAwarePolicy):
    """One depth for the whole batch, deep when compute is idle and shallow when busy: the depth (at most
    `max_depth`) that maximises the batch's expected tokens per second at the batch's acceptance level (the
    running requests' accepted drafts per verified draft token, shrunk toward all requests' rate:
    `_common.CostAwareDepth`), priced with the view's cost model corrected online by the measured step
    costs (`_common.CostCalibration`). The batch and the compute budget set the depth through the price of
    the step's verify: free up to the cost model's ridge (the token budget's source), dearer past it. So it
    never drafts a position whose expected gain is below its cost, on any hardware (the budget alone drafted
    16 deep at batch 1).
    `use_budget=true` also caps the depth at max(1, floor((token_budget - batch) / batch)), the seed's rule.
    Off by default: the budget (the 5 %-tolerance ridge) is where verify tokens stop being free, not where
    drafting stops paying, and the cap lost up to 20 % to fixed depth 3 past it (experiments/robustness).
    `drain` (default on): once no request is left to join (view.requests_left == 0), the depth that finishes
    the batch soonest (its slowest row decides; `_common.uniform_depth`). `probe` (standard errors, 0 = off):
    where the level says no draft pays but a level that many standard errors higher says one would, draft
    one token per row to learn the level (`_common.CostAwareDepth`). `positions` (default on): the level is
    corrected per draft position (`_common.PositionFactors`: later drafts that fail more often than the first).
    `idle_replan` (steps, 0 = off): a depth of 0 is kept without replanning for the next 1, 2, 4, ... (at most
    idle_replan) steps while the batch holds the same requests (`_common.IdleReplan`). `policy_time` (default
    on): where a step pays the policy's own time (backend=hf), a depth > 0 also pays what a drafting step's plan
    costs more than an idle step's (`_common.PolicyTime`). `catch_up` (default on): rows whose draft lags
    (view.draft_lag: they did not draft for a while) draft only if the depth's gain pays for the draft's catch-up,
    else they are held at 0 (`_common.CostAwareDepth`). `predictive` (default off): price a depth by the level's
    posterior predictive (`_common._expected_tokens`: a Beta belief worth the level's trials), which drafts deeper
    on thin evidence; tried on the development draws and not better (experiments/robustness/README.md).
    `position_prior` (20) / `position_optimism` (2): the per-position factors' pseudo-tokens toward 1 and the
    standard errors a factor below 1 is raised by (`_common.PositionFactors`, as goodput's; lower values were a few
    hundredths of a percent better on the development draws, not adopted).
    No row drafts past its request's end (`_common.draft_caps`: at most its remaining tokens - 1, `min_depth`
    included), and while requests may still join the depth is priced with those caps (not while draining:
    `_common.CostAwareDepth._best_depth`; until 2026-12-03 a request's last step drafted the whole depth, for
    nothing: c109 of robustness draw 2057, one request of 34 tokens, went 0.970 -> 0.988 of the best baseline in
    the mean of 8 draws, experiments/robustness/README.md).
    `drain_makespan` (default on since 2026-12-03): draining, the depth is priced by the expected last of the rows
    to finish (`_common.uniform_depth`'s `spread`: each row's steps about normal), not the slowest row's mean
    steps, since drafting spreads when the rows finish. Better on balance on robustness draws 2061-2063 and on
    experiments/robustness/warm_start.py, with a few cells lost; held-out draw 2065 is the first run with it on
    (experiments/robustness/README.md, batch_scaled)."""

    name = "batch_scaled"
    depth_param = "max_depth"

    def __init__(self, max_depth: int = 8, min_depth: int = 0, use_budget: bool = False, drain: bool = True,
                 probe: float = 2.0, positions: bool = True, idle_replan: int = 64, policy_time: bool = True,
                 catch_up: bool = True, predictive: bool = False, position_prior: float = 20.0,
                 position_optimism: float = 2.0, drain_makespan: bool = True):
        super().__init__(max_depth, use_budget, drain, probe, positions, idle_replan, policy_time, catch_up,
                         predictive, position_prior, position_optimism, drain_makespan)
        self.min_depth = as_int(min_depth, "policy.min_depth", min=0, max=self.max_depth)

    def plan(self, view):
        n = view.batch_size
        k = self.cap(view)
        if self.use_budget:   # the budget caps the depth, but never below 1: the cost rule decides on 1
            k = min(k, max(1, view.verify_tokens_free // n))
        k = self._depth.depth(view, k)
        depths = self._depth.hold(np.full(n, max(self.min_depth, k), dtype=np.int64), self.min_depth)
        return self.finish(depths, view)
