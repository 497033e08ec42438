"""Acceptance estimates: the batch's level per request, per draft position, and from the draft's confidence."""
from __future__ import annotations

import math

import numpy as np
from numpy._core.umath import clip as _clip   # what np.clip calls on float arrays, without its wrapper

from . import kernels

COMPILED = True   # ConfidenceCalibration's compiled loops (kit/kernels.py); False: their numpy form (equal)


class PositionFactors:
    """Per draft position p, the accepted tokens and the sum of the rows' estimates over the tokens verified
    there (decayed with `forget`); their ratio, the position factor f_p, corrects an estimate a at position p
    (a x f_p: a draft whose later guesses are accepted less often than its first), shrunk toward 1 with
    `prior` pseudo-tokens. A factor below 1 is raised by `optimism` standard errors (at most to 1; bound
    0.5 sqrt(E_p) / (E_p + prior), E_p the expected tokens verified there): without it, a position judged bad
    on a few dozen early tokens is never drafted again and the judgement never corrected. `factor(k)` is
    cached until the sums change (each element depends only on its own position's sums).
    `paired` (add's `drafted` given): a later position p is judged against position 0's outcomes on the same
    row-steps (those drafted at least p + 1 deep), f_p = ratio_p / ratio_0(those row-steps) x f_0, the middle
    ratio shrunk toward f_0 (no selection) with `prior` pseudo-tokens. A policy drafts deep where its estimate
    came out high, so measured against the estimate alone the later positions look worse than they are (the
    winner's curse): experiments/pareto's a100_80g, iid a = 0.5 (every position accepted alike), settled the
    second position's factor at 0.88-0.92, and goodput drafted one token where two paid (batch 8: 0.985 of fixed
    depth 2 end to end). Paired, the selection inflates both ratios alike, and they cancel."""

    def __init__(self, prior: float = 20.0, optimism: float = 2.0, paired: bool = False):
        self.prior, self.optimism, self.paired = prior, optimism, paired
        self.accepted = np.zeros(0)
        self.expected = np.zeros(0)
        self.first_acc = np.zeros(0)   # paired: position 0's accepted tokens over the row-steps drafted past p
        self.first_exp = np.zeros(0)   # ... and their estimates
        self._cache = None   # (the two sums' arrays, the factors); reset where the sums change in place
        self._args = None    # `compiled_args`' checked sums and settings

    def factor(self, k: int) -> np.ndarray:
        """f_p for positions 0..k-1 (1 where nothing was verified yet)."""
        c = self._cache
        if c is None or c[0] is not self.accepted or c[1] is not self.expected or c[2].size < k:
            self._cache = c = (self.accepted, self.expected, self._factor(max(k, 32)))
        return c[2][:k]

    def _factor(self, k: int) -> np.ndarray:
        if COMPILED and kernels.floats(self.accepted, self.expected, self.first_acc, self.first_exp):
            f, ok = kernels.position_factors(k, self.accepted, self.expected, self.first_acc, self.first_exp,
                                             float(self.prior), float(self.optimism), bool(self.paired))
            if ok:   # the same operations, compiled
                return f
        f = np.ones(k)
        m = min(k, self.accepted.size)
        e, P = self.expected[:m], self.prior
        mean = (self.accepted[:m] + P) / (e + P)
        if self.paired and m > 1:
            sel = (self.first_acc[1:m] + P * mean[0]) / (self.first_exp[1:m] + P)   # prior: no selection
            mean[1:] = mean[1:] / sel * mean[0]
        if self.optimism:
            mean = np.minimum(mean + self.optimism * 0.5 * np.sqrt(e) / (e + P), np.maximum(mean, 1.0))
        f[:m] = mean
        return f

    def add(self, verified: np.ndarray, accepted: np.ndarray, estimate: np.ndarray,
            drafted: np.ndarray | None = None) -> None:
        """Tokens verified at each position (bool [rows, k]), which of them were accepted, the rows' estimates
        (and, paired, each row's drafted tokens)."""
        self._cache = None
        k = verified.shape[1]
        if self.accepted.size < k:
            self._grow(k)
        paired = self.paired and drafted is not None and k
        if COMPILED and verified.dtype == accepted.dtype == np.bool_ and verified.shape == accepted.shape \
                and kernels.floats(estimate, self.accepted, self.expected, self.first_acc, self.first_exp) \
                and estimate.size == verified.shape[0] and (not paired or drafted.shape == estimate.shape):
            kernels.position_sums(verified, accepted, estimate, drafted if paired else _NO_ROWS, bool(paired),
                                  self.accepted, self.expected, self.first_acc, self.first_exp)
            return   # the same sums in the same order, compiled
        self.accepted[:k] += (verified & accepted).sum(axis=0)
        self.expected[:k] += (verified * estimate[:, None]).sum(axis=0)
        if self.paired and drafted is not None and k:
            past = np.arange(k)[None, :] < drafted[:, None]   # row-steps drafted at least p + 1 deep
            self.first_acc[:k] += (past & (verified[:, :1] & accepted[:, :1])).sum(axis=0)
            self.first_exp[:k] += (past * estimate[:, None]).sum(axis=0)

    def add_counts(self, k: int, verified: np.ndarray, accepted: np.ndarray, estimate: np.ndarray,
                   drafted: np.ndarray | None = None) -> None:
        """`add` where row i verified positions 0..verified[i]-1 of k and accepted those below accepted[i] (the
        masks cols < verified[:, None] and cols < accepted[:, None], without building them)."""
        rows = verified.size
        if COMPILED and kernels.floats(estimate, self.accepted, self.expected, self.first_acc, self.first_exp) \
                and self.accepted.size >= k and verified.ndim == accepted.ndim == 1 \
                and accepted.size == estimate.size == rows and (drafted is None or drafted.size == rows):
            self._cache = None
            paired = self.paired and drafted is not None and k
            kernels.position_sums_counts(k, verified, accepted, estimate, drafted if paired else _NO_ROWS,
                                         bool(paired), self.accepted, self.expected, self.first_acc,
                                         self.first_exp)
            return
        cols = np.arange(k)[None, :]
        self.add(cols < verified[:, None], cols < accepted[:, None], estimate, drafted)

    def changed(self) -> None:
        """Drop the cached factors: for a caller that wrote the sums in place (`CostAwareDepth`'s compiled observe)."""
        self._cache = None

    def forget_add(self, keep: float, verified: np.ndarray, accepted: np.ndarray, estimate: np.ndarray,
                   drafted: np.ndarray | None = None) -> None:
        """`forget(keep)`, then `add(verified, accepted, estimate, drafted)`: the same sums, in one compiled call
        (`kernels.forget_add_sums`) where the sums already reach the masks' positions, which also refreshes the
        cached factors (`factor`'s, as many as it held, at least 32: each position's from its own sums)."""
        k = verified.shape[1]
        paired = self.paired and drafted is not None and k
        if COMPILED and self.accepted.size >= k and verified.dtype == accepted.dtype == np.bool_ \
                and verified.shape == accepted.shape and estimate.size == verified.shape[0] \
                and kernels.floats(estimate, self.accepted, self.expected, self.first_acc, self.first_exp) \
                and (not paired or drafted.shape == estimate.shape):
            kf = 32 if self._cache is None else max(self._cache[2].size, 32)
            f, ok = kernels.forget_add_sums(float(keep), verified, accepted, estimate, drafted if paired else _NO_ROWS,
                                            bool(paired), self.accepted, self.expected, self.first_acc,
                                            self.first_exp, kf, float(self.prior), float(self.optimism),
                                            bool(self.paired))
            self._cache = (self.accepted, self.expected, f) if ok else None
            return
        self.forget(keep)
        self.add(verified, accepted, estimate, drafted)

    def compiled_args(self, k: int):
        """The arguments a compiled `forget_add` over k positions passes its kernel after the masks and estimates
        (`kernels.evidence_observe`): (paired, the sums accepted, expected, first_acc and first_exp, grown to k
        positions, a buffer for the factors (`factor`'s cached count, at least 32), prior, optimism); None where the
        sums are not float64 vectors of one length (the numpy form decides). Then `refreshed` with the factors
        written (a new array each time: an array `factor` returned is never written again)."""
        if self.accepted.size < k:
            self._grow(k)
        a, kept = self.accepted, self._args   # (the sums and settings it last checked, and the arguments)
        if kept is None or kept[0] is not a or kept[1] is not self.expected or kept[2] is not self.first_acc or \
                kept[3] is not self.first_exp or kept[4] is not self.paired or kept[5] is not self.prior or \
                kept[6] is not self.optimism:   # (the same objects: the same values)
            e, fa, fe = self.expected, self.first_acc, self.first_exp
            if not (a.dtype == e.dtype == fa.dtype == fe.dtype == np.float64
                    and a.shape == e.shape == fa.shape == fe.shape):
                return None
            kept = self._args = (a, e, fa, fe, self.paired, self.prior, self.optimism,
                                 (bool(self.paired), a, e, fa, fe), (float(self.prior), float(self.optimism)))
        c = self._cache
        return (*kept[7], np.empty(32 if c is None else max(c[2].size, 32)), *kept[8])

    def refreshed(self, f) -> None:
        """After a compiled forget and add (`compiled_args`): `f`, the factors of the new sums (None: unknown)."""
        self._cache = None if f is None else (self.accepted, self.expected, f)

    def _grow(self, k: int) -> None:
        """The four sums extended with zeros to k positions."""
        grow = k - self.accepted.size
        self.accepted = np.concatenate([self.accepted, np.zeros(grow)])
        self.expected = np.concatenate([self.expected, np.zeros(grow)])
        self.first_acc = np.concatenate([self.first_acc, np.zeros(grow)])
        self.first_exp = np.concatenate([self.first_exp, np.zeros(grow)])

    def forget(self, keep: float) -> None:
        if COMPILED and kernels.floats(self.accepted, self.expected, self.first_acc, self.first_exp):
            kernels.scale4(self.accepted, self.expected, self.first_acc, self.first_exp, float(keep))
            self._cache = None
            return
        self.accepted *= keep
        self.expected *= keep
        self.first_acc *= keep
        self.first_exp *= keep
        self._cache = None


