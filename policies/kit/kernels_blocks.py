"""Compiled loops of the kit's per-step blocks (numba, cached on disk): the confidence calibration's binning and
Newton fit, and the confidence-to-acceptance map. Each computes what the numpy code it replaces computed: the
same IEEE operations in the same order (no fused or reordered arithmetic except where numpy's own kernel fuses:
`_ddot`), numpy's pairwise order for a contiguous sum (`_pairwise`), and libm's scalar functions where numpy
calls them (np.logaddexp's exp and log1p; Python's float power). numpy's vectorised transcendentals (np.exp,
np.log, np.log1p on arrays) are not computed here: their callers keep them as numpy calls between the loops.
`blas_dot_matches()` says whether `_ddot` reproduces this machine's BLAS dot; where it does not, the callers
keep their numpy form. Kernels standing for numpy arithmetic divide as numpy does (error_model="numpy": x / 0 is
inf or NaN, not an exception; numpy's warning is not raised)."""
from __future__ import annotations

import functools
import math

import numpy as np
from numba import njit, types
from numba.core.extending import intrinsic

from .kernels import bands

LOG2 = 0.693147180559945309417232121458176568   # numpy's NPY_LOGE2
OVERFLOW = 709.0   # np.exp of a larger argument may overflow (to inf, with a warning numpy's callers silence)


@intrinsic
def _fma(typingctx, a, b, c):
    """A correctly rounded fused multiply-add (llvm.fma), as the BLAS dot kernel's vfmadd computes it."""
    sig = types.float64(types.float64, types.float64, types.float64)

    def codegen(context, builder, signature, args):
        return builder.fma(*args)

    return sig, codegen


@njit(cache=True, nogil=True, inline="always")
def _lane(x, y, n32, n1, q, lane):
    """One of `_ddot`'s 16 accumulators (q, lane): its two 512-bit halves' FMA chains over the blocks of 32, added,
    then its FMA chain over the blocks of 16 (each accumulator sees its own elements only)."""
    lo, hi = 0.0, 0.0
    for i in range(0, n32, 32):
        lo = _fma(x[i + 8 * q + lane], y[i + 8 * q + lane], lo)
        hi = _fma(x[i + 8 * q + lane + 4], y[i + 8 * q + lane + 4], hi)
    acc = lo + hi
    for i in range(n32, n1, 16):
        acc = _fma(x[i + 4 * q + lane], y[i + 4 * q + lane], acc)
    return acc


@njit(cache=True, nogil=True)
def _ddot(x, y):
    """`x @ y` of two contiguous float64 vectors as numpy computes it (0.0 + OpenBLAS's SkylakeX ddot): 16 at a
    time into 4 x 4 FMA accumulators (32 at a time into 4 x 8 first, folded to 4 x 4), those summed per lane in
    order, the lanes as (0 + 2) + (1 + 3), then the rest (n mod 16) one FMA each."""
    n = x.shape[0]
    n1 = n & -16
    dot = 0.0
    if n1:
        n32 = n1 & -32
        v0 = ((_lane(x, y, n32, n1, 0, 0) + _lane(x, y, n32, n1, 1, 0)) + _lane(x, y, n32, n1, 2, 0)) \
            + _lane(x, y, n32, n1, 3, 0)
        v1 = ((_lane(x, y, n32, n1, 0, 1) + _lane(x, y, n32, n1, 1, 1)) + _lane(x, y, n32, n1, 2, 1)) \
            + _lane(x, y, n32, n1, 3, 1)
        v2 = ((_lane(x, y, n32, n1, 0, 2) + _lane(x, y, n32, n1, 1, 2)) + _lane(x, y, n32, n1, 2, 2)) \
            + _lane(x, y, n32, n1, 3, 2)
        v3 = ((_lane(x, y, n32, n1, 0, 3) + _lane(x, y, n32, n1, 1, 3)) + _lane(x, y, n32, n1, 2, 3)) \
            + _lane(x, y, n32, n1, 3, 3)
        dot = (v0 + v2) + (v1 + v3)
    for i in range(n1, n):
        dot = _fma(y[i], x[i], dot)
    return 0.0 + dot


@njit(cache=True, nogil=True, inline="always")
def _column(a, lo, j, end):
    """Accumulator j of numpy's 8: a[lo + j] + a[lo + 8 + j] + ... (below lo + end), in order."""
    r = a[lo + j]
    for i in range(8, end, 8):
        r += a[lo + i + j]
    return r


