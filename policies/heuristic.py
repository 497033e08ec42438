import numpy as np

from specdepth.errors import as_int
from specdepth.policy import Policy

from .kit import PerRequest, fit_token_cap


class Heuristic(Policy):
    """Hugging Face assisted generation, `num_assistant_tokens_schedule="heuristic"`, per sequence: start
    at `initial` drafts; +2 after a draft that was fully accepted, else max(1, n - 1). HF's defaults:
    20 initial tokens and no cap; here the count is kept within [1, `max_depth`] (and the engine's cap
    applies), so that a long run of full acceptances cannot bank depth the engine would never draft."""

    name = "heuristic"
    depth_param = "max_depth"

    def __init__(self, initial: int = 20, max_depth: int = 16):
        self.initial = as_int(initial, "policy.initial", min=1)
        self.max_depth = as_int(max_depth, "policy.max_depth", min=1)
        self._n = PerRequest(depth=float(initial))

    def reset(self):
        self._n.reset()

    def plan(self, view):
        n = self._n.align(view.request_ids).depth
        return fit_token_cap(np.minimum(n, min(self.max_depth, view.max_depth)).astype(np.int64), view)

    def observe(self, view, accepted):
        n = self._n.align(view.request_ids)
        drafted = view.drafted
        full = (accepted >= drafted) & (drafted > 0)
        n.depth = np.clip(np.where(full, n.depth + 2, np.where(drafted > 0, n.depth - 1, n.depth)), 1, self.max_depth)