def shrunk_rates(accepted: np.ndarray, rejected: np.ndarray, level: np.ndarray) -> np.ndarray:
    """Per-row acceptance estimates for rows that may really differ: the batch's level (the mean of `level`,
    e.g. view.acceptance, the estimate the policy uses anyway) plus each row's own deviation from the pooled
    rate in its counts (accepted / (accepted + rejected)), shrunk by the empirical-Bayes factor
    tau^2 / (tau^2 + sigma_i^2): tau^2 the spread between rows beyond what the counts' binomial noise sigma_i^2
    explains (by two standard errors of the spread's estimate, which few rows make loose). Rows that differ
    only by chance (and a single row) all get the level."""
    if COMPILED and kernels.floats(accepted, rejected, level) and level.size and accepted.shape == rejected.shape:
        return kernels.shrunk(accepted, rejected, level)   # the same operations, compiled
    level = float(np.asarray(level).mean())
    n = accepted + rejected
    seen = n > 0
    if seen.sum() < 2:
        return np.full(n.shape, level)
    pooled = float(accepted[seen].sum() / n[seen].sum())
    rate = np.where(seen, accepted / np.maximum(n, 1.0), pooled)
    noise = pooled * (1.0 - pooled) / np.maximum(n, 1.0)
    m = int(seen.sum())   # the spread must exceed the noise by two standard errors of a variance of m rows
    tau2 = max(float(rate[seen].var() - noise[seen].mean() * (1.0 + 2.0 * math.sqrt(2.0 / (m - 1)))), 0.0)
    shrink = np.where(seen, tau2 / (tau2 + noise + 1e-12), 0.0)
    return _clip(level + shrink * (rate - pooled), 0.0, 0.999)


