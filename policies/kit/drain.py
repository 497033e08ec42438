"""The drain and makespan rules' arithmetic: when the last of the rows is expected to finish."""
from __future__ import annotations

import numpy as np


def normal_cdf(x: np.ndarray) -> np.ndarray:
    """The standard normal CDF to ~2e-4 (tanh form; numpy has no erf)."""
    return 0.5 * (1.0 + np.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))


def expected_max(mu: np.ndarray, sd: np.ndarray, points: int = 256, grouped: bool = False) -> float:
    """E[max_i X_i] of independent X_i ~ normal(mu_i, sd_i^2) (sd_i = 0: the constant mu_i): lo + the integral
    of 1 - F from lo to hi, F the maximum's CDF (the product of the rows'), on `points` points; below lo =
    max(mu - 6 sd) F is 0, above hi = max(mu + 6 sd) it is 1. `grouped`: rows that cannot reach lo + 6 sd are
    left out and equal (mu, sd) pairs enter once, raised to their count (the same to rounding; for large
    batches, `uniform_depth`)."""
    mu = np.asarray(mu, np.float64)
    sd = np.asarray(sd, np.float64)
    lo, hi = float((mu - 6.0 * sd).max()), float((mu + 6.0 * sd).max())
    if hi - lo <= 0.0:
        return float(mu.max())
    x = _linspace(lo, hi, points)
    spread = sd > 0.0
    if grouped:
        near = spread & (mu + 6.0 * sd > lo)
        m, s, count = _groups(mu[near], sd[near])
        F = np.prod(normal_cdf((x[None, :] - m[:, None]) / s[:, None]) ** count[:, None], axis=0)
    else:
        F = np.prod(normal_cdf((x[None, :] - mu[spread, None]) / sd[spread, None]), axis=0)
    if not spread.all():
        F = F * (x >= float(mu[~spread].max()))
    y = 1.0 - F
    return lo + float((np.subtract(x[1:], x[:-1]) * (y[1:] + y[:-1]) / 2.0).sum())   # np.trapezoid's arithmetic


def _groups(mu: np.ndarray, sd: np.ndarray):
    """The distinct (mu, sd) pairs in ascending order (by mu, then sd) and their counts: np.unique(..., axis=1)'s
    answer without its structured sort."""
    order = np.lexsort((sd, mu))
    m, s = mu[order], sd[order]
    new = np.empty(m.size, bool)
    new[:1] = True
    np.not_equal(m[1:], m[:-1], out=new[1:])
    new[1:] |= s[1:] != s[:-1]
    at = np.flatnonzero(new)
    return m[at], s[at], np.diff(np.append(at, m.size))


_STEPS = {}   # points -> np.arange(points) as floats, read-only


def _linspace(lo: float, hi: float, points: int) -> np.ndarray:
    """np.linspace(lo, hi, points) (the same arithmetic: i x step + lo, the last point hi) without its overhead."""
    step = (hi - lo) / (points - 1)
    if points < 2 or step == 0.0:
        return np.linspace(lo, hi, points)
    base = _STEPS.get(points)
    if base is None:
        base = _STEPS[points] = np.arange(points, dtype=np.float64)
        base.flags.writeable = False
    x = base * step
    x += lo
    x[-1] = hi
    return x