@njit(cache=True, nogil=True)
def _block(a, lo, n):
    """numpy's pairwise sum of a[lo:lo + n] for n <= 128: below 8 values one by one, else 8 accumulators."""
    if n < 8:
        res = 0.0
        for i in range(lo, lo + n):
            res += a[i]
        return res
    end = n - n % 8
    res = ((_column(a, lo, 0, end) + _column(a, lo, 1, end)) + (_column(a, lo, 2, end) + _column(a, lo, 3, end))) \
        + ((_column(a, lo, 4, end) + _column(a, lo, 5, end)) + (_column(a, lo, 6, end) + _column(a, lo, 7, end)))
    for i in range(end, n):
        res += a[lo + i]
    return res


@njit(cache=True, nogil=True)
def _pairwise(a, lo, n):
    """numpy's pairwise sum of a[lo:lo + n] (contiguous float64): `_block` up to 128 values, above that the
    sum of both halves (split at a multiple of 8), evaluated with an explicit stack (numba's disk cache does
    not keep recursive functions)."""
    if n <= 128:
        return _block(a, lo, n)
    los, ns, stage = np.empty(64, np.int64), np.empty(64, np.int64), np.zeros(64, np.int64)
    vals = np.empty(64)
    top, nv = 0, 0
    los[0], ns[0] = lo, n
    while top >= 0:
        m = ns[top]
        half = m // 2 - (m // 2) % 8
        if m <= 128:
            vals[nv] = _block(a, los[top], m)
            nv += 1
            top -= 1
        elif stage[top] == 0:
            stage[top] = 1
            los[top + 1], ns[top + 1], stage[top + 1] = los[top], half, 0
            top += 1
        elif stage[top] == 1:
            stage[top] = 2
            los[top + 1], ns[top + 1], stage[top + 1] = los[top] + half, m - half, 0
            top += 1
        else:
            vals[nv - 2] = vals[nv - 2] + vals[nv - 1]
            nv -= 1
            top -= 1
    return vals[0]


@njit(cache=True, nogil=True)
def _sum(a):
    """`a.sum()` of a contiguous float64 vector (numpy's add.reduce: 0.0 + the pairwise sum)."""
    return 0.0 + _pairwise(a, 0, a.shape[0])


@njit(cache=True, nogil=True)
def _logaddexp(x, y):
    """numpy's npy_logaddexp (libm's exp and log1p)."""
    if x == y:
        return x + LOG2
    tmp = x - y
    if tmp > 0:
        return x + math.log1p(math.exp(-tmp))
    if tmp <= 0:
        return y + math.log1p(math.exp(tmp))
    return tmp


@njit(cache=True, nogil=True)
def _neg_softplus_pair(z):
    """(-np.logaddexp(0.0, -z), -np.logaddexp(0.0, z)) with one exp and one log1p: both branches of
    npy_logaddexp take log1p(exp(-|z|)) (0 - (-z) is z exactly), the one at z > 0 adds it to 0 and z, at z < 0
    to -z and 0; z == 0 (either sign) is log 2 for both, NaN stays NaN."""
    if z == 0.0:
        return -(0.0 + LOG2), -(0.0 + LOG2)
    if z > 0.0:
        q = math.log1p(math.exp(-z))
        return -(0.0 + q), -(z + q)
    if z < 0.0:
        q = math.log1p(math.exp(z))
        return -(-z + q), -(0.0 + q)
    return -z, -z


@njit(cache=True, nogil=True)
def _clip(v, lo, hi):
    """numpy's clip of one float: lo below lo, hi above hi, else v itself (NaN stays NaN, -0.0 at lo = 0.0 stays
    -0.0: numpy keeps v where it is not strictly beyond a bound)."""
    if v != v:
        return v
    return hi if v > hi else (lo if v < lo else v)


@njit(cache=True, nogil=True)
def clip(a, lo, hi, out):
    """out = np.clip(a, lo, hi), for tests."""
    for i in range(a.shape[0]):
        out[i] = _clip(a[i], lo, hi)
    return out


@njit(cache=True, nogil=True)
def dot(x, y):
    """`x @ y` (`_ddot`), for tests."""
    return _ddot(x, y)


@njit(cache=True, nogil=True)
def vsum(a):
    """`a.sum()` (`_sum`), for tests."""
    return _sum(a)


@njit(cache=True, nogil=True)
def logaddexp0(z, out):
    """out = np.logaddexp(0.0, z), for tests."""
    for i in range(z.shape[0]):
        out[i] = _logaddexp(0.0, z[i])
    return out


