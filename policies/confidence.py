import numpy as np

from specdepth.errors import as_bool, as_float, as_int

from .kit import ConfidenceCalibration, CostAwarePolicy, as_padded, best_survivors, first_drafts, keep_by_margin
from .kit import search
from .kit.kernels import confidence_drafting, confidence_keep, confidence_plain

_NONE = np.zeros(0)


class ConfidenceThreshold(CostAwarePolicy):
    """Per sequence: keep drafting while the acceptance the draft's confidence stands for >= `threshold`.

    Rule: the plan is a cap, the one depth with the most expected tokens per second at the batch's acceptance level
    (`kit.CostAwareDepth`, at most `max_depth`; `cost_aware=false`: `max_depth`, the confidence alone stops). While
    drafting, a row stops at the first token whose calibrated confidence is below `threshold` (`calibrate`: Platt
    scaling learnt online, `kit.ConfidenceCalibration`; false: the raw confidence, the seed's rule). `extend`: up
    to that many positions past the cap, each drafted only while its expected gain (the row's calibrated
    confidences so far x the level there) beats the cap's goodput x the position's cost (`kit.keep_by_margin`,
    priced padded: `kit.as_padded`); not while draining a batch of more than one row.
    Budget: the calibrated cost model prices every position. `use_budget=true` also keeps within the token budget:
    the first drafts go to the highest acceptance estimates, and while drafting, to the highest cumulative
    confidences.
    Parameters: `threshold`, `calibrate`, `max_depth`, `cost_aware`, `extend`, `use_budget`, `drain`,
    `idle_replan`, `policy_time`, `catch_up`, and the `level` node, as `batch_scaled`."""

    name = "confidence"
    depth_param = "max_depth"

    def __init__(self, threshold: float = 0.3, calibrate: bool = True, max_depth: int = 8, cost_aware: bool = True,
                 extend: int = 8, use_budget: bool = False, drain: bool = True, idle_replan: int = 64,
                 policy_time: bool = True, catch_up: bool = True, level=None):
        self.threshold = as_float(threshold, "policy.threshold", min=0, max=1)
        self.calibrate = as_bool(calibrate, "policy.calibrate")
        self.extend = as_int(extend, "policy.extend", min=0)
        self.cost_aware = bool(cost_aware)
        super().__init__(max_depth, use_budget, drain, idle_replan, policy_time, catch_up, level)

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
        if not self.use_budget:   # k for every row, those held back from a catch-up at 0, finished, in one loop
            depths = self.uniform(view, k)
        else:
            depths = np.empty(n, np.int64)
            depths.fill(k)   # (np.full's values, without its wrapper)
            if self.cost_aware:
                depths = self._depth.hold(depths)   # rows held back from a catch-up (`catch_up`)
            depths = first_drafts(depths, view, k)
        if self._cum.shape == (n,):   # the running products start at 1 (in the kept array)
            self._cum.fill(1.0)
        else:
            self._cum = np.ones(n)
        self._compiled, self._depths = search.COMPILED, None   # keep_drafting's compiled form, this step
        self._tables = self._drafting_tables(view, n) if self._compiled and self._margin is not None else None
        self._compiled = self._compiled and (self._margin is None or self._tables is not None)
        return depths if not self.use_budget else self.finish(depths, view)

    def _drafting_tables(self, view, n: int):
        """keep_drafting's inputs past the cost rule's depth, fixed for the step (`kernels.confidence_drafting`):
        (remaining, draft, verify, pad, G, rates); None where its numpy form runs (other dtypes, tables too short
        for the compiled loop)."""
        costs, G, rates = self._margin
        rem, pad = view.remaining, _NONE if costs.pad is None else costs.pad
        f = np.float64
        if not (rem.dtype == np.int64 and rem.shape == (n,) and costs.draft.size > n and costs.verify.size
                and costs.draft.dtype == costs.verify.dtype == pad.dtype == rates.dtype == f and rates.ndim == 1
                and rates.size):
            return None
        return rem, costs.draft, costs.verify, pad, float(G), rates

    def reset(self):
        super().reset()
        self._cal = ConfidenceCalibration() if self.calibrate else None
        self._k, self._margin, self._cum = 0, None, np.ones(0)
        self._compiled, self._depths, self._tables = False, None, None   # keep_drafting's compiled form (plan)

    def keep_drafting(self, view, position, confidence):
        past = self._margin is not None and position + 1 >= self._k   # past the cost rule's depth: where it pays
        if self._compiled and confidence.dtype == np.float64 and confidence.shape == self._cum.shape:
            keep = self._keep_compiled(view, position, confidence, past)
            if keep is not None:
                return best_survivors(keep, self._cum, view) if self.use_budget and not past else keep
        # the acceptance the confidence stands for, learnt from the verified drafts
        conf = confidence if self._cal is None else self._cal(confidence)
        rate = float(self._margin[2][min(position + 1, self._margin[2].size - 1)]) if past else 0.0
        keep, idx, v = self._survivors(view, position, confidence, conf, past, rate)
        if past:
            if idx.size == 0:
                return np.zeros(view.batch_size, bool)
            costs, G, _ = self._margin
            return keep_by_margin(view, position, idx, float(v[0]) if idx.size == 1 else v, costs, G)
        return best_survivors(keep, self._cum, view) if self.use_budget else keep

    def _keep_compiled(self, view, position, raw, past):
        """keep_drafting's mask in one loop (`kernels.confidence_plain`, past the cost rule's depth
        `kernels.confidence_drafting`) after the calibration's odds; None where the view's depths do not match the
        batch (its numpy form runs)."""
        cal = self._cal
        conf = raw if cal is None else cal.odds(raw)
        if not past:
            return confidence_plain(raw, conf, cal is not None, self._cum, self.threshold)
        if self._depths is None:   # the plan's depths, for the whole step
            self._depths = view.depths
            if self._depths.shape != raw.shape:
                self._compiled = False
                return None
        rem, draft, verify, pad, G, rates = self._tables
        return confidence_drafting(raw, conf, cal is not None, self._cum, self.threshold, self._depths, position, rates,
                                   view.drafted, rem, draft, verify, pad, G)

    def _survivors(self, view, position, raw, conf, past, rate):
        """The rows that keep drafting at the threshold (and the running products `_cum`); `past`: those of them
        planned deeper than position + 1 and their values _cum x rate. Compiled for float64 confidences."""
        if search.COMPILED and raw.dtype == conf.dtype == np.float64 and raw.shape == conf.shape == self._cum.shape \
                and view.depths.shape == raw.shape:
            return confidence_keep(raw, conf, self._cum, self.threshold, view.depths, position, past, rate)
        drafting = ~np.isnan(raw)
        self._cum = np.where(drafting, self._cum * np.where(drafting, conf, 1.0), 0.0)
        keep = drafting & (conf >= self.threshold)
        if not past:
            return keep, None, None
        idx = np.flatnonzero(keep & (view.depths > position + 1))
        return keep, idx, self._cum[idx] * rate

    def observe(self, view, accepted):
        super().observe(view, accepted)
        if self._cal is not None:
            self._cal.add(view.confidences, view.drafted, accepted)
