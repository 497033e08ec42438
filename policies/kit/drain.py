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
    x = np.linspace(lo, hi, points)
    spread = sd > 0.0
    if grouped:
        near = spread & (mu + 6.0 * sd > lo)
        (m, s), count = np.unique(np.stack([mu[near], sd[near]]), axis=1, return_counts=True)
        F = np.prod(normal_cdf((x[None, :] - m[:, None]) / s[:, None]) ** count[:, None], axis=0)
    else:
        F = np.prod(normal_cdf((x[None, :] - mu[spread, None]) / sd[spread, None]), axis=0)
    if not spread.all():
        F = F * (x >= float(mu[~spread].max()))
    return lo + float(np.trapezoid(1.0 - F, x))
