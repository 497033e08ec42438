import numpy as np

from specdepth.errors import as_float, as_int
from specdepth.policy import Policy


class ConfidenceThreshold(Policy):
    """Per sequence: keep drafting while the draft's confidence >= `threshold`, up to `max_depth`.

    Under the shared budget: when the batch cannot give every sequence a draft, the first draft goes to
    the sequences with the highest acceptance estimates; while drafting, if the continuing sequences would
    push the step past the budget, only those with the highest cumulative confidence (the probability the
    whole draft so far survives) continue.
    """

    name = "confidence"
    depth_param = "max_depth"

    def __init__(self, threshold: float = 0.5, max_depth: int = 8, use_budget: bool = True):
        self.threshold = as_float(threshold, "policy.threshold", min=0, max=1)
        self.max_depth = as_int(max_depth, "policy.max_depth", min=0)
        self.use_budget = bool(use_budget)

    def plan(self, view):
        n = view.batch_size
        k = min(self.max_depth, view.max_depth)
        depths = np.full(n, k, dtype=np.int64)
        if self.use_budget:
            free = view.verify_tokens_free
            if free < n:  # not everyone gets a draft: the likeliest to be accepted do
                depths[:] = 0
                if free > 0:
                    depths[np.argsort(-view.acceptance, kind="stable")[:free]] = 1
        self._cum = np.ones(n)
        return depths

    def keep_drafting(self, view, position, confidence):
        drafting = ~np.isnan(confidence)
        self._cum = np.where(drafting, self._cum * np.where(drafting, confidence, 1.0), 0.0)
        keep = drafting & (confidence >= self.threshold)
        if self.use_budget:
            room = view.verify_tokens_free - int(view.drafted.sum())
            if keep.sum() > room:  # the next position would overflow the budget: best survivors only
                order = np.argsort(-np.where(keep, self._cum, -1.0), kind="stable")
                keep = np.zeros_like(keep)
                keep[order[:max(room, 0)]] = True
        return keep
