"""goodput's evidence: the batch-wide decayed sums its estimates rest on, and each row's acceptance estimate."""
from __future__ import annotations

import functools
import math
from types import SimpleNamespace

import numpy as np

from .kit import PositionFactors, draft_caps, kernels, search, tie_bands
from .kit.kernels import _F64, _I64

MIXTURE_PRIOR = ((0.9, 0.3), (0.1, 1.5))   # (weight, sd of log c) of each normal of _Pool._mixture's prior
_MIX_GRID = np.linspace(-5.0, 5.0, 201)   # log c
_MIX_EXP = np.exp(_MIX_GRID)
_MIX_LOGPRIOR = np.log(sum(w / s * np.exp(-0.5 * (_MIX_GRID / s) ** 2) for w, s in MIXTURE_PRIOR))


class Evidence:
    """Batch-wide decayed sums: accepted drafts, rejections, the drafts' confidence sum and count, and the accepted
    drafts / confidence sum over verified tokens (the draft's calibration). `accepted`, `rejected`, `conf_sum` None:
    the rate starts at view.acceptance_prior worth `drafted` tokens, at the first plan (`start`). The calibration
    starts from `cal_accepted` / `cal_conf` (evidence, or a prior at confidence 1) and `cal_tokens` pseudo verified
    tokens at the verified drafts' mean confidence; `mixture`: the calibration is `_mixture`'s posterior median.
    Per draft position, the factor that corrects a row's estimate there (`kit.PositionFactors`). Also the run's
    probe steps (`probes`) and the mean depth of the rows drafted last step (`dbar`, None before any)."""

    def __init__(self, position_prior=20.0, position_optimism=2.0, position_paired=False, accepted=7.0, rejected=3.0,
                 conf_sum=7.0, drafted=10.0, cal_accepted=1.0, cal_conf=1.0, cal_tokens=0.0, mixture=False):
        self.accepted, self.rejected, self.conf_sum, self.drafted = accepted, rejected, conf_sum, drafted
        self.mixture = mixture
        self._mix = None   # its last (accepted, confidence) sums and value
        self.cal_accepted, self.cal_conf = cal_accepted, cal_conf
        self.verified = cal_conf + cal_tokens   # verified draft tokens (the calibration's prior counted as tokens)
        self._pw = cal_tokens   # the pseudo-tokens' weight (forgotten as the sums are)
        self._vc = self._vn = 0.0   # the verified drafts' confidence sum and count (for their mean)
        self.positions = PositionFactors(position_prior, position_optimism, position_paired)
        self.probes = 0
        self.dbar = None
        self._exp_table = None   # (memory, np.exp(-d / memory) at d = 0, 1, ...: `_exps`)
        self._cols = (None, None)   # (the per-request table's fields, their `_columns`)

    def probed(self, drafted: bool) -> None:
        """Count a probe step (one that drafted)."""
        self.probes += int(drafted)

    def start(self, rate: float) -> None:
        """The rate's prior, where the sums start from it: `rate` worth `drafted` tokens."""
        if self.accepted is None:
            d = self.drafted
            self.accepted, self.rejected, self.conf_sum = d * rate, d - d * rate, d * rate

    @property
    def _pseudo(self) -> float:
        """The pseudo-tokens' confidence mass (and accepted drafts): their weight x the verified mean confidence."""
        return self._pw * self._vc / self._vn if self._vn > 0.0 else 0.0

    @property
    def calibration(self) -> float:
        if self.mixture:
            return self._mixture()
        m = self._pseudo
        return (self.cal_accepted + m) / (self.cal_conf + m) if self.cal_conf + m > 0.0 else 1.0

    def _mixture(self) -> float:
        """The posterior median of the draft's calibration c (accepted = c x confidence) from the verified drafts'
        accepted and confidence sums (A, E; Poisson likelihood c^A e^(-c E)), under a prior on log c that is a
        mixture (MIXTURE_PRIOR): 0.9 N(0, 0.3^2), a draft calibrated within about a third, and 0.1 N(0, 1.5^2), one
        off by any factor up to ~20. The median, not the mean (the wide part lifts the prior's mean of c to 1.24).
        Little evidence stays near 1 whatever the confidences' scale; strong evidence far from 1 wins."""
        A, E = self.cal_accepted, self.cal_conf
        if self._mix is not None and self._mix[0] == A and self._mix[1] == E:
            return self._mix[2]
        if search.COMPILED:   # the same operations, compiled around numpy's exp
            w = kernels.mixture_log(float(A), float(E), _MIX_GRID, _MIX_EXP, _MIX_LOGPRIOR)
            np.exp(w, out=w)
            lc, ok = kernels.mixture_median(w, _MIX_GRID)
            if ok:
                self._mix = (A, E, math.exp(lc))
                return self._mix[2]
        ll = _MIX_LOGPRIOR + A * _MIX_GRID - E * _MIX_EXP
        w = np.exp(ll - ll.max())
        cdf = np.cumsum(w) - 0.5 * w   # at the grid points (each holds half its own mass)
        c = math.exp(float(np.interp(0.5 * float(w.sum()), cdf, _MIX_GRID)))
        self._mix = (A, E, c)
        return c

    def calibrations(self, rows, z: float) -> np.ndarray:
        """`row_calibration(rows, self.calibration, z)`; where the mixture's median is due (its sums changed) and
        the rows' spread is judged, compiled in one call with it (`kernels.mixture_rows`: the same operations)."""
        A, E = self.cal_accepted, self.cal_conf
        if self.mixture and search.COMPILED and z and len(rows) >= 2 and (
                self._mix is None or not (self._mix[0] == A and self._mix[1] == E)):
            w = kernels.mixture_log(float(A), float(E), _MIX_GRID, _MIX_EXP, _MIX_LOGPRIOR)
            np.exp(w, out=w)
            c, out, ok = kernels.mixture_rows(w, _MIX_GRID, rows.accepted, rows.verified_conf, rows.verified,
                                              float(z))
            if ok:
                self._mix = (A, E, c)
                return out
        return row_calibration(rows, self.calibration, z)

    def evidence(self) -> tuple[float, float]:
        """(accepted, verified) drafts the calibration rests on, its prior's included (the pseudo-tokens accepted
        at their confidence; before any draft is verified, at 1)."""
        return self.cal_accepted + (self._pseudo if self._vn > 0.0 else self._pw), self.verified

    def add(self, keep: float, accepted, rejected, conf_sum, drafted, verified_conf, verified) -> None:
        """Forget (multiply every sum by `keep`), then add one step's counts."""
        self._add_counts(keep, accepted, rejected, conf_sum, drafted, verified_conf, verified)
        self.positions.forget(keep)

    def _add_counts(self, keep: float, accepted, rejected, conf_sum, drafted, verified_conf, verified) -> None:
        """`add`'s batch-wide sums (the position factors' left to the caller)."""
        self.accepted = self.accepted * keep + accepted
        self.rejected = self.rejected * keep + rejected
        self.conf_sum = self.conf_sum * keep + conf_sum
        self.drafted = self.drafted * keep + drafted
        self.cal_accepted = self.cal_accepted * keep + accepted
        self.cal_conf = self.cal_conf * keep + verified_conf
        self.verified = self.verified * keep + verified
        self._pw *= keep
        self._vc = self._vc * keep + verified_conf
        self._vn = self._vn * keep + verified

    def observe(self, view, accepted: np.ndarray, rows, estimate: np.ndarray, memory: float, drafted=None,
                only_drafted: bool = False) -> None:
        """A verified step's counts: into each row's sums (`rows`, goodput's PerRequest fields) and, forgetting with
        a memory of `memory` drafted tokens, the batch's, and the position factors (at the rows' `estimate`).
        `drafted`: view.drafted, where the caller read it; `only_drafted`: a step no row drafted in is not
        observed. Compiled where the step drafted at any position: one pass (`kernels.evidence_observe`: the
        counts, the forget and the position factors' sums and factors; np.exp(-drafted sum / memory) tabulated:
        `_exps`), else `_observe_counts`."""
        drafted, conf = view.drafted if drafted is None else drafted, view.confidences
        k = 0 if conf is None else conf.shape[1]
        if not (search.COMPILED and (accepted.dtype is _I64 or accepted.dtype == np.int64) and
                (drafted.dtype is _I64 or drafted.dtype == np.int64) and
                (conf is None or conf.dtype is _F64 or conf.dtype == float)):
            return self._observe_numpy(view, drafted, accepted, conf, rows, estimate, memory, only_drafted)
        args = self.positions.compiled_args(k) if k and (estimate.dtype is _F64 or estimate.dtype == np.float64) \
            and estimate.ndim == 1 else None   # (paired, the four sums, a factors buffer, prior, optimism)
        if args is not None:
            e, fields = self._exp_table, rows.fields
            exps = e[1] if e is not None and e[0] == memory and e[1].size > drafted.size * k else \
                self._exps(memory, drafted.size * k)
            if fields is not self._cols[0]:   # (`_columns`, kept while the table's fields hold)
                self._cols = (fields, _columns(fields))
            status, keep, a, r, c, d, vc, v, dbar, ok = kernels.evidence_observe(
                drafted, accepted, conf, rows.array, self._cols[1], exps, estimate, *args)
            if status == 0:   # `_add_counts(keep, a, r, c, d, vc, v)` (keep: np.exp's value as a float)
                self.dbar = dbar
                self.accepted, self.rejected = self.accepted * keep + a, self.rejected * keep + r
                self.conf_sum, self.drafted = self.conf_sum * keep + c, self.drafted * keep + d
                self.cal_accepted, self.cal_conf = self.cal_accepted * keep + a, self.cal_conf * keep + vc
                self.verified, self._pw = self.verified * keep + v, self._pw * keep
                self._vc, self._vn = self._vc * keep + vc, self._vn * keep + v
                return self.positions.refreshed(args[5] if ok else None)
            if status == 2 and only_drafted:
                return
        self._observe_counts(drafted, accepted, conf, k, rows, estimate, memory, only_drafted)

    def _observe_numpy(self, view, drafted, accepted, conf, rows, estimate, memory, only_drafted) -> None:
        """`observe` in numpy."""
        if only_drafted and not drafted.any():
            return
        rej = (accepted < drafted).astype(float)
        ver = np.minimum(drafted, accepted + 1)   # verified drafts: the accepted ones and the first rejected
        if conf is not None and conf.shape[1]:
            cols = np.arange(conf.shape[1])[None, :]
            c = np.where(np.isnan(conf), 0.0, conf)
            csum = (c * (cols < drafted[:, None])).sum(axis=1)
            verified = cols < ver[:, None]
            vrow = (c * verified).sum(axis=1)
            vconf = float(vrow.sum())
        else:
            csum = vrow = np.zeros(view.batch_size)
            vconf = 0.0
        self.dbar = float(drafted[drafted > 0].mean())
        rows.accepted += accepted
        rows.rejected += rej
        rows.conf_sum += csum
        rows.drafted += drafted
        rows.verified_conf += vrow
        rows.verified += ver
        self.add(np.exp(-float(drafted.sum()) / memory), accepted.sum(), rej.sum(), csum.sum(), drafted.sum(), vconf,
                 ver.sum())
        if conf is not None and conf.shape[1]:
            self.positions.add(verified, cols < accepted[:, None], estimate, drafted)

    def _observe_counts(self, drafted, accepted, conf, k, rows, estimate, memory, only_drafted) -> None:
        """`observe`'s compiled form where its one pass does not apply: the counts from one compiled call
        (`kernels.evidence_counts`, the same sums), then the forget and the position factors' sums."""
        if only_drafted and not drafted.any():
            return
        verified, acc_mask, *sums, self.dbar = kernels.evidence_counts(
            drafted, accepted, conf if k else np.zeros((drafted.size, 0)), rows.array, _columns(rows.fields))
        keep = np.exp(-float(sums[3]) / memory)
        if not k:
            return self.add(keep, *sums)
        self._add_counts(keep, *sums)
        self.positions.forget_add(keep, verified, acc_mask, estimate, drafted)   # (forget, then add: one call)

    def _exps(self, memory: float, top: int) -> np.ndarray:
        """np.exp(-d / memory) at d = 0..top at least (numpy's exp, elementwise: each the value observe's
        np.exp(-float(d) / memory) gives), kept while `memory` holds."""
        e = self._exp_table
        if e is None or e[0] != memory or e[1].size <= top:
            size = max(top + 1, 2 * (0 if e is None or e[0] != memory else e[1].size))
            e = self._exp_table = (memory, np.exp(-np.arange(size, dtype=float) / memory))
        return e[1]