@njit(cache=True, nogil=True)
def neg_softplus_pairs(z, t1, t2):
    """`_neg_softplus_pair` over z into t1, t2, for tests."""
    for i in range(z.shape[0]):
        t1[i], t2[i] = _neg_softplus_pair(z[i])


@njit(cache=True, nogil=True)
def power(v, e):
    """Python's float power v ** e (libm's pow), for tests."""
    return v ** e


@functools.lru_cache(maxsize=1)
def blas_dot_matches() -> bool:
    """Whether `_ddot` equals this machine's `x @ y` bit for bit on random vectors (lengths 1 to 80)."""
    rng = np.random.default_rng(47)
    for n in list(range(1, 81)) * 4:
        x, y = rng.normal(size=n) * 10.0 ** rng.integers(-3, 4, n), rng.normal(size=n)
        if _ddot(x, y) != float(x @ y):
            return False
    return True


# ---- ConfidenceCalibration (kit.acceptance) ------------------------------------------------------------------


@njit(cache=True, nogil=True)
def conf_gather(conf, drafted, accepted, lo, hi, buf, ok):
    """`ConfidenceCalibration.add`'s verified confidences (row by row: positions below min(drafted, accepted +
    1), NaN left out) clipped to [lo, hi] into buf[0] and negated into buf[1], whether each was accepted into ok;
    returns how many."""
    m = 0
    for i in range(conf.shape[0]):
        top = min(min(drafted[i], accepted[i] + 1), conf.shape[1])
        for j in range(top):
            c = conf[i, j]
            if c == c:
                c = _clip(c, lo, hi)
                buf[0, m] = c
                buf[1, m] = -c
                ok[m] = j < accepted[i]
                m += 1
    return m


X, XX, N, ACC, REJ, R, W, T1, T2, NZ = range(10)   # the rows of the fit's work array ([10, bins])


@njit(cache=True, nogil=True)
def _objective(work, a, b, lam, two):
    """`ConfidenceCalibration._fit`'s objective at (a, b); work[NZ] = -(a + b x) for the sigmoid's np.exp."""
    x, t1, t2 = work[X], work[T1], work[T2]
    for i in range(x.shape[0]):
        z = a + b * x[i]
        t1[i], t2[i] = _neg_softplus_pair(z)
        work[NZ, i] = -z
    return (_ddot(work[ACC], t1) + _ddot(work[REJ], t2)) - 0.5 * lam * (a * a + (b - 1.0) ** two)


@njit(cache=True, nogil=True)
def _big(nz):
    """Whether np.exp(nz) may overflow."""
    for i in range(nz.shape[0]):
        if nz[i] > OVERFLOW:
            return True
    return False


@njit(cache=True, nogil=True)
def conf_start(work, x, xx, n, acc, a, b, lam, two):
    """The fit's work array (x, x^2, the counts n and acc, rej = n - acc) and its first objective; returns (the
    objective, whether np.exp(work[NZ]) may overflow)."""
    for i in range(x.shape[0]):
        work[X, i], work[XX, i], work[N, i], work[ACC, i] = x[i], xx[i], n[i], acc[i]
        work[REJ, i] = n[i] - acc[i]
    f = _objective(work, a, b, lam, two)
    return f, _big(work[NZ])


@njit(cache=True, nogil=True)
def conf_bins(lg, l1p, ok, keep, n, acc, work, lim, scale, x, xx, a, b, lam, two):
    """The bins' forgetting counts after a step, into work[N] and work[ACC]: z = clip(log c - log1p(-c), -lim, lim)
    in bin min(int((z + lim) x scale), bins - 1); n x keep + tokens per bin, acc x keep + accepted per bin. Then
    the fit's start on them (`conf_start`): returns (the objective at (a, b), whether np.exp may overflow)."""
    bins = n.shape[0]
    cnt, hit = work[R], work[W]
    for k in range(bins):
        cnt[k] = 0.0
        hit[k] = 0.0
    for t in range(lg.shape[0]):
        z = _clip(lg[t] - l1p[t], -lim, lim)
        k = min(int((z + lim) * scale), bins - 1)
        cnt[k] += 1.0
        hit[k] += 1.0 if ok[t] else 0.0
    for k in range(bins):
        work[N, k] = n[k] * keep + cnt[k]
        work[ACC, k] = acc[k] * keep + hit[k]
    return conf_start(work, x, xx, work[N], work[ACC], a, b, lam, two)


