import numpy as np

from specdepth.errors import as_int
from specdepth.policy import Policy

from .kit import StepCost, best_prefix, draft_caps


class Oracle(Policy):
    """Simulator only: sees, before deciding, how many leading drafts the target will accept for each
    sequence (`view.oracle_accept`), so it never drafts a token that will be rejected. It is the bound a
    depth policy is measured against: no causal policy (one that only knows the past) can beat it, since
    whatever it would draft is worth at most what the oracle knows it is worth.

    Rule: sequence i is worth drafting up to a_i = oracle_accept[i] tokens (capped by the tokens it has
    left), each then certain to be emitted. Slots are ranked by position (shallow positions share a draft
    forward with more rows) and the prefix with the highest predicted goodput (emitted tokens / step
    time from the view's cost model) is drafted. Refused with a ConfigError by any backend that cannot
    reveal acceptance outcomes (only backend=sim can).
    """

    name = "oracle"
    depth_param = "max_depth"
    requires_oracle = True

    def __init__(self, max_depth: int = 16):
        self.max_depth = as_int(max_depth, "policy.max_depth", min=0)
        self._costs = StepCost()

    def reset(self):
        self._costs = StepCost()

    def plan(self, view):
        n = view.batch_size
        K = min(self.max_depth, view.max_depth, (view.max_num_batched_tokens - n) // n)
        if K <= 0:
            return np.zeros(n, np.int64)
        a = np.minimum(view.oracle_accept, draft_caps(view, K))
        if not a.any():
            return np.zeros(n, np.int64)
        costs = self._costs.update(view, K)
        j = np.arange(K)
        rows, cols = np.nonzero(j[None, :] < a[:, None])
        order = np.lexsort((rows, cols))          # position-major
        m, _ = best_prefix(n, rows[order], cols[order], np.ones(order.size), costs, float(n))
        return np.bincount(rows[order[:m]], minlength=n).astype(np.int64)