_FIELDS = ("accepted", "rejected", "conf_sum", "drafted", "verified_conf", "verified")


@functools.lru_cache(maxsize=8)
def _columns(fields: tuple) -> np.ndarray:
    """The per-request table's columns of `_FIELDS` (Evidence.observe's sums, in its order)."""
    return np.array([fields.index(f) for f in _FIELDS], np.int64)


def row_calibration(rows, cal: float, z: float) -> np.ndarray:
    """The draft's calibration (accepted / confidence over verified tokens) per row: the batch-wide `cal`, unless
    the rows' outcomes spread more than one calibration explains (by `z` standard errors; 0 = never): then each
    row's own, shrunk toward `cal` by its precision (method of moments: the between-row variance is the spread of
    accepted - expected beyond its binomial variance). A draft can be confident and wrong on one prompt and right
    on another."""
    if not z or len(rows) < 2:
        return np.full(len(rows), cal)
    if search.COMPILED:   # the same operations, compiled
        return kernels.row_calibration(rows.accepted, rows.verified_conf, rows.verified, float(cal), float(z))
    out = np.full(len(rows), cal)
    acc, vc, ver = rows.accepted, rows.verified_conf, rows.verified
    at = np.flatnonzero((ver > 0) & (vc > 0))
    if at.size < 2:
        return out
    acc, vc, ver = acc[at], vc[at], ver[at]
    e = cal * vc
    var = np.maximum(e * (1.0 - np.minimum(e / ver, 1.0)), 0.25)   # binomial, at least a quarter token
    excess = float(((acc - e) ** 2).sum() - var.sum())
    if excess <= z * math.sqrt(2.0 * float((var * var).sum())):
        return out
    tau2 = excess / float((vc * vc).sum())
    w = tau2 * vc * vc / (tau2 * vc * vc + var)
    out[at] = np.maximum(cal + w * (acc / vc - cal), 0.0)
    return out