@njit(cache=True, nogil=True, error_model="numpy")
def conf_newton(e, work, a, b, f, lam, two):
    """One Newton step of `ConfidenceCalibration._fit` from (a, b) with objective f, e = exp(-(a + b x)): the
    ridge-penalised gradient and Hessian, the step halved (at most 30 times) until the objective does not fall.
    Returns (a, b, f, 1 where converged / 0 / -1 where the Hessian is singular (Python's float division raises
    there: the caller does), whether np.exp of the next work[NZ] may overflow); work[NZ] = -(a + b x) at the new
    (a, b)."""
    x, n, acc, r, w = work[X], work[N], work[ACC], work[R], work[W]
    for i in range(x.shape[0]):
        p = 1.0 / (1.0 + e[i])
        r[i] = acc[i] - n[i] * p
        w[i] = n[i] * p * (1.0 - p)
    g0, g1 = _sum(r) - lam * a, _ddot(r, x) - lam * (b - 1.0)
    h00, h01, h11 = _sum(w) + lam, _ddot(w, x), _ddot(w, work[XX]) + lam
    det = h00 * h11 - h01 * h01
    if det == 0.0:
        return a, b, f, -1, False
    da, db = (h11 * g0 - h01 * g1) / det, (h00 * g1 - h01 * g0) / det
    f_new = f
    for _ in range(30):
        f_new = _objective(work, a + da, b + db, lam, two)
        if f_new >= f - 1e-12 * abs(f):
            break
        da, db = 0.5 * da, 0.5 * db
    a, b = a + da, b + db
    for i in range(x.shape[0]):
        work[NZ, i] = -(a + b * x[i])
    return a, b, f_new, 1 if abs(da) + abs(db) < 1e-6 else 0, _big(work[NZ])


@njit(cache=True, nogil=True)
def conf_clip(c, lo, hi, buf):
    """`ConfidenceCalibration.logit`'s first step: c clipped to [lo, hi] into buf[0], negated into buf[1]."""
    for i in range(c.shape[0]):
        v = _clip(c[i], lo, hi)
        buf[0, i] = v
        buf[1, i] = -v


@njit(cache=True, nogil=True)
def conf_affine(lg, l1p, lim, a, b):
    """lg = -(clip(lg - l1p, -lim, lim) x b + a) in place (the argument of the sigmoid's np.exp); returns whether
    np.exp may overflow."""
    big = False
    for i in range(lg.shape[0]):
        v = -(_clip(lg[i] - l1p[i], -lim, lim) * b + a)
        lg[i] = v
        big = big or v > OVERFLOW
    return big


@njit(cache=True, nogil=True, error_model="numpy")
def conf_sigmoid(e):
    """e = 1 / (1 + e) in place."""
    for i in range(e.shape[0]):
        e[i] = 1.0 / (e[i] + 1.0)


# ---- PerRequest (kit.state) -----------------------------------------------------------------------------------


@njit(cache=True, nogil=True)
def align_rows(old_ids, old, ids, init):
    """`PerRequest.align`'s new rows: each id's row of `old` where old_ids holds it (its first row in a stable
    sort of old_ids, as np.argsort(kind="stable") and np.searchsorted find it), else `init`."""
    n, f = ids.shape[0], init.shape[0]
    new = np.empty((n, f))
    for i in range(n):
        for j in range(f):
            new[i, j] = init[j]
    m = old_ids.shape[0]
    if m == 0:
        return new
    ascending = True
    for i in range(1, m):
        if old_ids[i] < old_ids[i - 1]:
            ascending = False
            break
    if ascending:   # already in order: the stable sort leaves it as it is
        order, srt = np.arange(m), old_ids
    else:
        order = np.argsort(old_ids, kind="mergesort")
        srt = np.empty(m, old_ids.dtype)
        for i in range(m):
            srt[i] = old_ids[order[i]]
    for i in range(n):
        at = min(np.searchsorted(srt, ids[i]), m - 1)
        if srt[at] == ids[i]:
            for j in range(f):
                new[i, j] = old[order[at], j]
    return new


# ---- shrunk_rates and expected_tokens (kit.acceptance) -------------------------------------------------------


@njit(cache=True, nogil=True)
def _gathered_sum(v, mask, buf):
    """v[mask].sum(): the masked values gathered in order, numpy's pairwise sum of them."""
    m = 0
    for i in range(v.shape[0]):
        if mask[i]:
            buf[m] = v[i]
            m += 1
    return _sum(buf[:m])


