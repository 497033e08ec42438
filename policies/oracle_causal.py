import numpy as np

from .kit import draft_caps, keep_by_margin
from .oracle_expected import OracleExpected


class OracleCausal(OracleExpected):
    """Simulator only: `oracle_expected` without its look-ahead, the bound for a causal policy that knows the
    acceptance process. It plans each step from each row's acceptance probability *before* the draft proposes the
    tokens (`view.expected_accept_prob`: averaged over the confidences the draft may report), lets every planned
    row draft on to its request's end, and after each draft position stops the rows whose next token is not worth
    its marginal time (goodput's rule, `kit.keep_by_margin`, at the true cost), valuing the token just drafted
    at its true probability (`view.accept_prob`: what its confidence tells, the draft's calibration known).

    With iid, beta and decay acceptance a token's probability is known before it is drafted, and this is
    `oracle_expected` up to how the stopping rule splits the plan. With acceptance=confidence, `oracle_expected`
    also knows how confident the draft will be at positions not drafted yet, which no causal policy can know:
    oracle_causal / oracle_expected is that information's worth, and goodput_true / oracle_causal what goodput's
    estimates lose (experiments/robustness, the regret split).
    """

    name = "oracle_causal"

    def _probs(self, view):
        return view.expected_accept_prob

    def plan(self, view):
        depths = super().plan(view)
        self._p, self._e = view.accept_prob, view.expected_accept_prob
        self._s = np.ones(view.batch_size)
        if not depths.any():
            return depths
        return np.where(depths > 0, draft_caps(view, self._K), 0)

    def keep_drafting(self, view, position, confidence):
        drafting = ~np.isnan(confidence)
        self._s = self._s * np.where(drafting, self._p[:, position], 0.0)
        idx = np.flatnonzero(drafting & (view.depths > position + 1))
        if idx.size == 0:
            return np.zeros(view.batch_size, bool)
        v = self._s[idx] * self._e[idx, position + 1]
        return keep_by_margin(view, position, idx, float(v[0]) if idx.size == 1 else v, self._tab, self._G)