def row_estimates(rows, pool: Evidence, cal: np.ndarray, estimator: str, k: float, tol: float) -> np.ndarray:
    """Each row's acceptance estimate: `counts`, accepted / (accepted + rejections), or `confidence`, the mean of
    its drafts' confidences times its calibration `cal`; either shrunk toward the batch's with `k` pseudo-trials,
    rounded to 1e-4 (rows with the same evidence tie exactly) and tied within `tol` (`kit.tie_bands`)."""
    counts = estimator == "counts"
    if counts:
        base = pool.accepted / (pool.accepted + pool.rejected)
        num, den, cap = rows.accepted, rows.rejected, 0.0
    else:
        base = pool.conf_sum / pool.drafted
        num, den, cap = rows.conf_sum, rows.drafted, 1 / max(base, 1e-6)
    if search.COMPILED:   # the same operations, compiled (NaN: the numpy form's unique)
        a, ok = kernels.row_estimates(num, den, cal, k * base, k, cap, not counts, float(tol))
        if ok:
            return a
    a = (num + k * base) / (num + den + k) if counts else (num + k * base) / (den + k) * np.minimum(cal, cap)
    return tie_bands(np.round(np.clip(a, 1e-3, 0.999), 4), tol)


class Kept:
    """The arrays `estimates` writes each step (a, cal, slot weights and `time_weights`' spread: the rows of `vec`;
    survivals S0 and S: of `SS`; row caps; the mixture's posterior on its grid, `w`: row 3 of `mix`, whose rows 0-2
    hold the grid, its exp and the log prior) and `time_weights` its chances and weights (`weights`), kept while
    the batch's shape (n rows, K positions) holds, the namespace that holds the estimates (`est`), and the compiled
    call's columns and constants (`cols`, `consts`), kept while `key` holds."""

    __slots__ = ("n", "K", "a", "cal", "S0", "S", "rowcap", "slot", "w", "est", "spread", "weights", "vec", "SS",
                 "mix", "key", "cols", "consts", "two")

    def __init__(self, n: int, K: int):
        self.n, self.K = n, K
        self.vec, self.SS = np.empty((5, n)), np.empty((2, n, K))
        self.a, self.cal, self.slot, self.S0, self.S = self.vec[0], self.vec[1], self.vec[2], self.SS[0], self.SS[1]
        self.rowcap, self.mix = np.empty(n, np.int64), np.empty((4, _MIX_GRID.size))
        self.mix[:3], self.w = (_MIX_GRID, _MIX_EXP, _MIX_LOGPRIOR), self.mix[3]
        self.spread = (self.vec[3], self.vec[4])
        self.weights = (np.empty(n), np.empty(n))   # time_weights' chances and weights (`out`)
        self.est = SimpleNamespace(a=self.a, cal=self.cal, S0=self.S0, S=self.S, rowcap=self.rowcap,
                                   slot=self.slot if n >= 2 else None, spread=None)
        self.key = self.cols = self.consts = self.two = None   # two: `goodput_gates.plan_extend`'s depths buffers