@njit(cache=True, nogil=True, error_model="numpy")
def shrunk(accepted, rejected, level):
    """`acceptance.shrunk_rates`' operations in its order (pairwise sums, np.var's mean then mean square, numpy's
    clip)."""
    rows = accepted.shape[0]
    lv = _sum(level) / level.shape[0]
    n = np.empty(rows)
    seen = np.empty(rows, np.bool_)
    m = 0
    for i in range(rows):
        n[i] = accepted[i] + rejected[i]
        seen[i] = n[i] > 0
        m += seen[i]
    out = np.empty(rows)
    if m < 2:
        out[:] = lv
        return out
    buf = np.empty(rows)
    pooled = _gathered_sum(accepted, seen, buf) / _gathered_sum(n, seen, buf)
    rate, noise = np.empty(rows), np.empty(rows)
    for i in range(rows):
        d = n[i] if n[i] > 1.0 or n[i] != n[i] else 1.0
        rate[i] = accepted[i] / d if seen[i] else pooled
        noise[i] = pooled * (1.0 - pooled) / d
    mean = _gathered_sum(rate, seen, buf) / m
    k = 0
    for i in range(rows):
        if seen[i]:
            dev = rate[i] - mean
            buf[k] = dev * dev
            k += 1
    var = _sum(buf[:m]) / m
    t = var - _gathered_sum(noise, seen, buf) / m * (1.0 + 2.0 * math.sqrt(2.0 / (m - 1)))
    tau2 = 0.0 if 0.0 > t else t
    for i in range(rows):
        shrink = tau2 / (tau2 + noise[i] + 1e-12) if seen[i] else 0.0
        out[i] = _clip(lv + shrink * (rate[i] - pooled), 0.0, 0.999)
    return out


@njit(cache=True, nogil=True, error_model="numpy")
def survival_tokens(a, ks, factors, has_factors, trials, has_trials):
    """`acceptance.expected_tokens` per position (factors and/or trials): a clipped to [0, 0.999], each position's
    survival min(step, 0.999) multiplied down the positions (np.cumprod's order) and summed (np.cumsum's), 1 +
    the sum read at each k of ks. Returns ([len(ks), rows], True), or (empty, False) where a k is outside 0..ks[-1].
    """
    rows, k = a.shape[0], ks[ks.shape[0] - 1]
    for j in range(ks.shape[0]):
        if ks[j] < 0 or ks[j] > k:   # not read at 0..ks[-1] (numpy's indexing wraps or raises): the numpy form
            return np.empty((0, rows)), False
    table = np.empty((k + 1, rows))
    for i in range(rows):
        ai = _clip(a[i], 0.0, 0.999)
        surv, total = 0.0, 0.0
        table[0, i] = 1.0 + 0.0
        for p in range(k):
            step = (ai * trials + p) / (trials + p) if has_trials else ai
            if has_factors:
                step = step * factors[p]
            step = step if step <= 0.999 or step != step else 0.999
            surv = step if p == 0 else surv * step
            total = surv if p == 0 else total + surv
            table[p + 1, i] = 1.0 + total
    out = np.empty((ks.shape[0], rows))
    for j in range(ks.shape[0]):
        for i in range(rows):
            out[j, i] = table[ks[j], i]
    return out, True


# ---- PositionFactors and tie_bands (kit.acceptance) ----------------------------------------------------------


@njit(cache=True, nogil=True)
def position_sums(verified, accepted, estimate, drafted, paired, acc_s, exp_s, first_acc, first_exp):
    """`PositionFactors.add`'s column sums over the rows (bool [rows, k] masks), each in row order as numpy sums over
    axis 0, then added at positions 0..k-1: acc_s += (verified & accepted), exp_s += (verified x estimate) and,
    `paired`, first_acc += (drafted past p & position 0 verified and accepted), first_exp += (drafted past p x
    estimate). numpy's sums over axis 0 run row by row, except over one column (pairwise, `_sum`)."""
    rows, k = verified.shape
    col = np.zeros((4, k))
    if k == 1:   # one column: numpy's sum runs down a contiguous axis, pairwise
        t = np.empty((2, rows))
        for i in range(rows):
            col[0, 0] += 1.0 if verified[i, 0] and accepted[i, 0] else 0.0
            t[0, i] = (1.0 if verified[i, 0] else 0.0) * estimate[i]
            col[2, 0] += 1.0 if paired and 0 < drafted[i] and verified[i, 0] and accepted[i, 0] else 0.0
            t[1, i] = (1.0 if paired and 0 < drafted[i] else 0.0) * estimate[i]
        col[1, 0], col[3, 0] = _sum(t[0]), _sum(t[1])
        rows = 0
    for i in range(rows):
        e = estimate[i]
        first = verified[i, 0] and accepted[i, 0] if k else False
        for p in range(k):
            col[0, p] += 1.0 if verified[i, p] and accepted[i, p] else 0.0
            t = (1.0 if verified[i, p] else 0.0) * e
            col[1, p] = t if i == 0 else col[1, p] + t
            if paired:
                past = p < drafted[i]
                col[2, p] += 1.0 if past and first else 0.0
                t = (1.0 if past else 0.0) * e
                col[3, p] = t if i == 0 else col[3, p] + t
    for p in range(k):
        acc_s[p] += col[0, p]
        exp_s[p] += col[1, p]
        if paired:
            first_acc[p] += col[2, p]
            first_exp[p] += col[3, p]


