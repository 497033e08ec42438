import numpy as np

from specdepth.errors import as_bool, as_float, as_int

from .kit import ConfidenceCalibration, CostAwarePolicy, as_padded, keep_by_margin


class ConfidenceThreshold(CostAwarePolicy):
    """Per sequence: keep drafting while the acceptance the draft's confidence stands for >= `threshold`, up to
    a depth cap. `calibrate` (default on): that acceptance is learnt online from the verified drafts (Platt
    scaling, `_common.ConfidenceCalibration`): a raw threshold means a different acceptance for each draft (at
    0.3 it stopped an under-confident draft's tokens accepted half the time: c115 of robustness draw 2048, 0.926
    of fixed depth 5; the shipped real pair reports ~0.11 and is accepted ~0.54 of the time). `calibrate=false`:
    the threshold is on the raw confidence (the rule before 2026-12-02).

    The cap is the one depth that maximises the batch's expected tokens per second at the batch's acceptance
    level (the running requests' accepted drafts per verified draft token, shrunk toward all requests' rate:
    `_common.CostAwareDepth`), priced with the view's cost model corrected online by the
    measured step costs (`_common.CostCalibration`), and at most `max_depth` (`cost_aware=false`: `max_depth`,
    the confidence alone stops): no position is drafted whose
    expected gain is below its cost, and the confidence stops a sequence earlier on a token the draft
    doubts. `extend` (default 8; 0 = the rule before 2026-12-02): the plan leaves room for up to that many
    positions past the cap (at most `max_depth`), and a row drafts one of them only while its expected gain (the
    product of the row's calibrated confidences so far x the level at that position) beats the cap's predicted
    goodput x the position's cost (`_common.keep_by_margin`), priced as if the verify pads ragged rows
    (`_common.as_padded`: a position one row opens costs the whole batch's, what an engine that pads charges).
    The cap prices every row at the batch's level; a run of confident tokens says more (at batch 1 with
    `confidence` acceptance the cap alone was 0.935 of fixed depth 5 and 0.90 of `oracle_expected`: c57 of
    robustness draw 2053). Not while draining a closed batch of more than one row (its slowest row decides when
    it ends, not the tokens). Under the shared budget (`use_budget`, off by default: the cost rule already prices a
    busy verify, and the budget's hard limit lost up to 15 % to fixed depth 1 at large batch): when the batch
    cannot give every sequence a draft, the first draft goes to the sequences with the highest acceptance
    estimates; while drafting, if the continuing sequences would push the step past the budget, only those with
    the highest cumulative confidence (the probability the whole draft so far survives) continue. `drain`
    (default on): once no request is left to join (view.requests_left == 0), the cap is the depth that finishes
    the batch soonest (its slowest row decides; `_common.uniform_depth`). `probe` as `batch_scaled`: where the
    cap is 0 at the level but not at a level `probe` standard errors higher, one token per row, to learn the
    level.
    `positions` as `batch_scaled`: the cap's level corrected per draft position. `idle_replan` as `batch_scaled`:
    a cap of 0 is kept without replanning for a few steps while the batch holds the same requests. `policy_time`
    as `batch_scaled`: where a step pays the policy's own time, a cap > 0 also pays a drafting step's extra.
    `catch_up` as `batch_scaled`: a cap > 0 after idle steps only if it pays for the draft's catch-up.
    `predictive` as `batch_scaled` (off): the cap priced by the level's posterior predictive. `position_prior` and
    `position_optimism` as `batch_scaled`.
    As `batch_scaled`, no row drafts past its request's end (`_common.draft_caps`), and while requests may still join
    the cap is priced so. `drain_makespan` as `batch_scaled` (default on since 2026-12-03).
    """

    name = "confidence"
    depth_param = "max_depth"

    def __init__(self, threshold: float = 0.3, max_depth: int = 8, use_budget: bool = False, cost_aware: bool = True,
                 drain: bool = True, probe: float = 2.0, positions: bool = True, idle_replan: int = 64,
                 policy_time: bool = True, catch_up: bool = True, predictive: bool = False, calibrate: bool = True,
                 extend: int = 8, position_prior: float = 20.0, position_optimism: float = 2.0,
                 drain_makespan: bool = True):
        self.threshold = as_float(threshold, "policy.threshold", min=0, max=1)
        self.calibrate = as_bool(calibrate, "policy.calibrate")
        self.extend = as_int(extend, "policy.extend", min=0)
        self.cost_aware = bool(cost_aware)
        super().__init__(max_depth, use_budget, drain, probe, positions, idle_replan, policy_time, catch_up,
                         predictive, position_prior, position_optimism, drain_makespan)

    def plan(self, view):
        n = view.batch_size
        k = self.cap(view)
        if self.cost_aware:
            k = self._depth.depth(view, k)
        self._k, self._margin = k, None
        draining = self.drain and view.requests_left == 0 and n > 1   # the slowest row decides, not the tokens
        if self.cost_aware and self.extend and not self.use_budget and self._depth.margin is not None and not draining:
            costs, G, rate = self._depth.margin   # rows may go past k while their confidences say it pays
            self._margin = (as_padded(costs, n), G, rate)
            k = min(k + self.extend, self.cap(view))
        depths = np.full(n, k, dtype=np.int64)
        if self.cost_aware:
            depths = self._depth.hold(depths)   # rows held back from a catch-up (`catch_up`)
        if self.use_budget:
            free = view.verify_tokens_free
            if free < n:  # not everyone gets a draft: the likeliest to be accepted do
                depths[:] = 0
                if free > 0 and k > 0:
                    depths[np.argsort(-view.acceptance, kind="stable")[:free]] = 1
        self._cum = np.ones(n)
        return self.finish(depths, view)

    def reset(self):
        super().reset()
        self._cal = ConfidenceCalibration() if self.calibrate else None
        self._k, self._margin = 0, None

    def keep_drafting(self, view, position, confidence):
        drafting = ~np.isnan(confidence)
        if self._cal is not None:   # the acceptance the confidence stands for, learnt from the verified drafts
            confidence = self._cal(confidence)
        self._cum = np.where(drafting, self._cum * np.where(drafting, confidence, 1.0), 0.0)
        keep = drafting & (confidence >= self.threshold)
        if self._margin is not None and position + 1 >= self._k:   # past the cost rule's depth: only where it pays
            idx = np.flatnonzero(keep & (view.depths > position + 1))
            if idx.size == 0:
                return np.zeros(view.batch_size, bool)
            costs, G, rate = self._margin
            v = self._cum[idx] * float(rate[min(position + 1, rate.size - 1)])
            return keep_by_margin(view, position, idx, float(v[0]) if idx.size == 1 else v, costs, G)
        if self.use_budget:
            room = view.verify_tokens_free - int(view.drafted.sum())
            if keep.sum() > room:  # the next position would overflow the budget: best survivors only
                order = np.argsort(-np.where(keep, self._cum, -1.0), kind="stable")
                keep = np.zeros_like(keep)
                keep[order[:max(room, 0)]] = True
        return keep

    def observe(self, view, accepted):
        super().observe(view, accepted)
        if self._cal is not None:
            self._cal.add(view.confidences, view.drafted, accepted)