def estimates(pool: Evidence, rows, f: np.ndarray, remaining: np.ndarray, K: int, z: float, estimator: str,
              k: float, tol: float, kept: Kept, spread: bool = False) -> bool:
    """`row_estimates(rows, pool, pool.calibrations(rows, z), estimator, k, tol)`, `survivals(a, f, ...)` and
    `goodput_weights.slot_weights(S0, pool.dbar)` in one compiled call (`kernels.goodput_estimates`: the same
    operations) into `kept` (a, cal, S0, S, rowcap, slot; `spread`: and `time_weights`' spread of S, its e and
    exponent, set as kept.est.spread). Returns whether it ran (else the caller runs those functions: NaN, or
    arrays the kernel does not take)."""
    t = rows.array
    tf, ff, ri = t.dtype, f.dtype, remaining.dtype
    if not (search.COMPILED and t.ndim == 2 and kept.a.shape == remaining.shape == t.shape[:1] and kept.K == K
            and f.shape[0] >= K and ((tf is _F64 and ff is _F64 and ri is _I64)
                                     or (tf == ff == np.float64 and ri == np.int64))):
        return False
    key = (rows.fields, estimator, z, k, tol)
    if kept.key != key:   # (the columns and constants: per run)
        kept.cols = _estimate_columns(rows.fields, estimator == "counts")
        kept.consts = np.array([z, k, tol, k, 0.0 if estimator == "counts" else 1.0], float)
        kept.key = key
    A, E, mix = pool.cal_accepted, pool.cal_conf, pool._mix
    due = pool.mixture and (mix is None or not (mix[0] == A and mix[1] == E))
    if due:   # the mixture's posterior on its grid, exp'd by numpy (`Evidence._mixture`)
        kernels.mixture_log_into(float(A), float(E), kept.mix)
        np.exp(kept.w, out=kept.w)
    d = pool.dbar
    d = K if d is None or d >= K else d   # (slot_weights' depth: min(dbar, K); K where equal, the same parts)
    c = 0.0 if due else mix[2] if pool.mixture else float(pool.calibration)   # (mixture: `_mixture`'s, kept)
    num, den = (pool.accepted, pool.rejected) if estimator == "counts" else (pool.conf_sum, pool.drafted)
    c, ok = kernels.goodput_estimates(kept.mix, due, c, t, kept.cols, kept.consts, float(num), float(den),
                                      f, remaining, K, int(d), float(d - int(d)), kept.vec, kept.SS, kept.rowcap,
                                      spread)
    if ok and due:
        pool._mix = (A, E, c)
    kept.est.spread = kept.spread if spread else None
    return ok