@njit(cache=True, nogil=True)
def position_sums_counts(k, verified, accepted, estimate, drafted, paired, acc_s, exp_s, first_acc, first_exp):
    """`position_sums` where row i verified its positions below verified[i] and accepted those below accepted[i]."""
    rows = verified.shape[0]
    vm, am = np.empty((rows, k), np.bool_), np.empty((rows, k), np.bool_)
    for i in range(rows):
        for p in range(k):
            vm[i, p], am[i, p] = p < verified[i], p < accepted[i]
    position_sums(vm, am, estimate, drafted, paired, acc_s, exp_s, first_acc, first_exp)


@njit(cache=True, nogil=True)
def scale4(a, b, c, d, keep):
    """a, b, c, d *= keep (`PositionFactors.forget`)."""
    for x in (a, b, c, d):
        for i in range(x.shape[0]):
            x[i] *= keep


@njit(cache=True, nogil=True, error_model="numpy")
def position_factors(k, accepted, expected, first_acc, first_exp, prior, optimism, paired):
    """`PositionFactors._factor`'s operations: (accepted + P) / (expected + P); paired, divided by the selection
    ratio (first_acc + P f_0) / (first_exp + P) and multiplied by f_0; raised by optimism x 0.5 sqrt(e) / (e + P),
    at most to max(f, 1); 1 past the sums. Returns (f, True), or (f, False) where an expected sum is negative (np.sqrt
    warns there: the numpy form)."""
    f = np.ones(k)
    m = min(k, accepted.shape[0])
    for p in range(m):
        if expected[p] < 0.0:
            return f, False
    for p in range(m):
        f[p] = (accepted[p] + prior) / (expected[p] + prior)
    if paired and m > 1:
        m0 = f[0]
        for p in range(1, m):
            sel = (first_acc[p] + prior * m0) / (first_exp[p] + prior)
            f[p] = f[p] / sel * m0
    if optimism:
        c = optimism * 0.5
        for p in range(m):
            e = expected[p]
            up = f[p] + c * math.sqrt(e) / (e + prior)
            cap = f[p] if f[p] >= 1.0 or f[p] != f[p] else 1.0
            f[p] = up if up <= cap or up != up else cap
    return f, True


@njit(cache=True, nogil=True, error_model="numpy")
def tie_bands(a, tol):
    """`acceptance.tie_bands` past its early returns: np.unique's sorted distinct values, counts and inverse, the
    bands (kernels.bands), each band's mean sum(u x count) / sum(count) summed in ascending order (np.bincount's),
    read back per value. Returns (the values, True), or (a, False) where a holds NaN or a zero (np.unique's pick
    between -0.0 and 0.0) or one distinct value: the numpy form."""
    n = a.shape[0]
    for i in range(n):
        if a[i] != a[i] or a[i] == 0.0:
            return a, False
    order = np.argsort(a)
    inv = np.empty(n, np.int64)
    u, cnt = np.empty(n), np.zeros(n)
    m = -1
    for i in range(n):
        v = a[order[i]]
        if m < 0 or v != u[m]:
            m += 1
            u[m] = v
        cnt[m] += 1.0
        inv[order[i]] = m
    m += 1
    if m == 1:
        return a, False
    band = bands(u[:m], tol)
    nb = band.max() + 1
    num, den = np.zeros(nb), np.zeros(nb)
    for j in range(m):
        num[band[j]] += u[j] * cnt[j]
        den[band[j]] += cnt[j]
    out = np.empty(n)
    for i in range(n):
        b = band[inv[i]]
        out[i] = num[b] / den[b]
    return out, True


# ---- PaddingFit (kit.calibration) ------------------------------------------------------------------------------
# the state: s[0:6] the decayed X'X's upper triangle (x = predicted, 1, pad), s[6:9] X'y, s[9] y'y, s[10] the weight


