"""The drain and makespan rules' arithmetic: when the last of the rows is expected to finish."""
from __future__ import annotations

import numpy as np

from . import kernels


def normal_cdf(x: np.ndarray) -> np.ndarray:
    """The standard normal CDF to ~2e-4 (tanh form; numpy has no erf)."""
    return 0.5 * (1.0 + np.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))


def _normal_cdf_into(z: np.ndarray) -> np.ndarray:
    """normal_cdf(z) written over z (a float array of its own): the same operations on the same values (+ and x
    commute exactly), without the temporaries."""
    t = 0.044715 * z
    t *= z
    t *= z
    z += t
    z *= 0.7978845608028654
    np.tanh(z, out=z)
    z += 1.0
    z *= 0.5
    return z


def expected_max(mu: np.ndarray, sd: np.ndarray, points: int = 256, grouped: bool = False) -> float:
    """E[max_i X_i] of independent X_i ~ normal(mu_i, sd_i^2) (sd_i = 0: the constant mu_i): lo + the integral
    of 1 - F from lo to hi, F the maximum's CDF (the product of the rows'), on `points` points; below lo =
    max(mu - 6 sd) F is 0, above hi = max(mu + 6 sd) it is 1. `grouped`: rows that cannot reach lo + 6 sd are
    left out and equal (mu, sd) pairs enter once, raised to their count (the same to rounding; for large
    batches, `uniform_depth`)."""
    mu = np.asarray(mu, np.float64)
    sd = np.asarray(sd, np.float64)
    if search.COMPILED and not grouped and mu.ndim == 1 and mu.shape == sd.shape:   # (None: the numpy form's case)
        got = _compiled_max(mu, sd, points)
        if got is not None:
            return got
    lo, hi = float((mu - 6.0 * sd).max()), float((mu + 6.0 * sd).max())
    if hi - lo <= 0.0:
        return float(mu.max())
    x = _linspace(lo, hi, points)
    spread = sd > 0.0
    if grouped:
        near = spread & (mu + 6.0 * sd > lo)
        m, s, count = _groups(mu[near], sd[near])
        z = x[None, :] - m[:, None]
        z /= s[:, None]
        F = np.prod(_normal_cdf_into(z) ** count[:, None], axis=0)
    else:
        z = x[None, :] - mu[spread, None]
        z /= sd[spread, None]
        F = np.prod(_normal_cdf_into(z), axis=0)
    if not spread.all():
        F = F * (x >= float(mu[~spread].max()))
    y = 1.0 - F
    return lo + float((np.subtract(x[1:], x[:-1]) * (y[1:] + y[:-1]) / 2.0).sum())   # np.trapezoid's arithmetic


def _compiled_max(mu: np.ndarray, sd: np.ndarray, points: int) -> float | None:
    """expected_max (not grouped) in two compiled loops around numpy's tanh of the CDF arguments that are not
    saturated (`kernels.max_arguments`, `kernels.max_integral`: the same operations); None where the loops leave
    it to the numpy form (a value not finite, a degenerate grid)."""
    x, args = np.empty(max(int(points), 0)), np.empty(mu.size * max(int(points), 0))
    at = np.empty(args.size, np.int64)
    k, lo, _, ok = kernels.max_arguments(mu, sd, x, args, at)
    if not ok:
        return None
    th = args[:k]
    np.tanh(th, out=th)
    return float(kernels.max_integral(mu, sd, x, th, at, k, lo, np.empty(x.size)))