def estimate(view, pool: Evidence, rows, K: int, est, estimator: str, kept: Kept, by_time: bool, alpha=None):
    """Each row's calibration (`Evidence.calibrations`), acceptance estimate (`row_estimates` with the `estimate`
    node `est`; `alpha(rows, cal)` where given) and slot survivals with its cap (`survivals`). Compiled (`estimates`,
    no `alpha`): one call into `kept`'s arrays, with the slot weights and, `by_time`, time_weights' spread; else the
    blocks one by one. Returns a namespace of a, cal, S0, S, rowcap, rem, f, slot and spread (None: not computed)."""
    if pool.accepted is None:   # (the rate's prior, at the first plan: `Evidence.start`)
        pool.start(view.acceptance_prior)
    rem, f = view.remaining, pool.positions.factor(K)
    if alpha is None and estimates(pool, rows, f, rem, K, est.row_calibration, estimator, est.prior_strength,
                                   est.tie_tolerance, kept, by_time):
        out = kept.est
        out.rem, out.f = rem, f
        return out
    cal = pool.calibrations(rows, est.row_calibration)
    a = alpha(rows, cal) if alpha else row_estimates(rows, pool, cal, estimator, est.prior_strength, est.tie_tolerance)
    S0, S, rowcap = survivals(a, f, view, K, rem)
    return SimpleNamespace(a=a, cal=cal, S0=S0, S=S, rowcap=rowcap, rem=rem, f=f, slot=None, spread=None)