@njit(cache=True, nogil=True)
def _pf_rss(s, c0, c1, c2):
    """`PaddingFit._rss`: the residual sum of squares at (c0, c1, c2), Python's sum's order (from 0)."""
    quad = 0.0 + c0 * c0 * s[0] * 1.0
    quad = quad + c0 * c1 * s[1] * 2.0
    quad = quad + c0 * c2 * s[2] * 2.0
    quad = quad + c1 * c1 * s[3] * 1.0
    quad = quad + c1 * c2 * s[4] * 2.0
    quad = quad + c2 * c2 * s[5] * 1.0
    v = s[9] - 2.0 * (c0 * s[6] + c1 * s[7] + c2 * s[8]) + quad
    return 0.0 if 0.0 > v else v


@njit(cache=True, nogil=True)
def _pf_solve3(s, A):
    """`PaddingFit._solve` on all three features: (solved, c0, c1, c2, the padding's standard error)."""
    a00, a01, a02, a11, a12, a22 = A[0], A[1], A[2], A[3], A[4], A[5]
    m00, m01, m02 = a11 * a22 - a12 * a12, a02 * a12 - a01 * a22, a01 * a12 - a02 * a11
    m11, m12, m22 = a00 * a22 - a02 * a02, a01 * a02 - a00 * a12, a00 * a11 - a01 * a01
    det = a00 * m00 + a01 * m01 + a02 * m02
    if det == 0.0:
        return False, 0.0, 0.0, 0.0, 0.0
    y0, y1, y2 = s[6], s[7], s[8]
    c0 = (m00 * y0 + m01 * y1 + m02 * y2) / det
    c1 = (m01 * y0 + m11 * y1 + m12 * y2) / det
    c2 = (m02 * y0 + m12 * y1 + m22 * y2) / det
    last = m22 / det
    return True, c0, c1, c2, math.sqrt(_pf_rss(s, c0, c1, c2) / (s[10] - 3) * (0.0 if 0.0 > last else last))


@njit(cache=True, nogil=True)
def _pf_solve2(s, A, i, j):
    """`PaddingFit._solve` on features i < j (the other at 0): (solved, c0, c1, c2, the last one's standard
    error)."""
    at = np.array([[0, 1, 2], [1, 3, 4], [2, 4, 5]])
    aii, aij, ajj = A[at[i, i]], A[at[i, j]], A[at[j, j]]
    det = aii * ajj - aij * aij
    if det == 0.0:
        return False, 0.0, 0.0, 0.0, 0.0
    c = np.zeros(3)
    c[i], c[j] = (ajj * s[6 + i] - aij * s[6 + j]) / det, (aii * s[6 + j] - aij * s[6 + i]) / det
    last = aii / det
    se = math.sqrt(_pf_rss(s, c[0], c[1], c[2]) / (s[10] - 2) * (0.0 if 0.0 > last else last))
    return True, c[0], c[1], c[2], se


@njit(cache=True, nogil=True)
def _pf_keep_pad(s, A, prev):
    """`PaddingFit._keep_pad`: the padding held at prev, the scale and fixed part refitted; returns (pad, scale,
    fixed, taken)."""
    if prev <= 0.0:
        return 0.0, 0.0, 0.0, False
    y0, y1 = s[6] - prev * A[2], s[7] - prev * A[4]
    det = A[0] * A[3] - A[1] * A[1]
    if det <= 0.0:
        return 0.0, 0.0, 0.0, False
    scale, fixed = (A[3] * y0 - A[1] * y1) / det, (A[0] * y1 - A[1] * y0) / det
    if fixed < 0.0:
        scale, fixed = y0 / A[0], 0.0
    if scale > 0.0:
        return (scale if scale < prev else prev), scale, fixed, True
    return 0.0, 0.0, 0.0, False


@njit(cache=True, nogil=True)
def _pf_hold(s, A, prev, upper, has_upper, sticky, cautious):
    """`PaddingFit._hold` (with `_doubt`): the term found earlier (sticky), else what the data cannot rule out."""
    if sticky and prev > 0.0:
        return _pf_keep_pad(s, A, prev)
    if not cautious or (has_upper and upper < 0.5):
        doubt = 0.0
    else:
        doubt = (1.0 if 1.0 < upper else upper) if has_upper else 1.0
    return _pf_keep_pad(s, A, doubt)


