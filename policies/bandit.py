import math

import numpy as np

from specdepth.errors import ConfigError, as_float, as_int
from specdepth.policy import Policy

from .kit import fit_token_cap


class Bandit(Policy):
    """BanditSpec-style UCB1 over a small set of depths (`arms`), one depth for the whole batch per step.

    Reward of a step = emitted tokens per second of that step (measured: the clock advance until the next
    plan); the arm played next maximises mean / (best arm's mean) + `c` * sqrt(2 ln t / n_arm). Every arm
    is tried once first. Counts and sums are discounted by `discount` per step so the choice can follow a
    batch that changes size.
    """

    name = "bandit"

    def __init__(self, arms=(0, 1, 2, 3, 4, 6, 8), c: float = 0.3, discount: float = 0.995):
        try:
            arms = [as_int(a, f"policy.arms[{i}]", min=0) for i, a in enumerate(arms)]
        except TypeError:
            raise ConfigError(f"policy.arms must be a list of depths, got {arms!r}") from None
        if not arms:
            raise ConfigError("policy.arms must not be empty")
        self.arms = arms
        self.c = as_float(c, "policy.c", min=0)
        self.discount = as_float(discount, "policy.discount", min=0, max=1, min_open=True)
        self.reset()

    def depth_bound(self):
        return "arms", max(self.arms)

    def reset(self):
        k = len(self.arms)
        self._n = np.zeros(k)
        self._r = np.zeros(k)
        self._pending = None   # (arm, start time, emitted tokens) of the step awaiting its duration

    def _settle(self, now):
        if self._pending is None:
            return
        arm, t0, tokens = self._pending
        self._pending = None
        dt = now - t0
        if dt <= 0:
            return
        self._n *= self.discount
        self._r *= self.discount
        self._n[arm] += 1
        self._r[arm] += tokens / dt

    def plan(self, view):
        self._settle(view.now_s)
        untried = np.flatnonzero(self._n == 0)
        if untried.size:
            arm = int(untried[0])
        else:
            t = self._n.sum()
            mean = self._r / self._n
            ucb = mean / max(mean.max(), 1e-300) + self.c * np.sqrt(2 * math.log(max(t, 1.0)) / self._n)
            arm = int(np.argmax(ucb))
        self._arm, self._t0 = arm, view.now_s
        return fit_token_cap(np.full(view.batch_size, min(self.arms[arm], view.max_depth), np.int64), view)

    def observe(self, view, accepted):
        emitted = np.minimum(accepted + 1, view.remaining).sum()
        self._pending = (self._arm, self._t0, float(emitted))

    @property
    def label(self):
        return self.name