@functools.lru_cache(maxsize=8)
def _estimate_columns(fields: tuple, counts: bool) -> np.ndarray:
    """The per-request table's columns `kernels.goodput_estimates` reads: accepted, verified_conf, verified, then
    the estimate's numerator and denominator (accepted and rejected, or conf_sum and drafted), drafted."""
    names = ("accepted", "verified_conf", "verified") + (("accepted", "rejected") if counts else ("conf_sum",
                                                                                                   "drafted"))
    names += ("drafted",)
    return np.array([fields.index(f) for f in names], np.int64)


def survivals(a: np.ndarray, f: np.ndarray, view, K: int, remaining: np.ndarray):
    """Each row's slot survivals: slot p survives with prod over q <= p of min(a_i f_q, 0.999) (S0), and S, the
    same with 0 past the row's cap (`kit.draft_caps`; `remaining`: view.remaining). Returns (S0, S, the caps)."""
    if search.COMPILED and a.dtype == f.dtype == np.float64 and remaining.dtype == np.int64:
        return kernels.survivals(a, f, remaining, K)   # the same operations, compiled
    rowcap = draft_caps(view, K)
    S0 = np.cumprod(np.minimum(a[:, None] * f, 0.999), axis=1)
    return S0, np.where(np.arange(K)[None, :] >= rowcap[:, None], 0.0, S0), rowcap