def tie_bands(a: np.ndarray, tol: float) -> np.ndarray:
    """Estimates that differ by less than a fraction `tol` count as one: from the highest down, a band holds the
    values within tol (relative) of its highest, and every row of it gets the band's mean. A ranking by the
    estimate then ties rows whose estimates differ by less than they can tell apart, and its tie-break (more
    tokens left first) spreads the drafts over them, instead of drafting the same rows every step for an offset
    of a few 1e-4 (rows with evidence vs rows still at the batch's prior). tol <= 0: `a` unchanged."""
    if tol <= 0.0 or a.size < 2:
        return a
    if COMPILED and kernels.floats(a):
        out, ok = kernels.tie_bands(a, float(tol))
        if ok:   # the same operations, compiled
            return out
    u, inv, cnt = np.unique(a, return_inverse=True, return_counts=True)
    if u.size == 1:
        return a
    band = kernels.bands(u, float(tol))   # from the highest value down (compiled: the same comparisons)
    mean = np.bincount(band, weights=u * cnt) / np.bincount(band, weights=cnt)
    return mean[band][inv]


def expected_tokens(acceptance, ks: np.ndarray, factors: np.ndarray | None = None,
                     trials: float | None = None) -> np.ndarray:
    """[len(ks), rows] expected tokens a step emits per row at depth k: 1 + sum over positions p < k of the
    probability that drafts 0..p all survive. `trials`: the acceptance a is an estimate worth that many drafted
    tokens (a Beta(a t, (1 - a) t) belief), and the draft at position p survives, given the p before it did,
    with the posterior predictive probability (a t + p) / (t + p) (the chain gives E[a^(p+1)], not a^(p+1): a
    draft whose first guesses were accepted is likelier to be a good one). Equal to the plain a as t grows."""
    if COMPILED and (factors is not None or trials is not None) and kernels.floats(acceptance) and ks.ndim == 1 \
            and ks.size and ks.dtype == np.int64 and (factors is None or (kernels.floats(factors)
                                                                          and factors.size >= ks[-1])):
        out, ok = kernels.survival_tokens(acceptance, ks, _NONE if factors is None else factors,
                                          factors is not None, 0.0 if trials is None else float(trials),
                                          trials is not None)   # the same operations, compiled
        if ok:
            return out
    a = _clip(np.asarray(acceptance, float), 0.0, 0.999)
    if factors is None and trials is None:
        return (1.0 - a[None, :] ** (ks[:, None] + 1)) / (1.0 - a[None, :])
    k = int(ks[-1])
    step = np.broadcast_to(a[None, :], (k, a.size))
    if trials is not None:
        p = np.arange(k, dtype=float)[:, None]
        step = (a[None, :] * trials + p) / (trials + p)
    if factors is not None:
        step = step * np.asarray(factors, float)[:k, None]
    survive = np.cumprod(np.minimum(step, 0.999), axis=0)
    return 1.0 + np.concatenate([np.zeros((1, a.size)), np.cumsum(survive, axis=0)])[ks]


