import numpy as np

from specdepth.errors import as_bool, as_int
from specdepth.policy import Policy

from .kit import StepCost, draft_caps, plan_by_position, plan_pays_catch_up


class OracleExpected(Policy):
    """Simulator only: the bound for a causal policy that estimates perfectly. It knows each draft token's
    true acceptance probability (`view.accept_prob`, from the acceptance model) but not its outcome, and
    the true cost of a step (`view.true_cost`: what the simulated clock charges, overheads and padding
    included), and plans each step to maximise expected emitted tokens per second with the search
    `goodput` uses (`kit.plan_by_position`): slot (i, p) is worth the product of row i's acceptance
    probabilities up to p, slots past the request's end nothing.

    Exact per step when every position ranks the rows alike (iid, beta, decay: a row's probabilities are
    one level, or one level times a common decay); with the `confidence` acceptance model the per-token
    probabilities rank rows differently at different positions, and the search is a greedy over nested
    row sets (not exact). It is myopic (one step at a time), so it is not a bound on end-to-end throughput
    either: `goodput` can beat it in a cell, e.g. through the tail of a closed batch.
    `catch_up` (default on): the draft's catch-up tokens after idle steps (backend.draft_catch_up) are part of the
    true cost, which the per-step tables do not hold: rows whose draft lags draft only if the plan's expected gain
    over their expected remaining steps pays for them (`kit.catch_up_pays`, priced with the true cost), as
    goodput does.
    """

    name = "oracle_expected"
    requires_accept_prob = True
    requires_true_cost = True

    def __init__(self, max_depth: int = 16, catch_up: bool = True):
        self.max_depth = as_int(max_depth, "policy.max_depth", min=0)
        self.catch_up = as_bool(catch_up, "policy.catch_up")
        self.reset()

    def reset(self):
        self._costs = StepCost()
        self._G = 0.0

    def _probs(self, view) -> np.ndarray:
        """The per-token acceptance probabilities the plan values slots by."""
        return view.accept_prob

    def plan(self, view):
        n = view.batch_size
        self._K = K = min(self.max_depth, view.max_depth, (view.max_num_batched_tokens - n) // n)
        if K <= 0:
            return np.zeros(n, np.int64)
        remaining = view.remaining
        S = np.cumprod(self._probs(view)[:, :K], axis=1)
        S[np.arange(K)[None, :] >= draft_caps(view, K)[:, None]] = 0.0
        self._tab = costs = self._costs.update(view, K, view.true_cost)
        depths, self._G = plan_by_position(S, costs, self._G, tie=remaining, nested=True)
        if not self.catch_up:
            return depths
        lag = view.draft_lag
        late = (depths > 0) & (lag > 2)
        if late.any() and not plan_pays_catch_up(view, depths, late, S, self._G, n, costs, cost=view.true_cost):
            S[lag > 2] = 0.0   # every lagging row (the replan would pick others)
            depths, self._G = plan_by_position(S, costs, self._G, tie=remaining, nested=True)
        return depths
