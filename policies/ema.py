import numpy as np

from specdepth.errors import ConfigError, as_choice, as_float, as_int
from specdepth.policy import Policy

from .kit import PerRequest, fit_token_cap


class EMA(Policy):
    """SGLang `--speculative-adaptive`: an exponential moving average (weight `alpha` on the newest step)
    of the accepted draft length; depth = clamp(round(ema) + 1, min_depth, max_depth), raised to the
    smallest of `tiers` that covers it (SGLang switches among pre-captured tiers [1, 3, 7]; tiers=null
    allows every depth). With min_depth=0 a depth of 0 is final (nothing drafted, nothing to learn from).

    scope=batch: one EMA of the batch-average accepted length, one depth for all (SGLang); the depth is
    re-decided every `interval` steps after `warmup` steps, with hysteresis: it goes down only once the
    EMA is `hysteresis_down` below the rounding boundary, up once it is `hysteresis_up` above it (our
    reading of SGLang's down -0.25 / up 0.0). scope=sequence: one EMA per request, re-decided each step.
    """

    name = "ema"

    def __init__(self, alpha: float = 0.2, scope: str = "batch", initial: int = 3, min_depth: int = 1,
                 max_depth: int = 7, tiers=(1, 3, 7), warmup: int = 10, interval: int = 5,
                 hysteresis_down: float = 0.25, hysteresis_up: float = 0.0):
        self.alpha = as_float(alpha, "policy.alpha", min=0, max=1, min_open=True)
        self.scope = as_choice(scope, "policy.scope", {"batch", "sequence"})
        self.min_depth = as_int(min_depth, "policy.min_depth", min=0)
        self.max_depth = as_int(max_depth, "policy.max_depth", min=self.min_depth)
        self.initial = as_int(initial, "policy.initial", min=self.min_depth, max=self.max_depth)
        if tiers is not None:
            try:
                tiers = sorted(as_int(t, f"policy.tiers[{i}]", min=0) for i, t in enumerate(tiers))
            except TypeError:
                raise ConfigError(f"policy.tiers must be a list of depths or null, got {tiers!r}") from None
            if not tiers:
                raise ConfigError("policy.tiers must not be empty (null = every depth)")
            tiers = list(tiers)
        self.tiers = tiers
        self.warmup = as_int(warmup, "policy.warmup", min=0)
        self.interval = as_int(interval, "policy.interval", min=1)
        self.hysteresis_down = as_float(hysteresis_down, "policy.hysteresis_down", min=0)
        self.hysteresis_up = as_float(hysteresis_up, "policy.hysteresis_up", min=0)
        self._seq = PerRequest(ema=initial - 1.0, depth=float(initial))
        self.reset()

    def reset(self):
        self._seq.reset()
        self._ema = self.initial - 1.0
        self._depth = self.initial
        self._steps = 0

    def depth_bound(self):
        deepest = int(self._snap(np.array(self.max_depth)))   # a tier above max_depth may be chosen
        return ("max_depth" if deepest <= self.max_depth else "tiers"), deepest

    def _snap(self, d):
        d = np.clip(d, self.min_depth, self.max_depth)
        if self.tiers is None:
            return d
        t = np.asarray(self.tiers)
        return t[np.minimum(np.searchsorted(t, d, side="left"), t.size - 1)]

    def _decide(self, ema, cur):
        # rounding boundary of depth cur is ema = cur - 1 +- 0.5
        up = ema >= cur - 0.5 + self.hysteresis_up
        down = ema < cur - 1.5 - self.hysteresis_down
        target = np.rint(ema) + 1
        return self._snap(np.where(up | down, target, cur)).astype(np.int64)

    def plan(self, view):
        n = view.batch_size
        if self.scope == "batch":
            return fit_token_cap(np.full(n, min(int(self._depth), view.max_depth), np.int64), view)
        st = self._seq.align(view.request_ids)
        return fit_token_cap(np.minimum(st.depth, view.max_depth).astype(np.int64), view)

    def observe(self, view, accepted):
        drafted = view.drafted
        self._steps += 1
        if self.scope == "batch":
            if drafted.any():
                mean_acc = float(accepted[drafted > 0].mean())
                self._ema = (1 - self.alpha) * self._ema + self.alpha * mean_acc
            if self._steps >= self.warmup and (self._steps - self.warmup) % self.interval == 0:
                self._depth = int(self._decide(np.array(self._ema), np.array(self._depth)))
            return
        st = self._seq.align(view.request_ids)
        d = drafted > 0
        st.ema[d] = (1 - self.alpha) * st.ema[d] + self.alpha * accepted[d]
        if self._steps >= self.warmup:
            st.depth = self._decide(st.ema, st.depth)