_NONE = np.zeros(0)
_NO_ROWS = np.zeros(0, np.int64)


class ConfidenceCalibration:
    """What the draft's confidence c says about a token's acceptance, learnt online: Platt scaling,
    P(accepted | c) = sigmoid(a + b logit(c)), fitted to the verified drafts (accepted, and the rejection that
    ends a step; drafts after it were never verified) and shrunk toward the identity (a = 0, b = 1: a calibrated
    draft) by a ridge worth `prior` tokens. A draft may be under-confident (the shipped real pair: accepted 4.5-7
    times as often as its confidence says) or over-confident; a threshold on the raw confidence means a
    different acceptance for each. The tokens are kept as counts in `BINS` bins of logit(c) on [-LIM, LIM]
    (their centres stand for them) that forget with a memory of `memory` verified tokens; the fit is a few
    Newton steps from the last one, after each step that verified a draft.

        cal = ConfidenceCalibration(); cal.add(view.confidences, view.drafted, accepted); p = cal(c)
    """

    BINS, LIM = 28, 7.0

    def __init__(self, prior: float = 20.0, memory: float = 2000.0):
        self.prior = float(prior)
        self.memory = float(memory)
        w = 2.0 * self.LIM / self.BINS
        self.x = -self.LIM + w * (np.arange(self.BINS) + 0.5)
        self._xx = self.x * self.x
        self.n = np.zeros(self.BINS)   # verified tokens per bin (forgetting)
        self.acc = np.zeros(self.BINS)   # ... accepted
        self.a, self.b = 0.0, 1.0
        self._scratch, self._ok = np.empty((2, 0)), np.empty(0, bool)   # the compiled add's buffers
        self._work = np.empty((10, self.BINS))   # ... the fit's (kernels.conf_start), its rows N and ACC the counts
        self._work[kernels.X], self._work[kernels.XX] = self.x, self._xx
        self._counts = self._work[kernels.N], self._work[kernels.ACC]
        self._odds = np.empty((2, 0))   # the compiled odds' buffer
        self._rows = self._odds[0], self._odds[1]   # ... its rows

    @classmethod
    def logit(cls, c: np.ndarray) -> np.ndarray:
        c = _clip(c, 1e-6, 1.0 - 1e-6)
        z = np.log(c)
        z -= np.log1p(np.negative(c, out=c), out=c)
        return _clip(z, -cls.LIM, cls.LIM, out=z)

    def __call__(self, c: np.ndarray) -> np.ndarray:
        """The acceptance probability of tokens drafted with confidence c (NaN stays NaN)."""
        if COMPILED and c.dtype == np.float64 and c.ndim == 1:
            p = self.odds(c).copy()
            kernels.conf_sigmoid(p)   # 1 / (1 + odds)
            return p
        z = self.logit(c)
        z *= self.b
        z += self.a
        return _sigmoid(z, out=z)

    def odds(self, c: np.ndarray) -> np.ndarray:
        """exp(-(a + b logit(c))), the odds (1 - p) / p against acceptance of tokens drafted with confidence c (p =
        1 / (1 + odds) is __call__'s probability; NaN stays NaN). The array may be a buffer that the next call
        overwrites (compiled: the loops between numpy's log, log1p and exp, `kernels`)."""
        if COMPILED and c.dtype == np.float64 and c.ndim == 1:
            if self._odds.shape[1] != c.shape[0]:
                self._odds = np.empty((2, c.shape[0]))
                self._rows = self._odds[0], self._odds[1]
            lg, l1p = self._rows
            kernels.conf_clip(c, 1e-6, 1.0 - 1e-6, self._odds)
            np.log(lg, lg)
            np.log1p(l1p, l1p)
            if kernels.conf_affine(lg, l1p, self.LIM, self.a, self.b):
                with np.errstate(over="ignore"):
                    return np.exp(lg, lg)
            return np.exp(lg, lg)
        z = self.logit(c)
        z *= self.b
        z += self.a
        with np.errstate(over="ignore"):
            return np.exp(np.negative(z, out=z), out=z)

    def add(self, confidences: np.ndarray | None, drafted: np.ndarray, accepted: np.ndarray) -> None:
        """A step's verified drafts: row i's positions below min(drafted, accepted + 1), accepted below
        `accepted`. confidences: [rows, max depth] (view.confidences)."""
        if confidences is None:
            return
        if COMPILED and confidences.dtype == np.float64 and confidences.ndim == 2 \
                and drafted.shape == accepted.shape == confidences.shape[:1] and kernels.blas_dot_matches():
            self._compiled_add(confidences, drafted, accepted)   # (no verified draft: nothing gathered)
            return
        if not drafted.any():
            return
        cols = np.arange(confidences.shape[1])[None, :]
        seen = cols < np.minimum(drafted, accepted + 1)[:, None]
        c = confidences[seen]
        ok = ~np.isnan(c)
        if not ok.any():
            return
        at = np.minimum(((self.logit(c[ok]) + self.LIM) * (self.BINS / (2.0 * self.LIM))).astype(np.int64),
                        self.BINS - 1)
        keep = math.exp(-float(ok.sum()) / self.memory)
        self.n = self.n * keep + np.bincount(at, minlength=self.BINS)
        self.acc = self.acc * keep + np.bincount(at, (cols < accepted[:, None])[seen][ok], self.BINS)
        self._fit_numpy()

    def _compiled_add(self, confidences: np.ndarray, drafted: np.ndarray, accepted: np.ndarray) -> None:
        """add's operations, the loops around numpy's log and log1p compiled (`kernels`), then the fit; the counts
        are rows of the kept work array."""
        if self._scratch.shape[1] < confidences.size:
            self._scratch, self._ok = np.empty((2, confidences.size)), np.empty(confidences.size, bool)
        buf, ok = self._scratch, self._ok
        m = kernels.conf_gather(confidences, drafted, accepted, 1e-6, 1.0 - 1e-6, buf, ok)
        if not m:
            return
        lg, l1p = buf[0, :m], buf[1, :m]
        np.log(lg, lg)
        np.log1p(l1p, l1p)
        n, acc = self._counts
        if self.n is not n or self.acc is not acc:   # counts set from outside, or by the numpy form
            n[:], acc[:] = self.n, self.acc
            self.n, self.acc = n, acc
        start = kernels.conf_counts(lg, l1p, ok, math.exp(-float(m) / self.memory), self._work, self.LIM,
                                    self.BINS / (2.0 * self.LIM), self.a, self.b, self.prior / 8.0, 2.0)
        self._fit_compiled(self._work, start)

    def _fit_compiled(self, work: np.ndarray, start=None, steps: int = 4) -> None:
        """`_fit` (the same Newton steps and halvings) on a work array (`kernels.conf_start`; `start`: its
        (objective, overflow) where computed), each step one compiled loop around numpy's exp (in place on
        work[NZ]: conf_newton reads it before it writes there)."""
        lam, newton, exp = self.prior / 8.0, kernels.conf_newton, np.exp
        f, big = kernels.conf_start(work, self.x, self._xx, self.n, self.acc, self.a, self.b, lam, 2.0) \
            if start is None else start
        a, b, nz = self.a, self.b, work[kernels.NZ]
        for _ in range(steps):
            if big:
                with np.errstate(over="ignore"):
                    exp(nz, nz)
            else:
                exp(nz, nz)
            a, b, f, state, big = newton(nz, work, a, b, f, lam, 2.0)
            if state:
                if state < 0:
                    raise ZeroDivisionError("float division by zero")
                break
        self.a, self.b = a, b

    def _fit(self, steps: int = 4) -> None:
        """The fit (`_fit_numpy`; compiled where `COMPILED`, the same operations)."""
        if COMPILED and kernels.blas_dot_matches() and self.n.dtype == self.acc.dtype == np.float64:
            self._fit_compiled(self._work, None, steps)
        else:
            self._fit_numpy(steps)

    def _fit_numpy(self, steps: int = 4) -> None:
        """Newton on the ridge-penalised log-likelihood (penalty prior/8 x ((a)^2 + (b - 1)^2): Fisher
        information of `prior` tokens at p = 1/2 spread over the scale's both parameters), each step halved
        until the objective does not fall. A full step from a fit of nearly separated tokens (all rejected below
        some confidence, all accepted above) can overshoot to where the sigmoid saturates, where plain Newton runs
        away to a step function of the confidence."""
        lam = self.prior / 8.0
        a, b, x, xx, n, acc = self.a, self.b, self.x, self._xx, self.n, self.acc
        rej = n - acc

        def objective(a, b):
            z = a + b * x
            return float(acc @ -np.logaddexp(0.0, -z) + rej @ -np.logaddexp(0.0, z)) \
                - 0.5 * lam * (a * a + (b - 1.0) ** 2)

        f = objective(a, b)
        for _ in range(steps):
            p = _sigmoid(a + b * x)
            r = acc - n * p
            w = n * p * (1.0 - p)
            g0, g1 = float(r.sum()) - lam * a, float(r @ x) - lam * (b - 1.0)
            h00, h01, h11 = float(w.sum()) + lam, float(w @ x), float(w @ xx) + lam
            det = h00 * h11 - h01 * h01
            da, db = (h11 * g0 - h01 * g1) / det, (h00 * g1 - h01 * g0) / det
            for _ in range(30):   # concave objective: a short enough step along the Newton direction gains
                f_new = objective(a + da, b + db)
                if f_new >= f - 1e-12 * abs(f):
                    break
                da, db = 0.5 * da, 0.5 * db
            a, b, f = a + da, b + db, f_new
            if abs(da) + abs(db) < 1e-6:
                break
        self.a, self.b = a, b


def _sigmoid(z: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """1 / (1 + exp(-z)); exp's overflow for z below about -709 is the exact limit 0, not a warning. `out` (z
    itself, say): the same operations written there."""
    with np.errstate(over="ignore"):
        if out is None:
            return 1.0 / (1.0 + np.exp(-z))
        e = np.exp(np.negative(z, out=out), out=out)
        e += 1.0
        return np.divide(1.0, e, out=e)