@njit(cache=True, nogil=True)
def padding_update(s, predicted, pad, measured, keep, prev, sticky, cautious, two):
    """`PaddingFit.update` then `_refit` on the state s (in place): returns (pad, scale, fixed, whether a fit is
    taken)."""
    x = (predicted, 1.0, pad)
    s[0], s[1], s[2] = s[0] * keep + x[0] * x[0], s[1] * keep + x[0] * x[1], s[2] * keep + x[0] * x[2]
    s[3], s[4], s[5] = s[3] * keep + x[1] * x[1], s[4] * keep + x[1] * x[2], s[5] * keep + x[2] * x[2]
    s[6], s[7], s[8] = s[6] * keep + x[0] * measured, s[7] * keep + x[1] * measured, s[8] * keep + x[2] * measured
    s[9], s[10] = s[9] * keep + measured * measured, s[10] * keep + 1.0
    if s[10] < 4.0 or s[5] <= 0.0:
        return 0.0, 0.0, 0.0, False
    A = s[:6].copy()
    for d in (0, 3, 5):
        A[d] = A[d] + A[d] * 1e-9
    ok, c0, c1, c2, se = _pf_solve3(s, A)
    if ok and c1 < 0.0:
        ok, c0, c1, c2, se = _pf_solve2(s, A, 0, 2)
    if not ok:
        return _pf_hold(s, A, prev, 0.0, False, sticky, cautious)
    okp, p0, p1, p2, _ = _pf_solve2(s, A, 0, 1)
    if not okp:
        return _pf_hold(s, A, prev, 0.0, False, sticky, cautious)
    gain = (_pf_rss(s, p0, p1, p2) - _pf_rss(s, c0, c1, c2)) / s[10] >= (0.01 * s[7] / s[10]) ** two
    if gain and c0 > 0.0 and c2 > 3.0 * se and c2 > 0.02 * c0:
        return (c0 if c0 < c2 else c2), c0, c1, True
    if not c2 + 3.0 * se < prev:
        return _pf_hold(s, A, prev, c2 + 3.0 * se, True, sticky, cautious)
    return _pf_hold(s, A, 0.0, c2 + 3.0 * se, True, sticky, cautious)


# ---- step cost tables (kit.cost, kit.calibration, kit.idle) ---------------------------------------------------


@njit(cache=True, nogil=True)
def int_stats(a):
    """(min, max, sum) of an integer vector (exact; min and max 0 where it is empty: the callers guard)."""
    lo, hi, total = 0, 0, 0
    for i in range(a.shape[0]):
        v = a[i]
        if i == 0 or v < lo:
            lo = v
        if i == 0 or v > hi:
            hi = v
        total += v
    return lo, hi, total


@njit(cache=True, nogil=True)
def masked_max(a, mask):
    """The largest a[i] where mask[i] (integers), and how many rows the mask holds."""
    best, count = 0, 0
    for i in range(a.shape[0]):
        if mask[i]:
            if count == 0 or a[i] > best:
                best = a[i]
            count += 1
    return best, count


@njit(cache=True, nogil=True)
def padded_tables(verify, n):
    """`cost.as_padded`'s tables: the verify without drafts at every x (np.full_like), and np.diff of the verify read
    every n drafts (`every_row_deep`)."""
    size = verify.shape[0]
    flat = np.empty(size)
    for i in range(size):
        flat[i] = verify[0]
    deep = size // max(n, 1) + 1
    pad = np.empty(deep - 1)
    prev = verify[0]
    for p in range(1, deep):
        cur = verify[min(p * n, size - 1)]
        pad[p - 1] = cur - prev
        prev = cur
    return flat, pad


@njit(cache=True, nogil=True)
def corrected(verify, sv, cv, draft, sd, cd):
    """`CostCalibration.correct`'s unpadded tables: sv x verify + cv and sd x draft + cd with draft[0] = 0."""
    v, d = np.empty(verify.shape[0]), np.empty(draft.shape[0])
    for i in range(verify.shape[0]):
        v[i] = sv * verify[i] + cv
    for i in range(draft.shape[0]):
        d[i] = sd * draft[i] + cd
    d[0] = 0.0
    return v, d


@njit(cache=True, nogil=True)
def ascending_distinct(r):
    """np.unique(r) for a non-decreasing r (its values once each, in order); (r, False) where r decreases anywhere
    (np.unique's sort then decides: the numpy form)."""
    n = r.shape[0]
    out = np.empty(n)
    m = 0
    for i in range(n):
        if i and r[i] < r[i - 1]:
            return r, False
        if i == 0 or r[i] != r[i - 1]:
            out[m] = r[i]
            m += 1
    return out[:m].copy(), True