def expected_maxes(mu: np.ndarray, sd: np.ndarray, points: int = 256) -> np.ndarray:
    """expected_max(mu[d], sd[d], points, grouped=True) for every row d of [depths, rows] arrays, with the same
    arithmetic (the same bits) in a few calls for all d: the grids, the groups (sorted by d, then mu, then sd),
    and the trapezoid sums at once; the powers and products per d (`_cdf_products`). Compiled
    (`kit.search.COMPILED`, float64 arrays): the same operations in kernels, with numpy's tanh and power between
    them on the arguments that are not saturated (`kernels.drain_setup`, `kernels.drain_sums`)."""
    if search.COMPILED and mu.dtype == sd.dtype == np.float64 and points >= 2 and mu.ndim == 2 and mu.shape[1]:
        return _compiled(mu, sd, points)
    out = np.empty(mu.shape[0])
    lo, hi = (mu - 6.0 * sd).max(axis=1), (mu + 6.0 * sd).max(axis=1)
    step = (hi - lo) / (points - 1)
    odd = (hi - lo <= 0.0) | (step == 0.0) | (points < 2)
    for d in np.flatnonzero(odd):   # degenerate grids: the one-row form
        out[d] = expected_max(mu[d], sd[d], points, grouped=True)
    ok = np.flatnonzero(~odd)
    if ok.size == 0:
        return out
    mu, sd, lo, hi = mu[ok], sd[ok], lo[ok], hi[ok]
    x = _steps(points) * step[ok, None]
    x += lo[:, None]
    x[:, -1] = hi
    spread = sd > 0.0
    F = _cdf_products(x, mu, sd, spread & (mu + 6.0 * sd > lo[:, None]))
    cut = ~spread.all(axis=1)
    if cut.any():
        top = np.where(spread, -np.inf, mu).max(axis=1)
        F[cut] = F[cut] * (x[cut] >= top[cut, None])
    y = 1.0 - F
    out[ok] = lo + (np.subtract(x[:, 1:], x[:, :-1]) * (y[:, 1:] + y[:, :-1]) / 2.0).sum(axis=1)
    return out


def _compiled(mu: np.ndarray, sd: np.ndarray, points: int) -> np.ndarray:
    """expected_maxes in kernels (the same operations), tanh and power as numpy's calls between them: the groups'
    tanh arguments (those numpy's power raises first), their CDFs and powers, and the products' trapezoid sums."""
    mu, sd = np.ascontiguousarray(mu), np.ascontiguousarray(sd)
    return _sums(mu, sd, points, *kernels.drain_setup(mu, sd, points))


def finish_maxes(e: np.ndarray, rem: np.ndarray, points: int = 256) -> np.ndarray:
    """expected_maxes(rem / e, sd) of `search._steps_to_finish`'s normal approximation for float64 [depths, rows]
    expected tokens e and the rows' remaining tokens rem: the moments and the groups in one kernel
    (`kernels.finish_setup`; e ** 3 numpy's power), then `_compiled`'s tanh, powers and sums."""
    mu, sd, args, power, groups = kernels.finish_setup(e, e ** 3, rem, points)
    return _sums(mu, sd, points, args, power, groups)


class FinishWork:
    """`finish_best`'s buffers, kept across steps by their owner (a CostAwareDepth): the moments, e ** 3, the groups
    and the maxima (re-allocated where the shape changes), the tanh arguments and exponents (grown where short)."""

    def __init__(self):
        self.shape = None
        self.args = self.power = np.empty(0)

    def fit(self, D: int, n: int) -> "FinishWork":
        if self.shape != (D, n):
            self.shape = (D, n)
            self.mu, self.sd, self.e3 = np.empty((D, n)), np.empty((D, n)), np.empty((D, n))
            self.groups, self.out, self.skip = np.empty((D * n, 5), np.int64), np.empty(D), np.empty(D, bool)
        return self


def finish_best(e: np.ndarray, rem: np.ndarray, num: float, T: np.ndarray, work: FinishWork,
                points: int = 256) -> tuple[int, float]:
    """kernels.ratio_best(num, finish_maxes(e, rem, points), T) (the same answer) in work's buffers: the moments,
    groups and arguments in one kernel (`kernels.finish_setup_into`), numpy's tanh and power on the arguments, the
    sums and the best depth in one (`kernels.drain_best`). The maxima of the depths whose ratio is sure to lose
    whatever their value (`kernels._drain_skips`) are not computed. e [depths, rows] C-contiguous float64, more
    than one row."""
    w = work.fit(*e.shape)
    np.power(e, 3, out=w.e3)   # (e ** 3's call)
    fit = (e, w.e3, rem, points, w.mu, w.sd, w.args, w.power, w.groups, num, T, w.skip)
    k, kp, g = kernels.finish_setup_into(*fit)
    if kp < 0:   # the buffers grow (then hold the run's longest)
        w.args, w.power = np.empty(2 * k), np.empty(2 * k)
        k, kp, g = kernels.finish_setup_into(*fit[:6], w.args, w.power, *fit[8:])
    args = w.args[:k]
    np.tanh(args, out=args)
    if kp:
        base = args[:kp]
        kernels.drain_bases(base)
        np.power(base, w.power[:kp], out=base)
    best, gain = kernels.drain_best(args, w.groups[:g], w.mu, w.sd, points, w.out, num, T, w.skip)
    if best >= 0:
        return best, gain
    for d in np.flatnonzero(np.isnan(w.out)).tolist():   # degenerate grids: the one-row form
        w.out[d] = expected_max(w.mu[d], w.sd[d], points, grouped=True)
    return kernels.ratio_best(num, w.out, T)


def _sums(mu, sd, points, args, power, groups):
    """The end of `_compiled` from drain_setup's returns: numpy's tanh and power, then kernels.drain_sums."""
    np.tanh(args, out=args)
    if power.size:
        base = args[:power.size]
        kernels.drain_bases(base)
        np.power(base, power, out=base)
    out, again = kernels.drain_sums(args, groups, mu, sd, points)
    if again:
        for d in np.flatnonzero(np.isnan(out)).tolist():   # other degenerate grids: the one-row form
            out[d] = expected_max(mu[d], sd[d], points, grouped=True)
    return out


def _cdf_products(x: np.ndarray, mu: np.ndarray, sd: np.ndarray, near: np.ndarray) -> np.ndarray:
    """Per row d of the grids x: the product over row d's distinct (mu, sd) pairs among `near` (ascending) of
    normal_cdf((x[d] - mu) / sd) ** count. The CDFs of all pairs at once, in place (elementwise: the same values);
    the powers and products as expected_max's calls on each row's pairs (numpy's power takes a fast path that
    depends on the block's shape), the power left out where every count is 1 (it keeps a base exactly)."""
    d, m, s, count = _row_groups(mu, sd, near)
    ends = np.searchsorted(d, np.arange(x.shape[0] + 1)).tolist()
    ones = (count == 1).tolist()
    c = x[d]
    c -= m[:, None]
    c /= s[:, None]
    _normal_cdf_into(c)
    F = np.ones(x.shape)
    for r in range(x.shape[0]):
        a, b = ends[r], ends[r + 1]
        if a == b:
            continue
        block = c[a:b]
        if not all(ones[a:b]):
            block = block ** count[a:b, None]
        F[r] = np.multiply.reduce(block, axis=0)   # np.prod's reduction, without its wrapper
    return F


def _row_groups(mu: np.ndarray, sd: np.ndarray, near: np.ndarray):
    """The distinct (mu, sd) pairs among `near` of each row d, sorted by d, then mu, then sd: (d, mu, sd, count)."""
    d, _ = np.nonzero(near)
    m, s = mu[near], sd[near]
    order = np.lexsort((s, m, d))
    d, m, s = d[order], m[order], s[order]
    new = np.empty(m.size, bool)
    new[:1] = True
    np.not_equal(m[1:], m[:-1], out=new[1:])
    new[1:] |= (s[1:] != s[:-1]) | (d[1:] != d[:-1])
    at = np.flatnonzero(new)
    return d[at], m[at], s[at], np.diff(np.append(at, m.size))


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
    x = _steps(points) * step
    x += lo
    x[-1] = hi
    return x


def _steps(points: int) -> np.ndarray:
    """np.arange(points) as floats, one read-only array per `points`."""
    base = _STEPS.get(points)
    if base is None:
        base = _STEPS[points] = np.arange(points, dtype=np.float64)
        base.flags.writeable = False
    return base


from . import search  # noqa: E402  (kit.search imports this module; its COMPILED switch is read per call)
