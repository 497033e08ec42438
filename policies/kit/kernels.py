"""The compiled loops of the policy kit and of the built-in policies (numba, cached on disk): the kit's searches,
per-step blocks, drain and tree pricing, and goodput's, confidence's and tree_confidence's per-step work. Each
computes what the numpy code it replaces computed: the same IEEE operations in the same order (no fused or
reordered arithmetic except where numpy's own kernel fuses: `_ddot`), numpy's pairwise order for a contiguous sum
(`pairwise`), its sorts' order, np.argmax's first maximum, and libm's scalar functions where numpy calls them
(np.logaddexp's exp and log1p; Python's float power). numpy's vectorised transcendentals (np.exp, np.log, np.tanh,
np.power on arrays) are not computed here: their callers keep them as numpy calls between the loops, so a
decision does not depend on this module. `blas_dot_matches()` says whether `_ddot` reproduces this machine's BLAS
dot; where it does not, the callers keep their numpy form. Kernels with error_model="numpy" divide as numpy does
(x / 0 is inf or NaN). One file: numba's disk cache does not follow calls across files."""
from __future__ import annotations

import functools
import math

import numpy as np
from numba import njit, types
from numba.core.extending import intrinsic


@njit(cache=True, nogil=True)
def by_position(C, K, G, ver, dr, pad, has_pad, n, base):
    """`search._by_position` over a cumulative table C[m, p] (the best m rows' values at position p): per
    position the m in 0..prev maximising C[m, p] - G x (draft[m] (+ pad[p] for m > 0) + verify[x + m] -
    verify[x]); stops at m = 0 or a gain <= 0. Returns (the m per position, their count, value, seconds)."""
    ms = np.zeros(K, np.int64)
    x, e, tdraft, prev, count = 0, base, 0.0, n, 0
    for p in range(K):
        m, best, dm = _position_best(C[:, p], prev, G, ver, x, dr, pad[p] if has_pad else 0.0, has_pad)
        if m == 0 or best <= 0.0:
            break
        ms[count] = m
        count += 1
        e += C[m, p]
        tdraft += dm
        x += m
        prev = m
    return ms, count, e, ver[x] + tdraft


@njit(cache=True, nogil=True)
def _candidates(order, p, chosen, prev, cand):
    """The first `prev` rows of column p's ranking among the `chosen` ones, into cand; returns how many."""
    k = 0
    for i in range(order.shape[0]):
        r = order[i, p]
        if chosen[r]:
            if k == prev:
                break
            cand[k] = r
            k += 1
    return k


@njit(cache=True, nogil=True)
def _position_best(c, k, G, ver, x, dr, padp, has_pad):
    """The position's best count m of its k ranked rows (c: their cumulative values, c[0] = 0): the first j in 0..k
    with the greatest c[j] - G (dr[j] (+ padp where j > 0 and has_pad) + ver[x + j] - ver[x]) (a NaN wins, as
    np.argmax). Returns (m, its gain, its draft seconds)."""
    vx = ver[x]
    m, best, dm = 0, 0.0, 0.0
    for j in range(k + 1):
        dj = dr[j] + padp if has_pad and j > 0 else dr[j]
        g = c[j] - G * (dj + ver[x + j] - vx)
        if j == 0 or (not math.isnan(best) and (g > best or math.isnan(g))):
            m, best, dm = j, g, dj
    return m, best, dm


@njit(cache=True, nogil=True)
def nested_by_position(S, order, K, G, ver, dr, pad, has_pad, n, base):
    """`by_position` on `search._NestedColumns`: column p's cumulative values (np.cumsum's order) over the rows
    that drafted at p - 1, in column p's ranking (`order`); the m rows drafting at p are the first m of them."""
    ms = np.zeros(K, np.int64)
    chosen = np.ones(n, np.bool_)
    cand = np.empty(n, np.int64)
    c = np.empty(n + 1)
    x, e, tdraft, prev, count = 0, base, 0.0, n, 0
    for p in range(K):
        k = _candidates(order, p, chosen, prev, cand)
        c[0] = 0.0
        for j in range(k):
            c[j + 1] = S[cand[j], p] if j == 0 else c[j] + S[cand[j], p]
        m, best, dm = _position_best(c, k, G, ver, x, dr, pad[p] if has_pad else 0.0, has_pad)
        if m == 0 or best <= 0.0:
            break
        chosen[:] = False
        for j in range(m):
            chosen[cand[j]] = True
        ms[count] = m
        count += 1
        e += c[m]
        tdraft += dm
        x += m
        prev = m
    return ms, count, e, ver[x] + tdraft


@njit(cache=True, nogil=True)
def nested_depths(order, ms, n):
    """The depths of a nested plan `ms` (`search._depths` on `_NestedColumns`): at each position the first m of
    the rows that drafted at the one before, in the position's ranking."""
    depths = np.zeros(n, np.int64)
    chosen = np.ones(n, np.bool_)
    cand = np.empty(n, np.int64)
    prev = n
    for p in range(ms.shape[0]):
        m = ms[p]
        _candidates(order, p, chosen, prev, cand)
        chosen[:] = False
        for j in range(m):
            chosen[cand[j]] = True
            depths[cand[j]] += 1
        prev = m
    return depths


@njit(cache=True, nogil=True)
def margin_gains(vs, draft, verify, x, last, padp, has_pad, G, E, T, has_ratio):
    """`search._best_count`: over m = 1..len(vs), the value of the first m ranked slots (np.cumsum's order) minus G
    x their seconds (draft[m] + verify[min(x + m, last)] - verify[min(x, last)] (+ padp)), or where `has_ratio` the
    goodput gain (E + value) / (T + seconds) - E / T; returns (the first best index, its gain, value, seconds)."""
    vx = verify[min(x, last)]
    base = E / T
    acc = 0.0
    best, bg, bv, bd = 0, 0.0, 0.0, 0.0
    for i in range(vs.shape[0]):
        acc = vs[0] if i == 0 else acc + vs[i]
        dt = draft[i + 1] + verify[min(x + i + 1, last)] - vx
        if has_pad:
            dt = dt + padp
        g = (E + acc) / (T + dt) - base if has_ratio else acc - G * dt
        if i == 0 or (not math.isnan(bg) and (g > bg or math.isnan(g))):
            best, bg, bv, bd = i, g, acc, dt
    return best, bg, bv, bd


@njit(cache=True, nogil=True)
def bands(u, tol):
    """`acceptance.tie_bands`' bands over ascending distinct values u: from the highest down, a value below the
    current band's floor (its highest x (1 - tol)) opens the next band."""
    band = np.empty(u.shape[0], np.int64)
    b, floor = -1, math.inf
    for j in range(u.shape[0] - 1, -1, -1):
        v = u[j]
        if v < floor:
            b, floor = b + 1, v * (1.0 - tol)
        band[j] = b
    return band


_F64, _I64 = np.dtype(np.float64), np.dtype(np.int64)   # the native dtypes (the kit compares them by identity first)


def floats(*arrays, nonempty: bool = False) -> bool:
    """Whether every one is a 1-D native float64 ndarray (`nonempty`: and not empty), as the compiled loops take
    them (numpy's arrays share one float64 dtype object, numba's carry an equal one). Plain Python."""
    for a in arrays:
        if type(a) is not np.ndarray or a.ndim != 1 or (nonempty and not a.size) or (
                a.dtype is not _F64 and a.dtype != _F64):
            return False
    return True


# ---- one depth for the batch (search.uniform_depth) ------------------------------------------------------

@njit(cache=True, nogil=True)
def step_seconds(x, deep, verify, draft_n, pad):
    """`search._step_seconds`: verify[min(x, last)] + deep x draft_n (+ pad's running sum over the first `deep`
    positions where pad has any), per depth."""
    last = verify.shape[0] - 1
    opened = np.zeros(pad.shape[0] + 1)
    for j in range(pad.shape[0]):
        opened[j + 1] = pad[j] if j == 0 else opened[j] + pad[j]
    T = np.empty(x.shape[0])
    for k in range(x.shape[0]):
        T[k] = verify[min(x[k], last)] + float(deep[k]) * draft_n
        if pad.shape[0]:
            T[k] = T[k] + opened[min(deep[k], pad.shape[0])]
    return T


@njit(cache=True, nogil=True)
def level_column(a, k, factors, has_factors, trials, has_trials):
    """`search._level_column`: where every a holds the same value, `search._one_row` of it (the clip, each position's
    survival, its product and its running sum, in its order) and True; else (an empty row, False)."""
    for i in range(1, a.shape[0]):
        if not a[i] == a[0]:
            return np.empty(0), False
    return _level_row(a[0], k, factors, has_factors, trials, has_trials), True


@njit(cache=True, nogil=True, inline="always")
def _level_row(x, k, factors, has_factors, trials, has_trials):
    """`search._one_row` of the estimate x: expected tokens at depths 0..k."""
    x = 0.999 if x > 0.999 else (x if x > 0.0 else 0.0)
    out = np.empty(k + 1)
    out[0] = 1.0
    surv, total = 1.0, 0.0
    for p in range(k):
        step = (x * trials + float(p)) / (trials + float(p)) if has_trials else x
        if has_factors:
            step = step * factors[p]
        step = 0.999 if 0.999 < step else step   # Python's min(step, 0.999)
        surv = step if p == 0 else surv * step
        total = surv if p == 0 else total + surv
        out[p + 1] = 1.0 + total
    return out


@njit(cache=True, nogil=True)
def uniform_best(col, ends, has_ends, n, verify, draft_n, pad):
    """`search.uniform_depth` where every row has the same expected tokens col[k] at depth k and no row is
    draining: per depth k the rows' tokens (col[min(k, ends_i)] where `has_ends`) summed in np.sum's order over
    the step's seconds; returns (the first best k, its goodput)."""
    K = col.shape[0]
    x = np.empty(K, np.int64)
    deep = np.empty(K, np.int64)
    e = np.empty(K)
    row = np.empty(n)
    for k in range(K):
        xs, dk = 0, 0
        for i in range(n):
            got = min(k, ends[i]) if has_ends else k
            row[i] = col[got]
            xs += got
            dk = max(dk, got)
        x[k], deep[k] = xs, dk
        e[k] = 0.0 + pairwise(row, 0, n)
    T = step_seconds(x, deep, verify, draft_n, pad)
    best, bg = 0, 0.0
    for k in range(K):
        g = e[k] / T[k]
        if k == 0 or (not math.isnan(bg) and (g > bg or math.isnan(g))):
            best, bg = k, g
    return best, bg


@njit(cache=True, nogil=True)
def plan_tables(verify, draft, calib, has_time, idle, extra, buf):
    """`CostCalibration.correct`'s unpadded tables with `PolicyTime.apply` where `has_time`, written at the start of
    `buf` (the caller's: an array a compiled call hands back to Python costs a microsecond or two): verify = sv x
    verify + cv (+ idle), draft = sd x draft + cd with draft[0] = 0, pad (`has_time`: zeros, one more than the
    tables' positions, pad[0] = 0.0 + extra; else none), the fits (scale, fixed) read from CostCalibration's
    state `calib` (draft at 12-13, verify at 14-15). Returns (verify, draft, pad, the rest of buf): views of it."""
    X1, n1 = verify.shape[0], draft.shape[0]
    P = (X1 - 1) // max(n1 - 1, 1) + 1 if has_time else 0
    v, d, pad, rest = buf[:X1], buf[X1:X1 + n1], buf[X1 + n1:X1 + n1 + P], buf[X1 + n1 + P:]
    sv, cv, sd, cd = calib[14], calib[15], calib[12], calib[13]
    for i in range(X1):
        v[i] = sv * verify[i] + cv
    for i in range(n1):
        d[i] = sd * draft[i] + cd
    d[0] = 0.0
    if has_time:
        for i in range(X1):
            v[i] = v[i] + idle
        for p in range(P):
            pad[p] = 0.0
        pad[0] += extra
    return v, d, pad, rest


@njit(cache=True, nogil=True)
def batch_level(counts, prior_tokens, pool0, pool1):
    """`CostAwareDepth.level`: (min((accepted + P x pool0 / (pool0 + pool1)) / trials, 0.999), trials), trials =
    the counts' sum + P, accepted the first column's sum (`count_sums`)."""
    total, acc = count_sums(counts, 0)
    trials = total + prior_tokens
    level = (acc + prior_tokens * pool0 / (pool0 + pool1)) / trials
    return (0.999 if 0.999 < level else level), trials   # Python's min(level, 0.999)


@njit(cache=True, nogil=True)
def uniform_plan(verify, draft, calib, has_time, idle, extra, counts, prior_tokens, pool, pos_acc, pos_exp,
                 first_acc, first_exp, position_prior, optimism, paired, kmax, remaining, lag, buf):
    """`CostAwareDepth`'s plan while rows may still join, in one call: the step's tables (`plan_tables`), the level
    (`batch_level`, pool = [accepted, rejected]), the position factors f at 0..kmax-1 (`position_factors` of
    PositionFactors' sums), every row's draft cap min(max(remaining - 1, 0), kmax) (`caps`), `uniform_best` at the
    level with f (`level_column`'s row), the draft lag's largest value (0 for no rows) and the margin's acceptance
    per position, np.minimum(level x f, 0.999). buf (`plan_tables`) gets verify, draft, pad, then the margin's
    acceptance. Returns (k, goodput, level, trials, largest lag, whether the factors are compiled: False where
    `position_factors` leaves them to numpy)."""
    v, d, pad, rate = plan_tables(verify, draft, calib, has_time, idle, extra, buf)
    level, trials = batch_level(counts, prior_tokens, pool[0], pool[1])
    f, ok = position_factors(kmax, pos_acc, pos_exp, first_acc, first_exp, position_prior, optimism, paired)
    n = remaining.shape[0]
    ends = np.empty(n, np.int64)
    caps(remaining, kmax, ends)
    k, g = uniform_best(_level_row(level, kmax, f, True, 0.0, False), ends, True, n, v, d[n], pad)
    _margin(level, f, kmax, rate)
    return k, g, level, trials, _largest(lag), ok


@njit(cache=True, nogil=True)
def drain_plan(verify, draft, calib, has_time, idle, extra, counts, prior_tokens, pool, pos_acc, pos_exp,
               first_acc, first_exp, position_prior, optimism, paired, kmax, remaining, lag, buf):
    """`uniform_plan` once no row is left to join (`CostAwareDepth`'s drain), up to the finishing steps' moments: the
    tables, the level, the position factors f, the rows' `shrunk` rates (counts' columns toward np.full(n, level)),
    their `survival_tokens` at depths 0..kmax with f, `scaled_tokens` of the level's row (e, [kmax + 1, n]), the
    remaining tokens as floats and their np.sum, the step seconds per depth (`step_seconds`), the largest lag and
    the margin's acceptance. buf gets verify, draft, pad, the margin's acceptance, the rates, the remaining tokens,
    the seconds and e row by row. Returns (level, trials, the remaining tokens' sum, largest lag, whether the
    factors are compiled)."""
    n, K1 = remaining.shape[0], kmax + 1
    v, d, pad, rest = plan_tables(verify, draft, calib, has_time, idle, extra, buf)
    level, trials = batch_level(counts, prior_tokens, pool[0], pool[1])
    f, ok = position_factors(kmax, pos_acc, pos_exp, first_acc, first_exp, position_prior, optimism, paired)
    _margin(level, f, kmax, rest[:kmax])
    rates, rem = rest[kmax:kmax + n], rest[kmax + n:kmax + 2 * n]
    rates[:] = shrunk(counts[:, 0], counts[:, 1], np.full(n, level))
    ks = np.arange(K1)
    tokens, _ = survival_tokens(rates, ks, f, True, 0.0, False)
    e = scaled_tokens(_level_row(level, kmax, f, True, 0.0, False), tokens)
    for i in range(n):
        rem[i] = float(remaining[i])
    rest[kmax + 2 * n:kmax + 2 * n + K1] = step_seconds(n * ks, ks, v, d[n], pad)
    flat = rest[kmax + 2 * n + K1:]
    for k in range(K1):
        for i in range(n):
            flat[k * n + i] = e[k, i]
    return level, trials, _sum(rem), _largest(lag), ok


@njit(cache=True, nogil=True, inline="always")
def _largest(a):
    """The largest of integers (0 for none)."""
    top = 0
    for i in range(a.shape[0]):
        top = a[i] if i == 0 or a[i] > top else top
    return top


@njit(cache=True, nogil=True, inline="always")
def _margin(level, factors, k, rate):
    """rate[:k] = np.minimum(level x factors[:k], 0.999) (NaN stays NaN)."""
    for p in range(k):
        x = level * factors[p]
        rate[p] = 0.999 if 0.999 < x else x


@njit(cache=True, nogil=True)
def finished(depths, remaining, cap, room, out):
    """`CostAwarePolicy.finish` into out: min(depths, min(max(remaining - 1, 0), cap)) (`caps`), then
    `search.fit_token_cap` at `room` tokens (`_fit_tokens`)."""
    for i in range(depths.shape[0]):
        out[i] = min(depths[i], min(max(remaining[i] - 1, 0), cap))
    _fit_tokens(out, room)


@njit(cache=True, nogil=True)
def finished_full(k, remaining, cap, room, out):
    """`finished` of np.full(remaining.shape[0], k) (`CostAwarePolicy.uniform`)."""
    for i in range(remaining.shape[0]):
        out[i] = min(k, min(max(remaining[i] - 1, 0), cap))
    _fit_tokens(out, room)


@njit(cache=True, nogil=True, inline="always")
def _fit_tokens(out, room):
    """`search.fit_token_cap` in place: unchanged where the sum fits in `room`, zeros where room <= 0, else clipped
    at the largest c with sum(min(out, c)) <= room (the same bisection over 0..max; integers)."""
    n = out.shape[0]
    total, top = 0, 0
    for i in range(n):
        total += out[i]
        top = out[i] if i == 0 or out[i] > top else top
    if total <= room:
        return out
    if room <= 0:
        out[:] = 0
        return out
    lo, hi = 0, top
    while lo < hi:
        c = (lo + hi + 1) // 2
        t = 0
        for i in range(n):
            t += min(out[i], c)
        if t <= room:
            lo = c
        else:
            hi = c - 1
    for i in range(n):
        out[i] = min(out[i], lo)
    return out


# ---- CostAwareDepth's observe ------------------------------------------------------------------------------

@njit(cache=True, nogil=True)
def tally(accepted, drafted, acc, rej):
    """A step's verified drafts into the rows' counts (in place): acc += accepted, rej += (accepted < drafted).
    Returns the step's (drafted, accepted, rejected) totals and its deepest draft."""
    td, ta, tr, deep = 0, 0, 0, 0
    for i in range(accepted.shape[0]):
        r = 1 if accepted[i] < drafted[i] else 0
        acc[i] += accepted[i]
        rej[i] += r
        td += drafted[i]
        ta += accepted[i]
        tr += r
        deep = max(deep, drafted[i])
    return td, ta, tr, deep


@njit(cache=True, nogil=True)
def caps(remaining, kmax, out):
    """`search.draft_caps` into out: min(max(remaining - 1, 0), kmax) per row."""
    for i in range(remaining.shape[0]):
        out[i] = min(max(remaining[i] - 1, 0), kmax)


@njit(cache=True, nogil=True)
def count_sums(table, col):
    """The sum of a [rows, fields] table of counts and of its column `col`, in order (counts below 2^53 are
    exact floats, so any order gives numpy's sums)."""
    total, part = 0.0, 0.0
    for i in range(table.shape[0]):
        for j in range(table.shape[1]):
            total += table[i, j]
        part += table[i, col]
    return total, part


@njit(cache=True, nogil=True)
def observe_counts(accepted, drafted, counts, pool, memory, positions, level, pos_acc, pos_exp, first_acc,
                   first_exp):
    """`CostAwareDepth.observe`'s counts in one call: `tally` into counts' columns (accepted, rejected); where the
    step drafted, pool = pool x keep + (accepted, rejected) in place, keep = exp(-drafted / memory) (libm's, as
    math.exp), and, `positions`, `PositionFactors.forget(keep)` (`scale4`) then its `add_counts` of the step
    (`position_sums_counts`: verified min(drafted, accepted + 1), every row's estimate `level`, unpaired) where
    its sums reach the deepest draft. Returns (0: nothing drafted, 1: counted, 2: counted but the position sums
    left to the caller (too short), 3: all done; keep; the deepest draft)."""
    total, acc, rej, deep = tally(accepted, drafted, counts[:, 0], counts[:, 1])
    if not total:
        return 0, 1.0, deep
    keep = math.exp(-float(total) / memory)
    p0, p1 = pool[0], pool[1]
    pool[0] = p0 * keep + acc
    pool[1] = p1 * keep + rej
    if not positions:
        return 1, keep, deep
    if pos_acc.shape[0] < deep:
        return 2, keep, deep
    scale4(pos_acc, pos_exp, first_acc, first_exp, keep)
    n = accepted.shape[0]
    verified, estimate = np.empty(n, np.int64), np.empty(n)
    for i in range(n):
        verified[i] = min(drafted[i], accepted[i] + 1)
        estimate[i] = level
    position_sums_counts(deep, verified, accepted, estimate, np.zeros(0, np.int64), False, pos_acc, pos_exp,
                         first_acc, first_exp)
    return 3, keep, deep


# ---- confidence's keep_drafting ---------------------------------------------------------------------------

@njit(cache=True, nogil=True)
def confidence_keep(raw, conf, cum, threshold, depths, position, past, rate):
    """`confidence.keep_drafting`'s elementwise part: drafting where raw is not NaN; cum x conf where drafting,
    else 0 (in place); keep where drafting and conf >= threshold. `past` (past the cost rule's depth): also the
    kept rows planned deeper than position + 1 and their cum x rate. Returns (keep, those rows, values)."""
    n = raw.shape[0]
    keep = np.zeros(n, np.bool_)
    idx = np.empty(n, np.int64)
    k = 0
    for i in range(n):
        if math.isnan(raw[i]):
            cum[i] = 0.0
            continue
        cum[i] = cum[i] * conf[i]
        keep[i] = conf[i] >= threshold
        if keep[i] and past and depths[i] > position + 1:
            idx[k] = i
            k += 1
    v = np.empty(k)
    for j in range(k):
        v[j] = cum[idx[j]] * rate
    return keep, idx[:k], v


@njit(cache=True, nogil=True, error_model="numpy")
def confidence_plain(raw, conf, odds, cum, threshold):
    """`confidence.keep_drafting`'s mask before the cost rule's depth: the acceptance c = 1 / (conf + 1) where
    `odds` (conf: the odds `ConfidenceCalibration.odds` gives), else conf itself; where raw is not NaN, cum x c
    (in place) and keep where c >= threshold; cum = 0 and no keep where it is NaN (`confidence_keep`'s rule)."""
    n = raw.shape[0]
    keep = np.zeros(n, np.bool_)
    for i in range(n):
        if math.isnan(raw[i]):
            cum[i] = 0.0
            continue
        c = 1.0 / (conf[i] + 1.0) if odds else conf[i]
        cum[i] = cum[i] * c
        keep[i] = c >= threshold
    return keep


@njit(cache=True, nogil=True)
def confidence_drafting(raw, conf, odds, cum, threshold, depths, position, rates, drafted, remaining, draft, verify,
                        pad, G):
    """`confidence.keep_drafting`'s mask past the cost rule's depth: `confidence_plain`'s rows (and cum), of them
    those planned deeper than position + 1 valued cum x rates[min(position + 1, size - 1)], and the mask
    `search.keep_by_margin` picks among them (one row: `keep_one`, more: `keep_margin` without the ratio; x = the
    sum of drafted; pad[min(position + 1, size - 1)] where pad is not empty). The caller checks the lengths: draft
    longer than the batch, rates and verify not empty."""
    keep = confidence_plain(raw, conf, odds, cum, threshold)
    idx = np.empty(keep.shape[0], np.int64)
    m = 0
    for i in range(keep.shape[0]):
        if keep[i] and depths[i] > position + 1:
            idx[m] = i
            m += 1
        keep[i] = False
    if m == 0:
        return keep
    rate = rates[min(position + 1, rates.shape[0] - 1)]
    has_pad = pad.shape[0] > 0
    padp = pad[min(position + 1, pad.shape[0] - 1)] if has_pad else 0.0
    x = drafted.sum()
    if m == 1:
        keep[idx[0]] = keep_one(cum[idx[0]] * rate, x, draft, verify, padp, has_pad, G)[0]
        return keep
    v = np.empty(m)
    for j in range(m):
        v[j] = cum[idx[j]] * rate
    keep_margin(keep, idx[:m], v, remaining, x, draft, verify, padp, has_pad, G, 0.0, 1.0, False)
    return keep


@njit(cache=True, nogil=True)
def scaled_tokens(col, f):
    """`search.uniform_depth`'s draining rows at the batch's level: e[k, i] = mean_k(col[k] over the n rows) x
    f[k, i] / mean_k(f[k]), the means as np.mean's (np.sum's order, then / n)."""
    K, n = f.shape
    e = np.empty((K, n))
    row = np.empty(n)
    for k in range(K):
        row[:] = col[k]
        m = (0.0 + pairwise(row, 0, n)) / n
        fm = (0.0 + pairwise(f[k], 0, n)) / n
        for i in range(n):
            e[k, i] = m * f[k, i] / fm
    return e


@njit(cache=True, nogil=True)
def ratio_best(num, S, T):
    """The first k maximising num / (S[k] x T[k]) (np.argmax's rule), and that value."""
    best, bg = 0, 0.0
    for k in range(S.shape[0]):
        g = num / (S[k] * T[k])
        if k == 0 or (not math.isnan(bg) and (g > bg or math.isnan(g))):
            best, bg = k, g
    return best, bg


@njit(cache=True, nogil=True, error_model="numpy")
def finish_moments(e, e3, rem, mu, sd):
    """`search._steps_to_finish`'s normal approximation: per depth k and row i, the mean rem_i / e[k, i] steps and
    its sd, sqrt(rem_i x max(L2 - (e - 1)^2, 0) / e3), L2[k] the running sum over p < k of (2p + 1) x
    (e[p + 1] - e[p]) (np.cumsum's order); e3 = e ** 3 (numpy's power). Written into mu and sd."""
    K, n = e.shape
    L = np.zeros(n)   # per row, the running sum (depth by depth over the rows: loops the compiler vectorises)
    for k in range(K):
        c = 2.0 * (k - 1) + 1.0
        for i in range(n):
            if k > 0:
                t = c * (e[k, i] - e[k - 1, i])
                L[i] = t if k == 1 else L[i] + t
            w = e[k, i] - 1.0
            v = L[i] - w * w
            mu[k, i] = rem[i] / e[k, i]
            sd[k, i] = math.sqrt(rem[i] * (v if v >= 0.0 or math.isnan(v) else 0.0) / e3[k, i])   # np.maximum


# ---- the drain's expected maxima (drain.expected_maxes) --------------------------------------------------
# numpy's tanh and power (vector code whose last bits differ from libm's) run between these kernels on the
# gathered arguments. A CDF argument above SATURATED has tanh exactly 1, so its CDF, its power and its factor in
# the product are exactly 1: the arguments rise along the grid, and each group's are cut where they pass it.
SATURATED = 19.5   # (tanh(19.5) = 1 - 2.3e-17: 1.0 correctly rounded; numpy's too, tests/test_kit.py checks)
Z_SATURATED = 7.268554499657057   # about the z where (z + 0.044715 z^3) x 0.7978845608028654 reaches SATURATED
_CDF, _RAISED, _SQUARED = 0, 1, 2   # a group's factor: its CDF; its CDF ** count (numpy's power); its CDF squared


@njit(cache=True, nogil=True, error_model="numpy")
def drain_setup(mu, sd, points):
    """expected_maxes' groups and tanh arguments for the rows d of [D, n] arrays (the same operations): per row
    with a proper grid (`_drain_bounds`), `drain._row_groups`' distinct (mu, sd) pairs (ascending) among the rows
    with sd > 0 and mu + 6 sd > lo, and per group the tanh arguments of its grid points below saturation. Returns
    (the arguments, the groups raised by numpy's power first; those groups' exponents, one per argument; the
    groups [G, 5]: row d, offset in the arguments, size, factor kind (`_drain_row_groups`), first grid point
    (`_drain_start`))."""
    D, n = mu.shape
    x, groups = np.empty((D, points)), np.empty((D * n, 5), np.int64)
    gm, gs, count = np.empty(D * n), np.empty(D * n), np.empty(D * n)
    g = _drain_groups(mu, sd, points, x, groups, gm, gs, count, np.zeros(D, np.bool_))
    return _drain_arguments(x, groups[:g], gm, gs, count)


@njit(cache=True, nogil=True, error_model="numpy")
def _drain_groups(mu, sd, points, x, groups, gm, gs, count, skip):
    """drain_setup's grids (x [D, points]) and groups (groups [D n, 5] and their pairs and counts gm, gs, count, at
    least D n long), each group's arguments from its row's `_drain_start` to its saturation, none for the rows d
    with skip[d]: returns the number of groups."""
    D, n = mu.shape
    perm = np.arange(n)   # the columns, the last row's near ones first in their (mu, sd) order: the next sort's start
    m, s, ids, rest = np.empty(n), np.empty(n), np.empty(n, np.int64), np.empty(n, np.int64)
    g = 0
    for d in range(D):
        lo, hi, step, odd = _drain_bounds(mu, sd, d, points)
        if odd or skip[d]:
            continue
        _drain_grid(x[d], lo, hi, step)
        k, r = 0, 0
        for j in range(n):
            i = perm[j]
            if sd[d, i] > 0.0 and mu[d, i] + 6.0 * sd[d, i] > lo:
                m[k], s[k], ids[k] = mu[d, i], sd[d, i], i
                k += 1
            else:
                rest[r] = i
                r += 1
        _sort_pairs(m, s, ids, k)
        perm[:k], perm[k:] = ids[:k], rest[:r]
        first = g
        g = _drain_row_groups(groups, gm, gs, count, g, d, m[:k], s[:k], x[d], lo, step)
        start = _drain_start(x[d], gm, gs, count, first, g)
        for q in range(first, g):
            groups[q, 2], groups[q, 4] = max(groups[q, 2] - start, 0), start
    return g


@njit(cache=True, nogil=True, inline="always")
def _drain_bounds(mu, sd, d, points):
    """Row d's grid: lo = max(mu - 6 sd), hi = max(mu + 6 sd) (np.max's: NaN wins), step = (hi - lo) / (points - 1),
    and whether it is degenerate or not finite (the caller's one-row form). Four running maxima of every fourth
    row (the order of a maximum can only change the sign of a zero bound, which no sum depends on)."""
    m, s, n = mu[d], sd[d], mu.shape[1]
    a0, b0 = m[0] - 6.0 * s[0], m[0] + 6.0 * s[0]
    a1, b1, a2, b2, a3, b3 = a0, b0, a0, b0, a0, b0
    top = 1 + (n - 1) // 4 * 4
    for r in range(1, top, 4):
        a0, b0 = maximum(a0, m[r] - 6.0 * s[r]), maximum(b0, m[r] + 6.0 * s[r])
        a1, b1 = maximum(a1, m[r + 1] - 6.0 * s[r + 1]), maximum(b1, m[r + 1] + 6.0 * s[r + 1])
        a2, b2 = maximum(a2, m[r + 2] - 6.0 * s[r + 2]), maximum(b2, m[r + 2] + 6.0 * s[r + 2])
        a3, b3 = maximum(a3, m[r + 3] - 6.0 * s[r + 3]), maximum(b3, m[r + 3] + 6.0 * s[r + 3])
    for r in range(top, n):
        a0, b0 = maximum(a0, m[r] - 6.0 * s[r]), maximum(b0, m[r] + 6.0 * s[r])
    a, b = maximum(maximum(a0, a1), maximum(a2, a3)), maximum(maximum(b0, b1), maximum(b2, b3))
    step = (b - a) / (points - 1)
    return a, b, step, not (math.isfinite(a) and math.isfinite(b) and b - a > 0.0 and step != 0.0)


@njit(cache=True, nogil=True, inline="always")
def _drain_grid(x, lo, hi, step):
    """x[i] = i x step + lo, the last point hi (drain._linspace)."""
    last = x.shape[0] - 1
    for i in range(last):
        x[i] = float(i) * step + lo
    x[last] = hi


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _cdf_argument(x, m, s):
    """The argument of tanh in `drain.normal_cdf((x - m) / s)`, in its operations' order."""
    z = (x - m) / s
    return (z + 0.044715 * z * z * z) * 0.7978845608028654


@njit(cache=True, nogil=True)
def _sort_pairs(m, s, ids, k):
    """Sorts m[:k] ascending, ties by s, in place (ids along): insertion from the order given (a few moves where it
    is nearly sorted); past 4 k + 16 moves, numba's argsort and an insertion of the ties. The pairs are finite."""
    moves = 0
    for i in range(1, k):
        j, a, b, o = i, m[i], s[i], ids[i]
        while j > 0 and (m[j - 1] > a or (m[j - 1] == a and s[j - 1] > b)):
            m[j], s[j], ids[j] = m[j - 1], s[j - 1], ids[j - 1]
            j -= 1
        m[j], s[j], ids[j] = a, b, o
        moves += i - j
        if moves > 4 * k + 16:
            order = np.argsort(m[:k])
            for q in range(1, k):
                j, o = q, order[q]
                while j > 0 and m[order[j - 1]] == m[o] and s[order[j - 1]] > s[o]:
                    order[j] = order[j - 1]
                    j -= 1
                order[j] = o
            m[:k], s[:k], ids[:k] = m[order], s[order], ids[order]
            return


@njit(cache=True, nogil=True)
def _drain_row_groups(groups, gm, gs, count, g, d, m, s, x, lo, step):
    """Appends row d's groups from its sorted pairs (m, s) at g: (d, -, the number of grid points below
    saturation, kind), their pair and count. The kind of a group: `_CDF` where all of the row's counts are 1 or
    its count is 1 (x ** 1 is x exactly), `_SQUARED` where it is the row's only group and counts 2 (numpy's fast
    path for a size-1 exponent of 2), else `_RAISED`. Returns the groups' new end."""
    first = g
    for j in range(m.shape[0]):
        if j > 0 and m[j] == gm[g - 1] and s[j] == gs[g - 1]:
            count[g - 1] += 1.0
        else:
            groups[g, 0], groups[g, 2] = d, _saturation(x, m[j], s[j], lo, step)
            gm[g], gs[g], count[g] = m[j], s[j], 1.0
            g += 1
    high = False
    for q in range(first, g):
        high |= count[q] != 1.0
    for q in range(first, g):
        kind = _CDF if not high or count[q] == 1.0 else _RAISED
        groups[q, 3] = _SQUARED if kind == _RAISED and g - first == 1 and count[q] == 2.0 else kind
    return g


@njit(cache=True, nogil=True, error_model="numpy")
def _saturation(x, m, s, lo, step):
    """The first i with `_cdf_argument(x[i], m, s)` > SATURATED (x.size where none): the guess from Z_SATURATED
    checked and its neighbour, else a bisection in what is left (the arguments do not fall along the grid)."""
    a, b = 0, x.shape[0]
    guess = (m + Z_SATURATED * s - lo) / step
    if 1.0 <= guess < b - 1:
        h = int(guess)
        if _cdf_argument(x[h], m, s) > SATURATED:
            a, b = (h if not _cdf_argument(x[h - 1], m, s) > SATURATED else a), h
        else:
            a, b = h + 1, (h + 1 if _cdf_argument(x[h + 1], m, s) > SATURATED else b)
    while a < b:
        h = (a + b) // 2
        if _cdf_argument(x[h], m, s) > SATURATED:
            b = h
        else:
            a = h + 1
    return a


@njit(cache=True, nogil=True, error_model="numpy")
def _drain_arguments(x, groups, gm, gs, count):
    """drain_setup's returns: the groups' offsets (the `_RAISED` groups first), their tanh arguments, the
    exponents of the `_RAISED` ones."""
    k, kp = _drain_offsets(groups)
    args, power = np.empty(k), np.empty(kp)
    _drain_fill(x, groups, gm, gs, count, args, power)
    return args, power, groups


@njit(cache=True, nogil=True)
def _drain_offsets(groups):
    """Sets the groups' offsets in the arguments (the `_RAISED` groups first); returns (the arguments' number,
    the `_RAISED` groups' arguments' number)."""
    k, kp = 0, 0
    for raised in (True, False):
        for q in range(groups.shape[0]):
            if (groups[q, 3] == _RAISED) == raised:
                groups[q, 1] = k
                k += groups[q, 2]
        if raised:
            kp = k
    return k, kp


@njit(cache=True, nogil=True, error_model="numpy")
def _drain_fill(x, groups, gm, gs, count, args, power):
    """The groups' tanh arguments (`_cdf_argument`) at their offsets in args, and the `_RAISED` ones' exponents
    (their counts) at the same places in power."""
    for q in range(groups.shape[0]):
        o, size = groups[q, 1], groups[q, 2]
        xq, aq, mq, sq = x[groups[q, 0], groups[q, 4]:], args[o:o + size], gm[q], gs[q]
        for i in range(size):
            aq[i] = _cdf_argument(xq[i], mq, sq)
        if groups[q, 3] == _RAISED:
            power[o:o + size] = count[q]


@njit(cache=True, nogil=True)
def drain_bases(t):
    """The CDFs (t + 1) x 0.5 from t = tanh(argument), in place: the bases numpy's power raises."""
    for j in range(t.shape[0]):
        t[j] = (t[j] + 1.0) * 0.5


@njit(cache=True, nogil=True, error_model="numpy")
def drain_sums(t, groups, mu, sd, points):
    """Per row d of [D, n] arrays with a proper grid: lo + the trapezoid sum (np.sum's pairwise order) of 1 - F
    over the grid, F the product (in group order, from 1) of its groups' factors over their sizes (the saturated
    ones are 1): from t = tanh(argument), (t + 1) x 0.5 (`_CDF`), its square (`_SQUARED`), or t itself (`_RAISED`:
    numpy's power of the CDF), times (x >= the largest mu of the rows with sd <= 0) where row d has any. The other
    rows: NaN, but the largest mu where lo and hi are finite and hi <= lo. Returns (the sums, whether any is NaN)."""
    out = np.empty(mu.shape[0])
    return out, _drain_sums_into(t, groups, mu, sd, points, out, np.zeros(mu.shape[0], np.bool_))


@njit(cache=True, nogil=True, error_model="numpy")
def _drain_sums_into(t, groups, mu, sd, points, out, skip):
    """drain_sums written into out, inf for the rows d with skip[d]; returns whether any is NaN."""
    D, n = mu.shape
    x, F, terms = np.empty(points), np.empty(points), np.empty(points - 1)
    stack, vals = np.empty((3, 64), np.int64), np.empty(64)   # pairwise_into's
    g, again = 0, False
    for d in range(D):
        if skip[d]:
            out[d] = np.inf
            continue
        lo, hi, step, odd = _drain_bounds(mu, sd, d, points)
        if odd:
            out[d] = mu[d].max() if math.isfinite(lo) and math.isfinite(hi) and hi - lo <= 0.0 else np.nan
            again |= math.isnan(out[d])
            continue
        _drain_grid(x, lo, hi, step)
        F[:] = 1.0
        start = 0
        while g < groups.shape[0] and groups[g, 0] == d:
            start = groups[g, 4]
            _drain_factor(F[start:], t[groups[g, 1]:groups[g, 1] + groups[g, 2]], groups[g, 3])
            g += 1
        F[:start] = 0.0   # (1 - F is 1.0 there: `_drain_start`)
        cut, top = False, -math.inf
        for r in range(n):
            if not sd[d, r] > 0.0:
                cut, top = True, maximum(top, mu[d, r])
        if cut:
            for i in range(points):
                F[i] = F[i] * (1.0 if x[i] >= top else 0.0)
        for i in range(points - 1):
            terms[i] = (x[i + 1] - x[i]) * ((1.0 - F[i + 1]) + (1.0 - F[i])) / 2.0
        out[d] = lo + (0.0 + pairwise_into(terms, 0, points - 1, stack, vals))
        again |= math.isnan(out[d])
    return again


@njit(cache=True, nogil=True, inline="always")
def _drain_factor(F, t, kind):
    """F[:t.size] x= one group's factors (drain_sums) from its t."""
    if kind == _RAISED:
        for i in range(t.shape[0]):
            F[i] = F[i] * t[i]
    elif kind == _CDF:
        for i in range(t.shape[0]):
            F[i] = F[i] * ((t[i] + 1.0) * 0.5)
    else:
        for i in range(t.shape[0]):
            f = (t[i] + 1.0) * 0.5
            F[i] = F[i] * (f * f)


@njit(cache=True, nogil=True)
def finish_setup(e, e3, rem, points):
    """`search._steps_to_finish`'s moments (`finish_moments` into new arrays mu, sd) and `drain_setup` on them, in
    one call: (mu, sd, the tanh arguments, the exponents, the groups)."""
    mu, sd = np.empty(e.shape), np.empty(e.shape)
    finish_moments(e, e3, rem, mu, sd)
    args, power, groups = drain_setup(mu, sd, points)
    return mu, sd, args, power, groups


# ---- goodput's per-step loops: its estimates, weights, position search, keep gate and evidence (numpy's pairwise
# sums as `pairwise`, its sorts' order as `argsort2`, np.round as `round_to`; exp and log stay numpy calls between
# these kernels). In this file with the loops they call: numba's disk cache does not follow calls across files.


@njit(cache=True, nogil=True)
def _block(a, lo, n):
    """numpy's pairwise sum of at most 128 values: a plain loop below 8, else 8 accumulators."""
    if n < 8:
        res = 0.0
        for i in range(n):
            res += a[lo + i]
        return res
    r0, r1, r2, r3 = a[lo], a[lo + 1], a[lo + 2], a[lo + 3]
    r4, r5, r6, r7 = a[lo + 4], a[lo + 5], a[lo + 6], a[lo + 7]
    i = 8
    while i < n - n % 8:
        j = lo + i
        r0 += a[j]
        r1 += a[j + 1]
        r2 += a[j + 2]
        r3 += a[j + 3]
        r4 += a[j + 4]
        r5 += a[j + 5]
        r6 += a[j + 6]
        r7 += a[j + 7]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        res += a[lo + i]
        i += 1
    return res


@njit(cache=True, nogil=True)
def pairwise(a, lo, n):
    """numpy's float sum of a[lo:lo + n] (np.sum over a contiguous axis): `_block` up to 128 values, above that
    the sum of two halves (the first a multiple of 8), evaluated with an explicit stack (no recursion:
    `pairwise_into`)."""
    if n <= 128:
        return _block(a, lo, n)
    return pairwise_into(a, lo, n, np.empty((3, 64), np.int64), np.empty(64))


@njit(cache=True, nogil=True)
def pairwise_into(a, lo, n, stack, vals):
    """`pairwise` with its stack given (stack [3, 64] int64: a part's start, size and state; vals [64]): a loop
    that sums many rows allocates it once."""
    if n <= 128:
        return _block(a, lo, n)
    top, nv = 0, 0
    stack[0, 0], stack[1, 0], stack[2, 0] = lo, n, 0
    while top >= 0:
        b, m, st = stack[0, top], stack[1, top], stack[2, top]
        top -= 1
        if m <= 128:
            vals[nv] = _block(a, b, m)
            nv += 1
        elif st == 1:   # both halves done: left below right
            vals[nv - 2] = vals[nv - 2] + vals[nv - 1]
            nv -= 1
        else:
            h = m // 2
            h -= h % 8
            stack[0, top + 1], stack[1, top + 1], stack[2, top + 1] = b, m, 1
            stack[0, top + 2], stack[1, top + 2], stack[2, top + 2] = b + h, m - h, 0
            stack[0, top + 3], stack[1, top + 3], stack[2, top + 3] = b, h, 0
            top += 3
    return vals[0]


@njit(cache=True, nogil=True, inline="always")
def _less(a, b):
    """numpy's sort order: a before b (NaN last)."""
    return a < b or (b != b and a == a)


@njit(cache=True, nogil=True)
def argsort2(k1, k2):
    """np.lexsort((k2, k1)): the stable order by k1, then k2 (a bottom-up merge sort)."""
    n = k1.shape[0]
    buf = np.empty((2, n), np.int64)
    for i in range(n):
        buf[0, i] = i
    src, width = 0, 1
    while width < n:
        dst = 1 - src
        for lo in range(0, n, 2 * width):
            mid, hi = min(lo + width, n), min(lo + 2 * width, n)
            i, j, k = lo, mid, lo
            while i < mid and j < hi:
                x, y = buf[src, j], buf[src, i]
                if _less(k1[x], k1[y]) or (not _less(k1[y], k1[x]) and _less(k2[x], k2[y])):
                    buf[dst, k] = x
                    j += 1
                else:
                    buf[dst, k] = y
                    i += 1
                k += 1
            while i < mid:
                buf[dst, k] = buf[src, i]
                i += 1
                k += 1
            while j < hi:
                buf[dst, k] = buf[src, j]
                j += 1
                k += 1
        src, width = dst, 2 * width
    return buf[src].copy()


@njit(cache=True, nogil=True)
def round_to(x, scale):
    """np.round(x, d) for scale = 10.0 ** d: x x scale, rounded half to even, / scale."""
    return np.rint(x * scale) / scale


@njit(cache=True, nogil=True)
def minimum(a, b):
    """np.minimum's rule for floats (NaN in a wins)."""
    return a if (a <= b or a != a) else b


@njit(cache=True, nogil=True)
def maximum(a, b):
    """np.maximum's rule for floats (NaN in a wins)."""
    return a if (a >= b or a != a) else b


@njit(cache=True, nogil=True)
def keep_margin(keep, idx, v, remaining, x, draft, verify, padp, has_pad, G, E, T, has_ratio):
    """`search.keep_by_margin` over two or more rows idx (values v): ranked by (-round(v, 6), -remaining) as
    np.lexsort (`_rank_values`), the best count by `margin_gains` (x: the tokens drafted so far); the rows kept
    set in `keep`. Returns (kept any, their value, their seconds)."""
    order = _rank_values(v, remaining, idx)
    m = idx.shape[0]
    vs = np.empty(m)
    for j in range(m):
        vs[j] = v[order[j]]
    best, gain, gain_v, dt = margin_gains(vs, draft, verify, x, verify.shape[0] - 1, padp, has_pad, G, E, T,
                                          has_ratio)
    if gain > 0:
        for j in range(best + 1):
            keep[idx[order[j]]] = True
        return True, gain_v, dt
    return False, gain_v, dt


@njit(cache=True, nogil=True)
def _rank_values(v, remaining, idx):
    """np.lexsort((-remaining[idx], -np.round(v, 6))): the order of distinct integer keys (rint(v 1e6) descending,
    then remaining descending, then position: the same order, as -q / 1e6 orders alike with -q), where v is in
    [0, 2) and remaining in [0, 2^20): each key's place is the count of keys below it (up to `_RANK_COUNTED` keys; more:
    one sort of the keys); else `argsort2` on those keys."""
    m = idx.shape[0]
    keys = np.empty(m, np.int64)
    low = (1 << 20) - 1
    for j in range(m):
        q, r = np.rint(v[j] * 1e6), remaining[idx[j]]
        if not (0.0 <= q < 2e6 and 0 <= r <= low and m <= low):
            k1 = np.empty(m)
            for i in range(m):
                k1[i] = -round_to(v[i], 1e6)
            return argsort2(k1, -remaining[idx])
        keys[j] = ((2000000 - np.int64(q)) << 40) | ((low - np.int64(r)) << 20) | j
    if m > _RANK_COUNTED:
        keys.sort()
        for j in range(m):
            keys[j] = keys[j] & low
        return keys
    order = np.empty(m, np.int64)
    for i in range(m):
        k, below = keys[i], 0
        for j in range(m):
            below += keys[j] < k
        order[below] = i
    return order


_RANK_COUNTED = 256   # (`_rank_values`: m^2 branch-free comparisons beat the sort's branches up to here)


@njit(cache=True, nogil=True)
def drafting_keep(keep, conf, position, f, drafted, E, T, s, cal, depths, a, fs, w, has_w, planned, has_ratio,
                  remaining, draft, verify, pad, G):
    """`goodput_gates.Drafting.keep` in one pass, the mask written to `keep` (n bools): s <- s x min(confidence (0
    where not drafting) x cal, 1); the rows drafting that planned past position + 1 valued s x min(a x f, 0.999)
    (x w; f: fs[position + 1] where fs reaches it); one row by `keep_one`'s floats, more by `keep_margin` (a padded
    verify: + pad[min(position + 1, size - 1)]); `has_ratio` and every row at its plan's end: against the ratio
    [E, T]. Returns (1 where the ratio grows, else 0; -1, nothing written: a row vector not n long; by what value
    and seconds it grows)."""
    n = s.shape[0]
    if not (conf.shape[0] == cal.shape[0] == depths.shape[0] == a.shape[0] == planned.shape[0] == n
            and remaining.shape[0] == n and (w.shape[0] == n or not has_w)):
        return -1, 0.0, 0.0
    j1 = position + 1
    if j1 < fs.shape[0]:
        f = fs[j1]
    has_pad = pad.shape[0] > 0
    padp = pad[min(j1, pad.shape[0] - 1)] if has_pad else 0.0
    idx = np.empty(n, np.int64)
    m = _drafting_rows(keep, conf, s, cal, depths, j1, idx)
    if m == 0:
        return 0, 0.0, 0.0
    v = np.empty(m)
    past = has_ratio
    for j in range(m):
        i = idx[j]
        v[j] = s[i] * minimum(a[i] * f, 0.999)
        if has_w:
            v[j] = v[j] * w[i]
        past = past and planned[i] <= j1
    x = 0
    for i in range(drafted.shape[0]):
        x += drafted[i]
    if m > 1:
        got, gv, dt = keep_margin(keep, idx[:m], v, remaining, x, draft, verify, padp, has_pad, G, E, T, past)
        return 1 if got and past else 0, gv, dt
    ok, dt = keep_one(v[0], x, draft, verify, padp, has_pad, E / T if past else G)
    keep[idx[0]] = ok
    return 1 if ok and past else 0, v[0], dt


@njit(cache=True, nogil=True)
def keep_one(v, x, draft, verify, padp, has_pad, G):
    """`search._keep_one`'s test for one row worth v: v - G x (draft[1] + the verify's growth past x tokens (+
    padp)) > 0. Returns (kept, the seconds)."""
    last = verify.shape[0] - 1
    dt = draft[1] + verify[min(x + 1, last)] - verify[min(x, last)]
    if has_pad:
        dt = dt + padp
    return v - G * dt > 0, dt


@njit(cache=True, nogil=True)
def evidence_counts(drafted, accepted, conf, table, cols):
    """`goodput_evidence.Evidence.observe`'s counts: per row the rejection (accepted < drafted), the verified drafts
    min(drafted, accepted + 1), the confidence sum over the drafted positions and over the verified ones (NaN as
    0, each np.sum's pairwise order), added to the per-request `table`'s columns `cols` (accepted, rejected,
    conf_sum, drafted, verified_conf, verified). Returns (the verified and the accepted positions' masks, the
    batch's sums of accepted, rejected, confidence, drafted, verified confidence and verified, the drafted rows'
    mean depth)."""
    n, K = conf.shape
    verified = np.zeros((n, K), np.bool_)
    acc_mask = np.zeros((n, K), np.bool_)
    for i in range(n):
        ver, a = min(drafted[i], accepted[i] + 1), accepted[i]
        for j in range(K):
            verified[i, j] = j < ver
            acc_mask[i, j] = j < a
    return (verified, acc_mask) + _evidence_rows(drafted, accepted, conf, table, cols, np.empty(0), False,
                                                 np.empty((4, 0)))


@njit(cache=True, nogil=True)
def _any_nan(S, key):
    """Whether S or key hold NaN (which `rank_columns` does not rank)."""
    for i in range(S.shape[0]):
        if math.isnan(key[i]):
            return True
        for p in range(S.shape[1]):
            if math.isnan(S[i, p]):
                return True
    return False


@njit(cache=True, nogil=True)
def rank_columns(S, key, order, done, upto):
    """Columns done..upto-1 of np.lexsort((key[:, None] broadcast, -S), axis=0) into `order`, for S and key
    without NaN: per position, the rows by S descending, then key, then row. Column 0 by `argsort2`; each later
    one by insertion from the column before (nearly its order: few moves)."""
    n = S.shape[0]
    col = np.empty(n)
    if done == 0 and upto > 0:
        for i in range(n):
            col[i] = -S[i, 0]
        order[:, 0] = argsort2(col, key)
        done = 1
    if done >= upto:
        return
    cur = order[:, done - 1].copy()
    for p in range(done, upto):
        for i in range(n):
            col[i] = S[i, p]
        for j in range(1, n):
            x = cur[j]
            sx, kx = col[x], key[x]
            q = j
            while q > 0:
                y = cur[q - 1]
                sy = col[y]
                if sy > sx or (sy == sx and (key[y] < kx or (key[y] == kx and y < x))):
                    break
                cur[q] = y
                q -= 1
            cur[q] = x
        order[:, p] = cur


@njit(cache=True, nogil=True)
def nested_search(S, key, order, ranked, K, G, ver, dr, pad, has_pad, n, base):
    """`kernels.nested_by_position` over the first D columns, the columns ranked first (D from 2 or the columns
    ranked by an earlier call, doubled while the search reaches D < K; `ranked[0]`: the columns of `order` ranked
    so far, across calls): the positions past where it stops are never ranked. The same result as over all K (the
    loop over the first D positions is the same). Returns (the m per position, their count, value, seconds)."""
    D = min(K, max(2, ranked[0]))
    while True:
        if ranked[0] < D:
            rank_columns(S, key, order, ranked[0], D)
            ranked[0] = D
        ms, m, e, t = nested_by_position(S, order, D, G, ver, dr, pad, has_pad, n, base)
        if m < D or D == K:
            return ms, m, e, t
        D = min(2 * D, K)


@njit(cache=True, nogil=True)
def row_estimates(num, den, cal, kb, k, cap, confidence, tol):
    """`goodput_evidence.row_estimates` per row: confidence, (num + kb) / (den + k) x min(cal, cap) (num, den: the
    conf_sum and drafted), else counts, (num + kb) / (num + den + k) (num, den: accepted, rejected); clipped to
    [1e-3, 0.999], rounded to 4 decimals and tied (`tie_bands`; a's order as its 1e4 multiples', by
    `rounded_order`). Returns (a, False) on NaN."""
    n = num.shape[0]
    a, q = np.empty(n), np.empty(n, np.int64)
    counted = True
    for i in range(n):
        x = (num[i] + kb) / ((den[i] if confidence else num[i] + den[i]) + k)
        if confidence:
            x = x * minimum(cal[i], cap)
        x = minimum(maximum(x, 1e-3), 0.999) if x == x else x
        r = np.rint(x * 1e4)   # (`round_to(x, 1e4)`, its integer kept)
        a[i] = r / 1e4
        counted = counted and 0.0 <= r < 16384.0
        q[i] = np.int64(r) if counted else 0
    if not counted or tol <= 0.0 or n < 2:
        return tie_bands(a, tol)
    return tie_means(a, rounded_order(q), tol), True


@njit(cache=True, nogil=True)
def row_calibration(acc, vc, ver, cal, z):
    """`goodput_evidence.row_calibration` past its early outs for z and the batch: the rows with verified drafts
    and confidence (two or more, else every row at `cal`), their binomial variance and excess spread (np.sum's
    pairwise order), and where the spread beats z standard errors, each row shrunk toward `cal`."""
    n = acc.shape[0]
    out = np.full(n, cal)
    at = np.empty(n, np.int64)
    m = 0
    for i in range(n):
        if ver[i] > 0 and vc[i] > 0:
            at[m] = i
            m += 1
    if m < 2:
        return out
    sq, var, vv, cc = np.empty(m), np.empty(m), np.empty(m), np.empty(m)
    for j in range(m):
        i = at[j]
        e = cal * vc[i]
        var[j] = maximum(e * (1.0 - minimum(e / ver[i], 1.0)), 0.25)
        d = acc[i] - e
        sq[j] = d * d
        vv[j] = var[j] * var[j]
        cc[j] = vc[i] * vc[i]
    excess = pairwise(sq, 0, m) - pairwise(var, 0, m)
    if excess <= z * math.sqrt(2.0 * pairwise(vv, 0, m)):
        return out
    tau2 = excess / pairwise(cc, 0, m)
    for j in range(m):
        i = at[j]
        t = tau2 * vc[i] * vc[i]
        w = t / (t + var[j])
        out[i] = maximum(cal + w * (acc[i] / vc[i] - cal), 0.0)
    return out


@njit(cache=True, nogil=True)
def mixture_log(A, E, grid, ex, logprior):
    """`Evidence._mixture`'s log posterior on the grid, logprior + A grid - E exp(grid), less its maximum (NaN
    propagates as in ndarray.max)."""
    ll = np.empty(grid.shape[0])
    top = -math.inf
    for i in range(grid.shape[0]):
        ll[i] = logprior[i] + A * grid[i] - E * ex[i]
        if not (ll[i] <= top) and not math.isnan(top):
            top = ll[i]
    for i in range(grid.shape[0]):
        ll[i] = ll[i] - top
    return ll


@njit(cache=True, nogil=True)
def mixture_median(w, grid):
    """`Evidence._mixture`'s median of log c: np.interp of half the mass (np.sum's order) on the cdf
    cumsum(w) - w / 2 at the grid (numpy's binary search from guess 0 and its slope rule). Returns (log c,
    False) where w holds NaN (the numpy form decides)."""
    n = w.shape[0]
    cdf = np.empty(n)
    acc = 0.0
    for i in range(n):
        if math.isnan(w[i]):
            return 0.0, False
        acc = w[0] if i == 0 else acc + w[i]
        cdf[i] = acc - 0.5 * w[i]
    x = 0.5 * pairwise(w, 0, n)
    if math.isnan(x):
        return x, True
    j = _search_with_guess(x, cdf, n, 0)
    if j == -1:
        return grid[0], True
    if j == n or j == n - 1 or cdf[j] == x:
        return grid[n - 1] if j == n else grid[j], True
    return _interp_step(x, cdf[j], cdf[j + 1], grid[j], grid[j + 1]), True


@njit(cache=True, nogil=True)
def _search_with_guess(key, arr, n, guess):
    """numpy's binary_search_with_guess (np.interp's): i with arr[i] <= key < arr[i + 1], -1 below, n above."""
    if key > arr[n - 1]:
        return n
    if key < arr[0]:
        return -1
    if n <= 4:
        i = 1
        while i < n and key >= arr[i]:
            i += 1
        return i - 1
    guess = max(min(guess, n - 3), 1)
    imin, imax = 0, n
    if key < arr[guess]:
        if key >= arr[guess - 1]:
            return guess - 1
        imax = guess - 1
        if guess > 8 and key >= arr[guess - 8]:
            imin = guess - 8
    else:
        if key < arr[guess + 1]:
            return guess
        if key < arr[guess + 2]:
            return guess + 1
        imin = guess + 2
        if guess < n - 8 - 1 and key < arr[guess + 8]:
            imax = guess + 8
    while imin < imax:
        imid = imin + ((imax - imin) >> 1)
        if key >= arr[imid]:
            imin = imid + 1
        else:
            imax = imid
    return imin - 1


@njit(cache=True, nogil=True)
def survivals(a, f, remaining, K):
    """`Goodput._estimate`'s slot survivals: S0[i, p] = prod over q <= p of min(a_i f_q, 0.999) (np.cumprod's
    order), S the same with 0 from row i's cap on (`search.draft_caps`: min(max(remaining - 1, 0), K)).
    Returns (S0, S, the caps) (`survivals_into`)."""
    n = a.shape[0]
    S0, S = np.empty((n, K)), np.empty((n, K))
    cap = np.empty(n, np.int64)
    survivals_into(a, f, remaining, K, S0, S, cap)
    return S0, S, cap


@njit(cache=True, nogil=True)
def survivals_into(a, f, remaining, K, S0, S, cap):
    """`survivals` into S0, S [n, K] and cap [n]."""
    for i in range(a.shape[0]):
        cap[i] = min(max(remaining[i] - 1, 0), K)
        acc = 1.0
        for p in range(K):
            x = minimum(a[i] * f[p], 0.999)
            acc = x if p == 0 else acc * x
            S0[i, p] = acc
            S[i, p] = 0.0 if p >= cap[i] else acc


@njit(cache=True, nogil=True)
def tokens_per_step(S, lo, frac):
    """`goodput_weights.tokens_per_step` at depth d = lo + frac: 1 + C[lo] + frac x (C[min(lo + 1, K)] - C[lo]),
    C[j] the sum of a row's first j survivals (np.cumsum's order)."""
    n, K = S.shape
    hi = min(lo + 1, K)
    e = np.empty(n)
    for i in range(n):
        acc, c_lo, c_hi = 0.0, 0.0, 0.0
        for j in range(hi):
            acc = S[i, 0] if j == 0 else acc + S[i, j]
            if j + 1 == lo:
                c_lo = acc
            if j + 1 == hi:
                c_hi = acc
        e[i] = 1.0 + c_lo + frac * (c_hi - c_lo)
    return e


@njit(cache=True, nogil=True)
def _top(x):
    """ndarray.max's value (NaN propagates)."""
    top = x[0]
    for i in range(1, x.shape[0]):
        if math.isnan(top):
            break
        if x[i] > top or math.isnan(x[i]):
            top = x[i]
    return top


@njit(cache=True, nogil=True)
def slot_weights(S0, lo, frac):
    """`goodput_weights.slot_weights`: 1 / e_i (`tokens_per_step`) over its maximum (`slot_weights_into`)."""
    w = np.empty(S0.shape[0])
    slot_weights_into(S0, lo, frac, w)
    return w


@njit(cache=True, nogil=True, error_model="numpy")
def slot_weights_into(S0, lo, frac, w):
    """`slot_weights` into w (numpy's division rules, as its array division)."""
    e = tokens_per_step(S0, lo, frac)
    for i in range(e.shape[0]):
        w[i] = 1.0 / e[i]
    top = _top(w)
    for i in range(e.shape[0]):
        w[i] = w[i] / top


@njit(cache=True, nogil=True)
def time_spread(S, a, lo, frac, drafted, prior_strength, remaining):
    """`goodput_weights.time_weights` up to its exp: e (`tokens_per_step`), de / da (the first max(ceil(d), 1)
    slots' (j + 1) S summed in np.sum's order, / a), the steps' variance and z against the slowest row (np.argmax's
    first). Returns (e, -0.5 z^2) for np.exp."""
    n, K = S.shape
    e = tokens_per_step(S, lo, frac)
    m = min(max(lo + (1 if frac > 0.0 else 0), 1), K)
    row = np.empty(m)
    steps, sd2 = np.empty(n), np.empty(n)
    last = 0
    for i in range(n):
        for j in range(m):
            row[j] = (j + 1.0) * S[i, j]
        dS = pairwise(row, 0, m) / a[i]
        var_a = a[i] * (1.0 - a[i]) / (drafted[i] + prior_strength)
        r = float(remaining[i])
        steps[i] = r / e[i]
        t = steps[i] / e[i] * dS
        sd2[i] = r * (e[i] - 1.0) / (e[i] * e[i]) + t * t * var_a + 1.0
        if not math.isnan(steps[last]) and (steps[i] > steps[last] or math.isnan(steps[i])):
            last = i
    u = np.empty(n)
    for i in range(n):
        z = (steps[i] - steps[last]) / math.sqrt(sd2[i] + sd2[last])
        u[i] = -0.5 * z * z
    return e, u


@njit(cache=True, nogil=True)
def time_scale(p, e, c1, c0):
    """`goodput_weights.time_weights` past its exp: w = (c1 + c0 p / sum(p)) / e over max(max(w), 1e-300), and
    min(p) (NaN propagates as in ndarray.min); `time_scale_into` into a new array."""
    w = np.empty(p.shape[0])
    return w, time_scale_into(p, e, c1, c0, w)


@njit(cache=True, nogil=True)
def time_scale_into(p, e, c1, c0, w):
    """`time_scale` into w (as long as p): each weight, then w[i] / max(max(w), 1e-300) as numpy's array division
    divides; returns min(p)."""
    n = p.shape[0]
    ps = pairwise(p, 0, n)
    low = p[0]
    for i in range(n):
        w[i] = (c1 + c0 * p[i] / ps) / e[i]
        if not math.isnan(low) and (p[i] < low or math.isnan(p[i])):
            low = p[i]
    top = _top(w)
    top = 1e-300 if 1e-300 > top else top
    for i in range(n):
        w[i] = w[i] / top
    return low


@njit(cache=True, nogil=True)
def plan_value(S, w, has_w, depths):
    """`goodput_gates.plan_value`: sum(w) (np.sum's order; n without w) + the planned slots' (w x) S, summed over
    the whole [n, K] table in np.sum's order."""
    n, K = S.shape
    buf = np.empty(n * K)
    for i in range(n):
        for j in range(K):
            x = S[i, j] * w[i] if has_w else S[i, j]
            buf[i * K + j] = x * (1.0 if j < depths[i] else 0.0)
    return (pairwise(w, 0, n) if has_w else float(n)) + pairwise(buf, 0, n * K)


@njit(cache=True, nogil=True)
def extend_depths(depths, extend, cap):
    """`Goodput._extend`'s depths: min(depth + extend, cap) where the plan drafts, else 0."""
    out = np.empty(depths.shape[0], np.int64)
    for i in range(depths.shape[0]):
        out[i] = min(depths[i] + extend, cap[i]) if depths[i] > 0 else 0
    return out


@njit(cache=True, nogil=True)
def int_mean(x):
    """np.mean of an int64 array of values below 2^40, exactly: numpy sums the values as floats, exact integers
    below 2^53 in any order, so the mean is float(sum) / size. Returns (the mean, False) where it does not apply
    (an empty array, a value past 2^40, more than 2^12 values)."""
    n = x.shape[0]
    if n == 0 or n > 4096:
        return 0.0, False
    total = 0
    for i in range(n):
        if abs(x[i]) >= 2 ** 40:
            return 0.0, False
        total += x[i]
    return float(total) / n, True


@njit(cache=True, nogil=True)
def any_late(depths, lag):
    """Whether a row that drafts (depth > 0) lags (lag > 2): `goodput_gates.catch_up`'s test."""
    for i in range(depths.shape[0]):
        if depths[i] > 0 and lag[i] > 2:
            return True
    return False


@njit(cache=True, nogil=True)
def max_id(ids):
    """int(ids.max(initial=-1)) of int64 ids."""
    top = -1
    for i in range(ids.shape[0]):
        if ids[i] > top:
            top = ids[i]
    return top


@njit(cache=True, nogil=True)
def dinkelbach_next(found, e, t, G, g_none, best_g):
    """One step of Dinkelbach's iteration (`search._dinkelbach`) after the plan made at goodput G (found: it
    drafts, e / t its goodput g): (whether g beats best_g, g, the next G, whether to stop). No plan: once more at
    g_none, unless G was g_none already; else the next G is g, and the iteration stops where it moved by at most
    0.1 %."""
    if not found:
        return False, 0.0, g_none, G <= g_none
    g = e / t
    return g > best_g, g, g, abs(g - G) <= 1e-3 * G


@njit(cache=True, nogil=True)
def weighted_plan(S, w, remaining, G0, ver, dr, pad, has_pad):
    """`goodput_gates.plan_positions` with weights w, as `search.plan_by_position(S * w[:, None], costs, G0,
    tie=remaining, nested=True, base=w.sum())` computes it compiled: base by np.sum's order, the rows' ties by
    remaining (descending, then the row: `_weighted`'s keys) and the search (`_weighted_search`). Returns (depths,
    G, True), or (zeros, 0, False) where S x w holds NaN or a row's remaining is outside (-_TIE, _TIE) (the numpy
    form decides)."""
    Sw, t, ok = _weighted(S, w, remaining)
    if not ok:
        return np.zeros(S.shape[0], np.int64), 0.0, False
    depths, G = _weighted_search(Sw, t, pairwise(w, 0, S.shape[0]), G0, ver, dr, pad, has_pad)
    return depths, G, True


@njit(cache=True, nogil=True)
def _weighted(S, w, remaining):
    """(S x w[:, None], the rows' tie keys t = (_TIE - remaining) << 32 | row: -float(remaining) ascending, then
    the row, one int64 each, True), or (.., False) where S x w holds NaN or a remaining is outside (-_TIE, _TIE)."""
    n, K = S.shape
    Sw, t = np.empty((n, K)), np.empty(n, np.int64)
    nan = False
    for i in range(n):
        r, wi = remaining[i], w[i]
        if not -_TIE < r < _TIE:
            return Sw, t, False
        t[i] = (_TIE - r) << 32 | i
        for p in range(K):
            x = S[i, p] * wi
            Sw[i, p] = x
            nan |= math.isnan(x)
    return Sw, t, not nan


@njit(cache=True, nogil=True)
def _weighted_search(Sw, t, base, G0, ver, dr, pad, has_pad):
    """Dinkelbach's iteration (`search._dinkelbach`) over Sw (no NaN) with the rows' distinct keys t: at most 5
    plans of `nested_by_position`'s search, from max(g_none, G0), g_none = base / verify[0]; each by
    `chosen_search`, which ranks only the rows the search reads, once for the plans that choose alike. Returns the
    best plan's (depths, G)."""
    n, K = Sw.shape
    g_none = base / ver[0]
    G = G0 if G0 > g_none else g_none   # Python's max(g_none, G0)
    best_g, best, depths = g_none, np.zeros(n, np.int64), np.zeros(n, np.int64)
    rk, vk, c, chain = np.empty((K + 3, n), np.int64), np.empty((K + 1, n)), np.empty(n + 1), np.zeros(K + 1,
                                                                                                       np.int64)
    first_column(Sw, t, rk, vk, chain)
    for _ in range(5):
        m, e, tt = chosen_search(Sw, t, rk, vk, chain, c, G, ver, dr, pad, has_pad, base, depths)
        better, g, G, stop = dinkelbach_next(m > 0, e, tt, G, g_none, best_g)
        if better:
            best_g, best, depths = g, depths, best   # (the other buffer: the next plan's)
        if stop:
            break
    return best, best_g


_TIE = 1 << 30   # `weighted_plan`'s tie keys: (_TIE - remaining) << 32 | row, for |remaining| < _TIE and rows < 2^32


@njit(cache=True, nogil=True)
def any_nonzero(x):
    """bool(x.any()) of a 1-D integer array (goodput's "does any row draft")."""
    for i in range(x.shape[0]):
        if x[i] != 0:
            return True
    return False


@njit(cache=True, nogil=True)
def extension(S, w, has_w, depths, extend, cap):
    """`Goodput._extend`'s two reads of the plan in one call: its value (`plan_value`) and the extended depths
    (`extend_depths`). Returns (the value, the depths)."""
    return plan_value(S, w, has_w, depths), extend_depths(depths, extend, cap)


@njit(cache=True, nogil=True)
def forget_add_sums(keep, verified, accepted, estimate, drafted, paired, acc_s, exp_s, first_acc, first_exp, kf,
                    prior, optimism, paired_factors):
    """`PositionFactors.forget_add` (goodput's evidence, each step): the four sums x keep (`scale4`), then the
    step's column sums added (`position_sums`). Returns the first kf factors of the new sums (`position_factors`:
    (f, ok))."""
    scale4(acc_s, exp_s, first_acc, first_exp, keep)
    position_sums(verified, accepted, estimate, drafted, paired, acc_s, exp_s, first_acc, first_exp)
    return position_factors(kf, acc_s, exp_s, first_acc, first_exp, prior, optimism, paired_factors)


@njit(cache=True, nogil=True)
def mixture_rows(w, grid, acc, vc, ver, z):
    """`Evidence.calibrations`: the mixture's calibration c = exp(`mixture_median`'s log c) (libm's exp, as
    Python's math.exp) and each row's, `row_calibration` at c. Returns (c, the rows', True), or (0, empty, False)
    where w holds NaN (the numpy form decides)."""
    lc, ok = mixture_median(w, grid)
    if not ok:
        return 0.0, np.empty(0), False
    c = math.exp(lc)
    return c, row_calibration(acc, vc, ver, c, z), True


# ---- goodput's plan in two calls: its estimate chain (`goodput_estimates`) and its search with the extension
# (`plan_extend`), each the kernels above in the same order, writing into the policy's kept buffers ------------


@njit(cache=True, nogil=True)
def mixture_log_into(A, E, mix):
    """`mixture_log` over mix's rows 0-2 (the grid, its exp, the log prior) into its row 3."""
    mix[3, :] = mixture_log(A, E, mix[0], mix[1], mix[2])


@njit(cache=True, nogil=True)
def goodput_estimates(mix, due, c, table, cols, consts, num0, den0, f, remaining, K, lo, frac, vec, SS, rowcap,
                      spread):
    """`Goodput._estimate`'s chain: where `due`, the mixture's calibration c = exp(`mixture_median` of w = mix[3],
    the posterior after np.exp, on the grid mix[0]) (libm's exp, as Python's math.exp); each row's,
    `row_calibration` at c where z != 0 and two rows or more (else c); the rows' estimates (`row_estimates`: num,
    den the table's columns cols[3], cols[4]; cols[0:3]: accepted, verified confidence, verified), the batch's
    rate `base` from the evidence's sums num0, den0 (confidence: num0 / den0, cap 1 / max(base, 1e-6); counts:
    num0 / (num0 + den0), cap 0); their survivals (`survivals`) and, for two rows or more, S0's `slot_weights` at
    depth lo + frac; where `spread`, S's `time_spread` (drafted: cols[5], the prior `strength`) into e and u.
    consts: z, the estimate's prior k, tol, strength, and 1.0 for the confidence estimator (0.0: counts). Written
    into vec's rows (a, cal, slot, e, u), SS's (S0, S) and rowcap. Returns (c, True), or (c, False) where w or the
    estimates hold NaN (the numpy forms decide)."""
    n = table.shape[0]
    z, k, tol, strength, confidence = consts[0], consts[1], consts[2], consts[3], consts[4] != 0.0
    base = num0 / den0 if confidence else num0 / (num0 + den0)
    cap = 1 / (1e-6 if 1e-6 > base else base) if confidence else 0.0   # (Python's max(base, 1e-6))
    a, cal, slot, S0, S = vec[0], vec[1], vec[2], SS[0], SS[1]
    if due:
        lc, ok = mixture_median(mix[3], mix[0])
        if not ok:
            return c, False
        c = math.exp(lc)
    if z != 0.0 and n >= 2:
        cal[:] = row_calibration(table[:, cols[0]], table[:, cols[1]], table[:, cols[2]], c, z)
    else:
        cal[:] = c
    x, ok = row_estimates(table[:, cols[3]], table[:, cols[4]], cal, k * base, k, cap, confidence, tol)
    if not ok:
        return c, False
    a[:] = x
    survivals_into(a, f, remaining, K, S0, S, rowcap)
    if n >= 2:
        slot_weights_into(S0, lo, frac, slot)
    if spread:
        te, tu = time_spread(S, a, lo, frac, table[:, cols[5]], strength, remaining)
        vec[3, :] = te
        vec[4, :] = tu
    return c, True


@njit(cache=True, nogil=True)
def plan_extend(S, w, remaining, G0, ver, dr, pad, has_pad, lag, extend, cap, two):
    """`goodput_gates.plan_positions` (`weighted_plan`) into two[0], and what the gates and the extension read of
    it: whether a row that drafts lags (`any_late`), whether any drafts, the plan's value (`plan_value`: base + the
    planned slots of S x w, the [n, K] table summed in np.sum's order), its extended depths (`extend_depths`, into
    two[1]), the same two questions of them, and whether every row drafts (planned.all()). Returns (G, True, late,
    drafts, E, late extended, extended drafts, all draft), or (0, False, ...) where `weighted_plan` leaves the plan
    to the numpy form."""
    n, K = S.shape
    Sw, t, ok = _weighted(S, w, remaining)
    if not ok:
        return 0.0, False, False, False, 0.0, False, False, False
    base = pairwise(w, 0, n)
    d, G = _weighted_search(Sw, t, base, G0, ver, dr, pad, has_pad)
    two[0, :] = d
    buf = Sw.ravel()   # (Sw: S x w, as plan_value multiplies; C-contiguous, a view)
    out = two[1]
    full = True
    for i in range(n):
        for j in range(K):
            buf[i * K + j] = buf[i * K + j] * (1.0 if j < d[i] else 0.0)
        out[i] = min(d[i] + extend, cap[i]) if d[i] > 0 else 0   # (`extend_depths`)
        full = full and d[i] != 0
    E = base + pairwise(buf, 0, n * K)
    return G, True, any_late(d, lag), any_nonzero(d), E, any_late(out, lag), any_nonzero(out), full


# ---- goodput's position search over the rows it reads (`weighted_plan`): column 0 ranked in full, each later
# column only over the rows drafting at the position before (the only ones `nested_by_position` reads there);
# a ranking by counting (`count_rank`: each row's place, the rows ahead of it, in branch-free passes) up to
# _ROWS_COUNTED rows, a merge sort past that ------------------------------------------------------------------------


_ROWS_COUNTED = 128   # `rank_some`: rankings of up to this many rows by counting (m^2 comparisons), longer ones merged


@njit(cache=True, nogil=True)
def count_rank(rows, v, k, m, rows2, v2):
    """rows[0:m], v[0:m] (their values) in `_ahead`'s order, in place, for keys k distinct (then no two rows tie):
    each row's place is the number of rows ahead of it, value greater or equal with a smaller key (rows2, v2:
    scratch, m long at least)."""
    for i in range(m):
        vi, ki = v[i], k[i]
        c = 0
        for j in range(m):
            c += (v[j] > vi) | ((v[j] == vi) & (k[j] < ki))
        rows2[c], v2[c] = rows[i], vi
    for i in range(m):
        rows[i], v[i] = rows2[i], v2[i]


@njit(cache=True, nogil=True)
def rank_some(rows, v, k, m, rows2, v2, k2):
    """rows[0:m] with their values v and distinct keys k in `_ahead`'s order, in place (k left in the order given
    up to _ROWS_COUNTED rows): `count_rank`, past _ROWS_COUNTED rows `merge_rows` (rows2, v2, k2: scratch, m long)."""
    if m <= _ROWS_COUNTED:
        count_rank(rows, v, k, m, rows2, v2)
    else:
        merge_rows(rows, v, k, m, rows2, v2, k2)


@njit(cache=True, nogil=True, inline="always")
def _ahead(vx, kx, x, vy, ky, y):
    """Row x before row y in a column's ranking (`rank_columns`' order): value descending, then key, then row."""
    return vx > vy or (vx == vy and (kx < ky or (kx == ky and x < y)))


@njit(cache=True, nogil=True)
def _merge_pass(ar, av, ak, br, bv, bk, m, width):
    """One pass of `merge_rows`: each two sorted runs of `width` in a (rows, values, keys) merged into b."""
    for lo in range(0, m, 2 * width):
        mid, hi = min(lo + width, m), min(lo + 2 * width, m)
        i, j, o = lo, mid, lo
        while i < mid and j < hi:
            if _ahead(av[j], ak[j], ar[j], av[i], ak[i], ar[i]):
                br[o], bv[o], bk[o] = ar[j], av[j], ak[j]
                j += 1
            else:
                br[o], bv[o], bk[o] = ar[i], av[i], ak[i]
                i += 1
            o += 1
        while i < mid:
            br[o], bv[o], bk[o] = ar[i], av[i], ak[i]
            i += 1
            o += 1
        while j < hi:
            br[o], bv[o], bk[o] = ar[j], av[j], ak[j]
            j += 1
            o += 1


@njit(cache=True, nogil=True)
def merge_rows(rows, v, k, m, rows2, v2, k2):
    """rows[0:m], with their values v and keys k alongside, sorted by `_ahead` (a bottom-up merge sort through
    rows2, v2, k2, each m long at least)."""
    width, flip = 1, False
    while width < m:
        if flip:
            _merge_pass(rows2, v2, k2, rows, v, k, m, width)
        else:
            _merge_pass(rows, v, k, rows2, v2, k2, m, width)
        flip, width = not flip, 2 * width
    if flip:
        for i in range(m):
            rows[i], v[i], k[i] = rows2[i], v2[i], k2[i]


@njit(cache=True, nogil=True)
def rank_rows(S, t, p, rows, m, v, k, rows2, v2, k2):
    """rows[0:m] in column p's ranking (`_ahead`'s order: S[:, p] descending, then the distinct keys t), in place,
    and v[0:m] their S[:, p] (k: their keys; rows2, v2, k2: scratch, m long at least): by insertion from the given
    order (a later column's rows come nearly in order), by `rank_some` where more than m / 8 of the given
    neighbours are out of order or once the insertion moves more than 2 m."""
    for j in range(m):
        r = rows[j]
        v[j], k[j] = S[r, p], t[r]
    rises = 0
    for j in range(1, m):
        rises += v[j] > v[j - 1]
    if 8 * rises > m:
        rank_some(rows, v, k, m, rows2, v2, k2)
        return
    moves = 0
    for j in range(1, m):
        x, vx, kx = rows[j], v[j], k[j]
        q = j
        while q > 0 and not _ahead(v[q - 1], k[q - 1], rows[q - 1], vx, kx, x):
            rows[q], v[q], k[q] = rows[q - 1], v[q - 1], k[q - 1]
            q -= 1
        rows[q], v[q], k[q] = x, vx, kx
        moves += j - q
        if moves > 2 * m:
            rank_some(rows, v, k, m, rows2, v2, k2)
            return


@njit(cache=True, nogil=True)
def first_column(S, t, rk, vk, chain):
    """Column 0's ranking of all n rows (`_ahead`'s order, keys t distinct: `rank_some`) into rk[0], their values
    into vk[0] (`chosen_search`'s buffers: rk [K + 3, n], vk [K + 1, n], chain [K + 1]); chain[K] = 1 (the
    positions ranked). Nothing where S has no column."""
    n, K = S.shape
    if K == 0:
        return
    rows, v, k = rk[0], vk[0], rk[K + 1]
    for i in range(n):
        rows[i], v[i], k[i] = i, S[i, 0], t[i]
    rank_some(rows, v, k, n, rk[K], vk[K], rk[K + 2])
    chain[K] = 1


@njit(cache=True, nogil=True)
def chosen_search(S, t, rk, vk, chain, c, G, ver, dr, pad, has_pad, base, depths):
    """`nested_by_position(S, order, K, G, ...)` (the same positions, sums and choices; ties by the distinct keys
    t) with column p's rows in rk[p] and their values in vk[p]: column 0's all (`first_column`), a later one's the
    m chosen at the position before, ranked there (`rank_rows`): the rows `_candidates` takes of `order`. chain:
    the m the last call chose per position and (chain[K]) how many positions of rk hold its rankings, which hold
    for this call while it chooses alike; rk[K:], vk[K] and c (n + 1): scratch. The plan's depths into `depths`.
    Returns (its positions, value, seconds)."""
    n, K = S.shape
    rows2, k, k2, v2 = rk[K], rk[K + 1], rk[K + 2], vk[K]
    depths[:] = 0
    x, e, tdraft, prev, count = 0, base, 0.0, n, 0
    same = True   # the positions so far chose as the last call's did
    for p in range(K):
        cur, v = rk[p], vk[p]
        if not (same and p < chain[K]):
            same = False
            cur[:prev] = rk[p - 1, :prev]
            rank_rows(S, t, p, cur, prev, v, k, rows2, v2, k2)
            chain[K] = p + 1
        c[0] = 0.0
        for j in range(prev):
            c[j + 1] = v[0] if j == 0 else c[j] + v[j]
        m, best, dm = _position_best(c, prev, G, ver, x, dr, pad[p] if has_pad else 0.0, has_pad)
        if same and chain[p] != m:
            same, chain[K] = False, p + 1   # (the rankings past p were for other rows)
        chain[p] = m
        if m == 0 or best <= 0.0:
            break
        for j in range(m):
            depths[cur[j]] += 1
        count, e, tdraft, x, prev = count + 1, e + c[m], tdraft + dm, x + m, m
    return count, e, ver[x] + tdraft


# ---- goodput's rounded estimates in order (`row_estimates`' ties): a counting sort of their 1e4 multiples ------


@njit(cache=True, nogil=True)
def rounded_order(q):
    """np.argsort's ascending order of integers q in [0, 2^14) up to the order of equal ones (`tie_means` reads
    only the values' order): a least-significant-digit counting sort, two passes of 7 bits."""
    n = q.shape[0]
    tmp, out, cnt = np.empty(n, np.int64), np.empty(n, np.int64), np.zeros(129, np.int64)
    for shift in (0, 7):
        src, dst = (np.arange(n), tmp) if shift == 0 else (tmp, out)
        cnt[:] = 0
        for i in range(n):
            cnt[((q[i] >> shift) & 127) + 1] += 1
        for b in range(128):
            cnt[b + 1] += cnt[b]
        for j in range(n):
            i = src[j]
            d = (q[i] >> shift) & 127
            dst[cnt[d]] = i
            cnt[d] += 1
    return out


# ---- kit.tree's plan search and tree_confidence's means (np.interp's rule over an arange grid, np.sum's pairwise
# order, np.argmax's first maximum; numpy's error model: a division by zero gives inf or NaN, as numpy's does) ----


@njit(cache=True, nogil=True, error_model="numpy")
def _interp_step(x, x0, x1, f0, f1):
    """np.interp's value at x in [x0, x1) of a grid with values f0, f1 there: its slope form from x0, from x1 where
    that is NaN, and f0 where that is NaN too and f0 == f1 (numpy's division rules)."""
    slope = (f1 - f0) / (x1 - x0)
    r = slope * (x - x0) + f0
    if math.isnan(r):
        r = slope * (x - x1) + f1
        if math.isnan(r) and f0 == f1:
            r = f0
    return r


@njit(cache=True, nogil=True, inline="always", error_model="numpy")
def interp(x, fp, off, size):
    """np.interp(x, np.arange(size), fp[off:off + size]): its ends, its exact grid points and its slope form."""
    if size == 1:
        return fp[off]
    if math.isnan(x):
        return x
    last = size - 1
    if x >= last:
        return fp[off + last]
    if x < 0.0:
        return fp[off]
    j = int(x)   # x >= 0: its floor
    if float(j) == x:
        return fp[off + j]
    slope = fp[off + j + 1] - fp[off + j]   # over a grid step of 1.0, which divides exactly
    r = slope * (x - float(j)) + fp[off + j]
    if math.isnan(r):
        r = slope * (x - float(j + 1)) + fp[off + j + 1]
        if math.isnan(r) and fp[off + j] == fp[off + j + 1]:
            r = fp[off + j]
    return r


@njit(cache=True, nogil=True, error_model="numpy")
def level_moves(Ls, loff, Ns, cols):
    """Per depth cap's segment (levels Ls[loff[s]:] as [N + 1, cols[s]], N = Ns[s]) and node count lo in 0..N:
    its levels with tokens (fw) and the level that node lo moves (moved: -1 none, -2 several; -1 at lo = N),
    the segments end to end (segment s from the sum of the earlier N + 1)."""
    total = 0
    for s in range(Ns.shape[0]):
        total += Ns[s] + 1
    fw, moved = np.empty(total, np.int64), np.empty(total, np.int64)
    k = 0
    for s in range(Ns.shape[0]):
        N, C = Ns[s], cols[s]
        L = Ls[loff[s]:loff[s] + (N + 1) * C].reshape((N + 1, C))
        for lo in range(N + 1):
            cnt, m = 0, -1
            for c in range(C):
                a = L[lo, c]
                if a > 0:
                    cnt += 1
                if lo < N and L[lo + 1, c] != a:
                    m = c if m == -1 else -2
            fw[k], moved[k] = cnt, m
            k += 1
    return fw, moved


@njit(cache=True, nogil=True, inline="always", error_model="numpy")
def _level_draft_row(L, lo, cols, dbuf, doff, oh, row):
    """Node count lo's levels' draft seconds into row: a table entry each (as np.interp gives at a grid point),
    + oh where the level has tokens."""
    for c in range(cols):
        a = L[lo, c]
        row[c] = dbuf[doff + a] + (oh if a > 0 else oh * 0.0)


@njit(cache=True, nogil=True, inline="always", error_model="numpy")
def _level_seconds(L, lo, f, c, dbuf, doff, dlen, oh):
    """Level c's draft seconds at node count lo + f (np.interp between its grid points, + oh where it has
    tokens), whether it has tokens, and whether it had at lo."""
    a = L[lo, c]
    lv = float(a) + f * float(L[lo + 1, c] - a)
    pos = lv > 0
    return interp(lv, dbuf, doff, dlen) + (oh if pos else oh * 0.0), pos, a > 0


@njit(cache=True, nogil=True, inline="always", error_model="numpy")
def _between(L, lo, f, cols, dbuf, doff, dlen, oh, row, cnt, buf):
    """Summed draft seconds and forwards of node count lo + f (0 < f <= 1) where node lo moves several levels:
    row (node count lo's levels' seconds; cnt of them with tokens) with the moved levels' seconds in place,
    summed in np.sum's order."""
    for c in range(cols):
        if L[lo + 1, c] == L[lo, c]:
            buf[c] = row[c]
        else:
            buf[c], pos, was = _level_seconds(L, lo, f, c, dbuf, doff, dlen, oh)
            cnt += (1 if pos else 0) - (1 if was else 0)
    return 0.0 + pairwise(buf, 0, cols), float(cnt)


@njit(cache=True, nogil=True, inline="always")
def _swap_parts(row, n, m, r):
    """`_block`(row[:n]) (n <= 128) as a function of its entry m, for `_swap_sum` (r: scratch of 8): (head,
    has_head, c0, c1, stride, sib, pair, half, tail): the sum so far where m enters (head + v, or v where m opens
    an accumulator), the later entries of its chain (c0..c1 - 1 by stride); where m is in an accumulator (stride
    8), the other accumulator of its pair, the other pair of its half, the other half, and the entries from
    `tail` on."""
    B = n - n % 8
    if n < 8 or m >= B:   # a plain loop, or m past the accumulators: one chain from m to the end
        head = _block(row, 0, B) if n >= 8 else 0.0
        for c in range(B if n >= 8 else 0, m):
            head += row[c]
        return head, True, m + 1, n, 1, 0.0, 0.0, 0.0, n
    j = m % 8
    r[:] = row[:8]
    head = row[j]
    for c in range(8, B):
        r[c % 8] += row[c]
        if c < m and c % 8 == j:
            head += row[c]
    k = 2 * ((j // 2) ^ 1)   # the first accumulator of the other pair of m's half
    half = (r[0] + r[1]) + (r[2] + r[3]) if j >= 4 else (r[4] + r[5]) + (r[6] + r[7])
    return head, m >= 8, m + 8, B, 8, r[j ^ 1], r[k] + r[k + 1], half, B


@njit(cache=True, nogil=True, inline="always")
def _swap_sum(row, n, v, parts):
    """`_block`(row[:n]) with its entry m = v, from `_swap_parts`(row, n, m): the same adds (a sum of two is the
    same either way round)."""
    head, has_head, c0, c1, stride, sib, pair, half, tail = parts
    s = head + v if has_head else v
    for c in range(c0, c1, stride):
        s += row[c]
    if stride == 8:
        s = ((s + sib) + pair) + half
        for c in range(tail, n):
            s += row[c]
    return s


@njit(cache=True, nogil=True, inline="always", error_model="numpy")
def _moved_run(L, lo, m, i0, i1, xs, cols, dbuf, doff, dlen, oh, row, cnt, out, o, r8):
    """Candidates i0..i1 - 1 (0 < f <= 1) of node count lo, whose node moves level m: row (node count lo's
    levels' seconds, cnt of them with tokens) with that level's seconds in place, summed in np.sum's order
    (`_swap_sum`; cols <= 128), and the forwards (xs[i] = i / steps). Moves row to node count lo + 1 and returns
    its sum."""
    a = L[lo, m]
    d, fa = float(L[lo + 1, m] - a), float(a)
    cnt -= 1 if a > 0 else 0
    inner = 0 <= a and a + 1 <= dlen - 1   # np.interp's grid step a..a + 1 (x below a + 1: below its last point)
    y0 = dbuf[doff + a] if inner else 0.0
    slope = dbuf[doff + a + 1] - y0 if inner else 0.0
    parts = _swap_parts(row, cols, m, r8)
    for i in range(i0, i1):
        lv = fa + (xs[i] - lo) * d
        pos = lv > 0
        v = slope * (lv - fa) + y0   # interp's slope form on that step (its values; no call per candidate)
        if not (inner and fa < lv < fa + 1.0) or math.isnan(v):
            v = interp(lv, dbuf, doff, dlen)
        out[1, o + i] = 0.0 + _swap_sum(row, cols, v + (oh if pos else oh * 0.0), parts)
        out[2, o + i] = float(cnt + (1 if pos else 0))
    a = L[lo + 1, m]
    row[m] = dbuf[doff + a] + (oh if a > 0 else oh * 0.0)
    return 0.0 + _swap_sum(row, cols, row[m], parts)


@njit(cache=True, nogil=True, error_model="numpy")
def _segment(prob, L, N, cols, fw, moved, steps, xs, n, ver, dbuf, doff, dlen, oh, out, o):
    """One depth cap's candidates (N nodes, steps per node: candidate i = lo steps + k at x = i / steps nodes, lo
    its floor but at most N - 1, f = x - lo) into out[:, o:o + N steps + 1]: tokens, summed draft seconds,
    forwards, verify seconds (ver: by candidate). fw, moved: the segment's `level_moves`. Node count lo's levels'
    seconds are kept in one row, moved one level at a time (a sum from the rest of numpy's pairwise tree)."""
    E = np.empty(N + 1)
    E[0] = 0.0
    for i in range(N):
        E[i + 1] = prob[0] if i == 0 else E[i] + prob[i]
    row, buf, r8 = np.empty(max(cols, 1)), np.empty(max(cols, 1)), np.empty(8)
    _level_draft_row(L, 0, cols, dbuf, doff, oh, row)
    ds = 0.0 + pairwise(row, 0, cols)
    for lo in range(N):
        i0, i1 = lo * steps, lo * steps + (steps + 1 if lo == N - 1 else steps)
        e0, de = E[lo], E[lo + 1] - E[lo]
        for i in range(i0, i1):
            out[0, o + i] = n * ((1.0 + e0) + (xs[i] - lo) * de)
            out[3, o + i] = ver[i]
        m = moved[lo]
        for i in range(i0, i1 if m == -1 else i0 + 1):   # f = 0, or no level moves: node count lo's levels
            out[1, o + i], out[2, o + i] = ds, float(fw[lo])
        if m >= 0:
            ds = _moved_run(L, lo, m, i0 + 1, i1, xs, cols, dbuf, doff, dlen, oh, row, fw[lo], out, o, r8)
        elif m == -2:
            for i in range(i0 + 1, i1):
                out[1, o + i], out[2, o + i] = _between(L, lo, xs[i] - lo, cols, dbuf, doff, dlen, oh, row, fw[lo],
                                                        buf)
            _level_draft_row(L, lo + 1, cols, dbuf, doff, oh, row)
            ds = 0.0 + pairwise(row, 0, cols)
    return o + N * steps + 1


@njit(cache=True, nogil=True, error_model="numpy")
def candidates(probs, poff, Ls, loff, Ns, cols, fw, moved, steps, n, ver, dr, oh):
    """float [4, sum(N steps + 1)]: every depth cap's candidates (`_segment`), segment s from the flat node
    probabilities probs[poff[s]:] and levels Ls[loff[s]:] ([N + 1, cols[s]]; fw, moved: `level_moves`), under
    the verify table `ver` (x nodes a row) and the draft table `dr` (one forward of q tokens a row)."""
    S = Ns.shape[0]
    total, M = 0, 1
    for s in range(S):
        total += Ns[s] * steps + 1
        M = max(M, Ns[s] * steps + 1)
    out = np.empty((4, total))
    vx, xs = np.empty(M), np.empty(M)
    for i in range(M):
        xs[i] = i / steps
        vx[i] = interp(xs[i], ver, 0, ver.shape[0])
    o, k = 0, 0
    for s in range(S):
        N, c = Ns[s], cols[s]
        L = Ls[loff[s]:loff[s] + (N + 1) * c].reshape((N + 1, c))
        o = _segment(probs[poff[s]:poff[s] + N], L, N, c, fw[k:k + N + 1], moved[k:k + N + 1], steps, xs, float(n),
                     vx, dr, 0, dr.shape[0], oh, out, o)
        k += N + 1
    return out


@njit(cache=True, nogil=True, error_model="numpy")
def best_candidate(parts, coff, calibrated, sd, cd, sv, cv, g0):
    """plan_trees' choice over the segments' candidates: per segment the first maximum of tokens / seconds
    (calibrated: sd draft + cd forwards + sv verify + cv; else draft + verify), taken where it beats the best so
    far by a factor 1 + 1e-12 (from g0). Returns (segment or -1, candidate index, its goodput)."""
    best, bs, bj = g0, -1, -1
    for s in range(coff.shape[0] - 1):
        jm, gm = -1, 0.0
        for i in range(coff[s], coff[s + 1]):
            if calibrated:
                sec = sd * parts[1, i] + cd * parts[2, i] + sv * parts[3, i] + cv
            else:
                sec = parts[1, i] + parts[3, i]
            g = parts[0, i] / sec
            if jm < 0 or (not math.isnan(gm) and (g > gm or math.isnan(g))):
                jm, gm = i, g
        if jm >= 0 and gm > best * (1 + 1e-12):
            best, bs, bj = gm, s, jm
    return bs, bj, best


@njit(cache=True, nogil=True)
def row_plan(caps, base, extra, depth, out):
    """plan_rows' rows: each row's (nodes, depth cap) is (base, or base + 1 for the `extra` rows first in
    np.argsort(-caps, kind="stable"), min(cap, depth)); into out [3, n]: the distinct pairs in first-row order
    (nodes out[0, :G], caps out[1, :G]) and each row's pair (out[2]); returns G."""
    n = caps.shape[0]
    top = 0
    if extra > 0:   # the extra-th largest cap: rows above it, then the first rows at it
        top = np.sort(caps)[n - extra]
    above = 0
    for i in range(n):
        above += 1 if caps[i] > top else 0
    left = extra - above
    cs, ds, grp = out[0], out[1], out[2]
    G = 0
    for i in range(n):
        c = base
        if extra > 0 and (caps[i] > top or (caps[i] == top and left > 0)):
            c += 1
            if caps[i] == top:
                left -= 1
        d = min(caps[i], depth)
        g = 0
        while g < G and (cs[g] != c or ds[g] != d):
            g += 1
        if g == G:
            cs[G], ds[G] = c, d
            G += 1
        grp[i] = g
    return G


@njit(cache=True, nogil=True, error_model="numpy")
def _masses(par, dep, rnk, counts, table, R, W, reach, acc, level, size, mass):
    """RankEstimate._expected_counts' weights for one tree (node arrays par, dep, rnk; counts[a]: rows that
    accepted a nodes): W[1 + i] the rows whose path ends at node i (W[0]: at the root); returns the rows whose path
    passes through each node, [root, node 0, ...] (the numpy form's bincounts and add.at, in node order), in mass.
    Scratch: reach [N], acc [N + 1], level and size [counts.size], mass [N + 1]."""
    N = par.shape[0]
    acc[:] = 0.0
    level[:] = 0.0
    size[:] = 0
    for i in range(N):
        pr = table[rnk[i]] if rnk[i] < R else 0.0
        reach[i] = pr * (reach[par[i]] if par[i] >= 0 else 1.0)
        acc[par[i] + 1] += pr
    for i in range(N):
        m = 1.0 - acc[i + 1]
        reach[i] = reach[i] * (m if (m >= 0.0 or math.isnan(m)) else 0.0)   # from here: the path's end weight
        level[dep[i]] += reach[i]
        size[dep[i]] += 1
    W[0] = counts[0]
    for i in range(N):
        lv = level[dep[i]]
        W[i + 1] = counts[dep[i]] * (reach[i] / lv if lv > 0 else 1.0 / size[dep[i]])
    mass[:] = W
    for d in range(counts.shape[0] - 1, 1, -1):
        for i in range(N):
            if dep[i] == d:
                mass[par[i] + 1] += mass[i + 1]
    return mass


@njit(cache=True, nogil=True, error_model="numpy")
def expected_counts(par, dep, rnk, noff, cnt, coff, table, R, hits, trials, keep):
    """RankEstimate.refresh's EM step over its groups (group g: the tree par/dep/rnk[noff[g]:noff[g + 1]], its rows
    per accepted length cnt[coff[g]:coff[g + 1]]): keep[g] where its rows sum (np.sum's order) to >= 1e-3, and
    the kept groups' expected hits and trials per rank added in group order (the numpy form's bincounts and
    reversed cumsums; scratch allocated once for the largest group). Returns how many groups are kept."""
    G, M, A = noff.shape[0] - 1, 1, 1
    for g in range(G):
        M, A = max(M, noff[g + 1] - noff[g] + 1), max(A, coff[g + 1] - coff[g])
    full, ends, kept = np.empty(R + 1), np.empty(R + 1), 0
    buf, ibuf = np.empty((5, M)), np.empty((2, max(M, A)), np.int64)
    lbuf = np.empty(A)
    for g in range(G):
        counts = cnt[coff[g]:coff[g + 1]]
        keep[g] = 0.0 + pairwise(counts, 0, counts.shape[0]) >= 1e-3
        if not keep[g]:
            continue
        kept += 1
        a, b, C = noff[g], noff[g + 1], counts.shape[0]
        W = buf[0, :b - a + 1]
        mass = _masses(par[a:b], dep[a:b], rnk[a:b], counts, table, R, W, buf[1, :b - a], buf[2, :b - a + 1],
                       lbuf[:C], ibuf[0, :C], buf[3, :b - a + 1])
        full[:], ends[:] = 0.0, 0.0
        kids = ibuf[1, :b - a + 1]
        kids[:] = 0
        for i in range(a, b):
            full[min(rnk[i], R)] += mass[i - a + 1]
            kids[par[i] + 1] += 1
        for j in range(b - a + 1):
            ends[min(kids[j], R)] += W[j]
        rc, re = full[R], ends[R]   # the reversed cumsums: rc through rank r, re past it
        for r in range(R - 1, -1, -1):
            rc = rc + full[r]
            hits[r] += full[r]
            trials[r] += rc + re
            re = re + ends[r]
    return kept


@njit(cache=True, nogil=True, error_model="numpy")
def add_ones(counts, at):
    """np.add.at(counts, at, 1.0) (one row at a time, in order) where every index is in 0..size - 1; returns
    whether they were (else counts is left as it was)."""
    for a in at:
        if a < 0 or a >= counts.shape[0]:
            return False
    for a in at:
        counts[a] += 1.0
    return True


@njit(cache=True, nogil=True, error_model="numpy")
def row_means(conf, out):
    """Per row of conf [n, K] (K <= 128), the mean of its non-NaN entries into out (rows without one are left):
    np.where(seen, conf, 0.0).sum(axis=1) (np.sum's order) / seen.sum(axis=1)."""
    n, K = conf.shape
    buf = np.empty(K)
    for i in range(n):
        c = 0
        for k in range(K):
            v = conf[i, k]
            if math.isnan(v):
                buf[k] = 0.0
            else:
                buf[k] = v
                c += 1
        if c > 0:
            out[i] = (0.0 + pairwise(buf, 0, K)) / c


@njit(cache=True, nogil=True, error_model="numpy")
def picked_means(x, rows, cols, out):
    """out[rows] = x[rows][:, cols].mean(axis=1) for len(cols) <= 128, in numpy's order: that array is
    Fortran-ordered for 2 rows or more, where the mean's sum runs over the columns one by one; for one row a
    contiguous row, summed pairwise. Then / len(cols)."""
    K = cols.shape[0]
    buf = np.empty(max(K, 1))
    for i in rows:
        for k in range(K):
            buf[k] = x[i, cols[k]]
        if rows.shape[0] > 1:
            s = 0.0
            for k in range(K):
                s += buf[k]
        else:
            s = 0.0 + pairwise(buf, 0, K)
        out[i] = s / K


@njit(cache=True, nogil=True, error_model="numpy")
def rank_table(hits, trials, prior, strength, out):
    """RankEstimate.table's numpy form into out: h = (hits + strength prior) / (trials + strength), t = h x
    [1, cumprod(1 - h)[:-1]] (the product in cumprod's order), np.minimum.accumulate(t) (a NaN kept)."""
    run, m = 1.0, 0.0
    for r in range(hits.shape[0]):
        h = (hits[r] + strength * prior[r]) / (trials[r] + strength)
        t = h * run
        run = run * (1.0 - h) if r else 1.0 - h
        if r == 0 or (not math.isnan(m) and (math.isnan(t) or t < m)):
            m = t
        out[r] = m
    return out


@njit(cache=True, nogil=True, error_model="numpy")
def hazards(t, out):
    """RankEstimate.start's hazards of a table t into out: t / np.maximum(1 - [0, cumsum(t)[:-1]], 1e-12) (the
    sum in cumsum's order), np.clip'd to 0..1 (0 where x < 0, 1 where x > 1: a NaN and -0.0 kept)."""
    run = 0.0
    for r in range(t.shape[0]):
        left = 1.0 - (run if r else 0.0)
        run = run + t[r] if r else t[r]
        x = t[r] / (left if (left > 1e-12 or math.isnan(left)) else 1e-12)
        x = 0.0 if x < 0.0 else x
        out[r] = 1.0 if x > 1.0 else x
    return out


@njit(cache=True, nogil=True, error_model="numpy")
def confidence_head(sums, counts, out):
    """RankConfidence._table's drafted ranks: k, the ranks before the first with no count (all: R), their means
    sums / counts into out[:k], what is left (1 - their np.sum) and the last one's hazard (Python's min and max
    on t[-1] / max(left + t[-1], 1e-12), clipped to 0..1). k = 0: (0, 0.0, 0.0)."""
    R = counts.shape[0]
    k = 0
    while k < R and counts[k] > 0:
        k += 1
    if k == 0:
        return 0, 0.0, 0.0
    for r in range(k):
        out[r] = sums[r] / counts[r]
    left = 1.0 - (0.0 + pairwise(out, 0, k))
    last = out[k - 1]
    den = left + last
    x = last / (1e-12 if 1e-12 > den else den)
    x = 0.0 if 0.0 > x else x
    return k, left, (1.0 if 1.0 < x else x)


@njit(cache=True, nogil=True)
def rank_bins(conf, rows, nodes, rank, R, b, k):
    """np.bincount of conf[rows, :nodes]'s entries that are not NaN (row by row) at min(rank, R), weighted by them
    into b and not into k ([R + 1] each; a bin at a time, its entries added in that order); returns how many
    there were, -1 (nothing read) where a row or `nodes` is out of conf's range."""
    if nodes > conf.shape[1]:
        return -1
    for i in rows:
        if i < 0 or i >= conf.shape[0]:
            return -1
    js, start = np.empty(nodes, np.int64), np.zeros(R + 2, np.int64)   # the nodes by bin, in node order
    for j in range(nodes):
        start[min(rank[j], R) + 1] += 1
    for r in range(R + 1):
        start[r + 1] += start[r]
    fill = start[:R + 1].copy()
    for j in range(nodes):
        r = min(rank[j], R)
        js[fill[r]] = j
        fill[r] += 1
    cnt = 0
    for r in range(R + 1):   # each bin's sum in row order, then node order (as one pass adds them)
        s, c = 0.0, 0
        for i in rows:
            for q in range(start[r], start[r + 1]):
                v = conf[i, js[q]]
                if not math.isnan(v):
                    s += v
                    c += 1
        b[r], k[r] = s, c
        cnt += c
    return cnt


@njit(cache=True, nogil=True)
def rank_means_add(e, b, k, sums, counts):
    """RankConfidence.observe's update for one tree from its `rank_bins`: sums and counts x e, + the first R bins
    (weighted into sums, counted into counts)."""
    for r in range(sums.shape[0]):
        sums[r] = sums[r] * e + b[r]
        counts[r] = counts[r] * e + float(k[r])


@njit(cache=True, nogil=True)
def first_groups(v):
    """The distinct values of an integer vector in first-row order and its rows grouped by them: (vals, starts,
    rows), value g's rows rows[starts[g]:starts[g + 1]] ascending (np.flatnonzero(v == x) for each x of
    dict.fromkeys(v))."""
    n = v.shape[0]
    vals, grp = np.empty(n, np.int64), np.empty(n, np.int64)
    G = 0
    for i in range(n):
        g = 0
        while g < G and vals[g] != v[i]:
            g += 1
        if g == G:
            vals[G] = v[i]
            G += 1
        grp[i] = g
    starts = np.zeros(G + 1, np.int64)
    for i in range(n):
        starts[grp[i] + 1] += 1
    for g in range(G):
        starts[g + 1] += starts[g]
    rows, fill = np.empty(n, np.int64), starts[:G].copy()
    for i in range(n):
        rows[fill[grp[i]]] = i
        fill[grp[i]] += 1
    return vals[:G], starts, rows


@njit(cache=True, nogil=True, error_model="numpy")
def _monotone(a):
    """Whether a is finite and non-decreasing."""
    for i in range(a.shape[0]):
        if not math.isfinite(a[i]) or (i and a[i] < a[i - 1]):
            return False
    return True


@njit(cache=True, nogil=True, error_model="numpy")
def block_heads(probs, poff, Ns, fw, steps, n, base):
    """The parts of `candidates` that no price enters, per block (node count lo's candidates of a segment, f = 0
    first; the blocks end to end), into base [5, blocks]: E[lo], E[lo + 1] - E[lo], the block's last tokens,
    its first candidate's tokens and forwards (`_segment`'s arithmetic). Returns whether the probabilities are
    finite and >= 0 and n > 0."""
    ok, k, b = n > 0, 0, 0
    for s in range(Ns.shape[0]):
        N, e1 = Ns[s], 0.0
        for lo in range(N):
            p = probs[poff[s] + lo]
            ok = ok and math.isfinite(p) and p >= 0.0
            e0 = e1
            e1 = p if lo == 0 else e0 + p
            de = e1 - e0
            i0, i1 = lo * steps, lo * steps + (steps + 1 if lo == N - 1 else steps)
            base[0, b], base[1, b] = e0, de
            base[2, b] = n * ((1.0 + e0) + ((i1 - 1) / steps - lo) * de)
            base[3, b] = n * ((1.0 + e0) + (i0 / steps - lo) * de)
            base[4, b] = float(fw[k + lo])
            b += 1
        k += N + 1
    return ok


@njit(cache=True, nogil=True, inline="always")
def _sum_init(row, C, acc):
    """`_block`(row[:C]) (C <= 128) with its partial sums kept in acc [16] for `_sum_swap`: below 8 the running
    sums (acc[c] after entry c); else the 8 accumulators acc[:8], their total acc[8] and the running sums of the
    rest (acc[9 + t] after its entry t)."""
    if C < 8:
        s = 0.0
        for c in range(C):
            s += row[c]
            acc[c] = s
        return s
    B = C - C % 8
    for j in range(8):
        r = row[j]
        for i in range(j + 8, B, 8):
            r += row[i]
        acc[j] = r
    return _sum_rest(row, C, B, B, True, acc)


@njit(cache=True, nogil=True, inline="always")
def _sum_rest(row, C, B, m, tree, acc):
    """`_sum_init`'s total past the accumulators: their sum tree (where `tree`: an accumulator changed), then the
    entries from m >= B on."""
    if tree:
        acc[8] = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))
    s = acc[8 + m - B]
    for c in range(m, C):
        s += row[c]
        acc[9 + c - B] = s
    return s


@njit(cache=True, nogil=True, inline="always")
def _sum_swap(row, C, m, acc):
    """`_sum_init`(row, C, acc) after row[m] changed: the partial sums that hold m redone (the same adds)."""
    if C < 8:
        s = acc[m - 1] if m > 0 else 0.0
        for c in range(m, C):
            s += row[c]
            acc[c] = s
        return s
    B = C - C % 8
    if m < B:
        j = m % 8
        r = row[j]
        for i in range(j + 8, B, 8):
            r += row[i]
        acc[j] = r
    return _sum_rest(row, C, B, max(m, B), m < B, acc)


@njit(cache=True, nogil=True, error_model="numpy")
def block_seconds(Ls, loff, Ns, cols, moved, steps, ver, dr, oh, sec):
    """The priced parts of each block's first candidate (`block_heads`' blocks; `_segment`'s arithmetic) into sec
    [2, blocks]: node count lo's levels' summed draft seconds (np.sum's order: `_block`, one level's change redone
    by `_sum_swap`) and the verify table at lo (np.interp's value at a grid point). Returns whether the tables
    allow `best_pruned`'s bounds: ver and dr finite and non-decreasing, oh finite and >= 0."""
    row, acc = np.empty(max(cols.max(), 1)), np.empty(16)
    k, b, last = 0, 0, ver.shape[0] - 1
    for s in range(Ns.shape[0]):
        N, C = Ns[s], cols[s]
        L = Ls[loff[s]:loff[s] + (N + 1) * C].reshape((N + 1, C))
        _level_draft_row(L, 0, C, dr, 0, oh, row)
        ds = 0.0 + (_sum_init(row, C, acc) if C <= 128 else pairwise(row, 0, C))
        for lo in range(N):
            sec[0, b], sec[1, b] = ds, ver[min(lo, last)]
            m = moved[k + lo]
            if m >= 0:   # row to node count lo + 1
                a = L[lo + 1, m]
                row[m] = dr[a] + (oh if a > 0 else oh * 0.0)
                ds = 0.0 + (_sum_swap(row, C, m, acc) if C <= 128 else pairwise(row, 0, C))
            elif m == -2:
                _level_draft_row(L, lo + 1, C, dr, 0, oh, row)
                ds = 0.0 + (_sum_init(row, C, acc) if C <= 128 else pairwise(row, 0, C))
            b += 1
        k += N + 1
    return math.isfinite(oh) and oh >= 0.0 and _monotone(ver) and _monotone(dr)


@njit(cache=True, nogil=True, error_model="numpy")
def fill_block(out, o, L, lo, N, C, fw, m, steps, xs, ver, n, base, sec, b, dr, oh, row, buf, r8):
    """Block lo (block b of all: `block_heads`' and `block_seconds`' parts) of a segment (candidates from out[:,
    o], levels L, fw and moved entry m: its `level_moves`; xs[i] = i / steps) into out, as `_segment` computes
    it (the verify table read at xs here)."""
    i0, i1 = lo * steps, lo * steps + (steps + 1 if lo == N - 1 else steps)
    e0, de = base[0, b], base[1, b]
    inner = lo + 1 <= ver.shape[0] - 1   # np.interp's grid step lo..lo + 1 (x below lo + 1: below its last point)
    y0 = ver[lo] if inner else 0.0
    slope = ver[lo + 1] - y0 if inner else 0.0
    for i in range(i0, i1):
        x = xs[i]
        out[0, o + i] = n * ((1.0 + e0) + (x - lo) * de)
        v = slope * (x - lo) + y0   # interp's slope form on that step (no call per candidate)
        out[3, o + i] = v if inner and lo < x < lo + 1.0 and not math.isnan(v) else interp(x, ver, 0, ver.shape[0])
    for i in range(i0, i1 if m == -1 else i0 + 1):
        out[1, o + i], out[2, o + i] = sec[0, b], base[4, b]
    if m != -1:
        _level_draft_row(L, lo, C, dr, 0, oh, row)
    if m >= 0:
        _moved_run(L, lo, m, i0 + 1, i1, xs, C, dr, 0, dr.shape[0], oh, row, fw, out, o, r8)
    elif m == -2:
        for i in range(i0 + 1, i1):
            out[1, o + i], out[2, o + i] = _between(L, lo, xs[i] - lo, C, dr, 0, dr.shape[0], oh, row, fw, buf)


@njit(cache=True, nogil=True, error_model="numpy")
def fill_blocks(out, base, sec, done, xs, ver, n, Ls, loff, Ns, cols, fw, moved, steps, dr, oh):
    """Every block not `done` filled (`fill_block`) and marked: out is then `candidates`' parts."""
    o, k, b = 0, 0, 0
    row, buf, r8 = np.empty(max(cols.max(), 1)), np.empty(max(cols.max(), 1)), np.empty(8)
    for s in range(Ns.shape[0]):
        N, C = Ns[s], cols[s]
        L = Ls[loff[s]:loff[s] + (N + 1) * C].reshape((N + 1, C))
        for lo in range(N):
            if not done[b]:
                fill_block(out, o, L, lo, N, C, fw[k + lo], moved[k + lo], steps, xs, ver, n, base, sec, b, dr, oh,
                           row, buf, r8)
                done[b] = True
            b += 1
        o += N * steps + 1
        k += N + 1


@njit(cache=True, nogil=True, inline="always", error_model="numpy")
def _seconds(parts, i, calibrated, sd, cd, sv, cv):
    """best_candidate's seconds of candidate i."""
    if calibrated:
        return sd * parts[1, i] + cd * parts[2, i] + sv * parts[3, i] + cv
    return parts[1, i] + parts[3, i]


@njit(cache=True, nogil=True, error_model="numpy")
def _block_bounds(base, sec, Ns, calibrated, sd, cd, sv, cv):
    """Per block: its first candidate's goodput and seconds (`_seconds` of its parts: base[3], sec[0], base[4],
    sec[1]) and its bound (last tokens / those seconds), and per segment the most of its blocks' first goodputs
    (float [3, blocks], [segments])."""
    B, S = base.shape[1], Ns.shape[0]
    out, lb = np.empty((3, B)), np.full(S, -math.inf)
    for b in range(B):
        if calibrated:
            s = sd * sec[0, b] + cd * base[4, b] + sv * sec[1, b] + cv
        else:
            s = sec[0, b] + sec[1, b]
        out[0, b], out[1, b], out[2, b] = base[3, b] / s, s, base[2, b] / s
    b = 0
    for s in range(S):
        for j in range(b, b + Ns[s]):
            lb[s] = max(lb[s], out[0, j])
        b += Ns[s]
    return out, lb


@njit(cache=True, nogil=True, error_model="numpy")
def best_pruned(parts, coff, base, sec, done, xs, ver, n, ok, Ls, loff, Ns, cols, fw, moved, steps, dr, oh,
                calibrated, sd, cd, sv, cv, g0):
    """best_candidate's answer over the candidates whose blocks are `done` in parts (`block_heads`' and
    `block_seconds`' parts; the rest filled, `fill_block`, and marked where looked into) where the bounds hold
    (`ok`, and calibrated: sd, cd, sv finite and >= 0, cv finite; then a block's seconds are at least its first
    candidate's and its tokens at most its last's): per segment, a block is skipped where its bound
    (`_block_bounds`) is at most the best so far x (1 + 1e-12), below the segment's best block start or at most
    its maximum so far (none of its candidates can be a first maximum that counts). Otherwise every block is
    filled and best_candidate runs."""
    if not (ok and (not calibrated or (math.isfinite(sd + cd + sv + cv) and min(sd, cd, sv) >= 0.0))):
        fill_blocks(parts, base, sec, done, xs, ver, n, Ls, loff, Ns, cols, fw, moved, steps, dr, oh)
        return best_candidate(parts, coff, calibrated, sd, cd, sv, cv, g0)
    bb, lb = _block_bounds(base, sec, Ns, calibrated, sd, cd, sv, cv)
    row, buf, r8 = np.empty(max(cols.max(), 1)), np.empty(max(cols.max(), 1)), np.empty(8)
    best, bs, bj, k, b = g0, -1, -1, 0, 0
    for s in range(Ns.shape[0]):
        N, C, o, top = Ns[s], cols[s], coff[s], best * (1 + 1e-12)
        L = Ls[loff[s]:loff[s] + (N + 1) * C].reshape((N + 1, C))
        jm, gm = -1, 0.0
        for lo in range(N):
            if bb[1, b + lo] > 0.0 and (bb[2, b + lo] <= top or bb[2, b + lo] < lb[s]
                                        or (jm >= 0 and bb[2, b + lo] <= gm)):
                continue
            if not done[b + lo]:
                fill_block(parts, o, L, lo, N, C, fw[k + lo], moved[k + lo], steps, xs, ver, n, base, sec, b + lo,
                           dr, oh, row, buf, r8)
                done[b + lo] = True
            for i in range(o + lo * steps, o + lo * steps + (steps + 1 if lo == N - 1 else steps)):
                g = parts[0, i] / _seconds(parts, i, calibrated, sd, cd, sv, cv)
                if jm < 0 or (not math.isnan(gm) and (g > gm or math.isnan(g))):
                    jm, gm = i, g
        if jm >= 0 and gm > best * (1 + 1e-12):
            best, bs, bj = gm, s, jm
        k, b = k + N + 1, b + N
    return bs, bj, best


# ---- goodput's observe: a row's two confidence sums in registers (`_row_conf_sums` of 8 to 128 positions)


@njit(cache=True, nogil=True, inline="always")
def _conf_terms(conf, i, j, d, ver):
    """Row i's terms at position j of `_row_conf_sums`' two sums: c x (j < d), c x (j < ver), c the confidence (NaN
    as 0)."""
    c = conf[i, j]
    c = 0.0 if math.isnan(c) else c
    return c * (1.0 if j < d else 0.0), c * (1.0 if j < ver else 0.0)


@njit(cache=True, nogil=True)
def _row_conf_block(conf, i, d, ver):
    """`_row_conf_sums` of 8 to 128 positions: `_block`'s 8 accumulators (one per position mod 8, from the first
    8 terms), combined as it combines them, then the remaining terms in order, for both sums in one pass."""
    K = conf.shape[1]
    c0, v0 = _conf_terms(conf, i, 0, d, ver)
    c1, v1 = _conf_terms(conf, i, 1, d, ver)
    c2, v2 = _conf_terms(conf, i, 2, d, ver)
    c3, v3 = _conf_terms(conf, i, 3, d, ver)
    c4, v4 = _conf_terms(conf, i, 4, d, ver)
    c5, v5 = _conf_terms(conf, i, 5, d, ver)
    c6, v6 = _conf_terms(conf, i, 6, d, ver)
    c7, v7 = _conf_terms(conf, i, 7, d, ver)
    j = 8
    while j < K - K % 8:
        x0, y0 = _conf_terms(conf, i, j, d, ver)
        x1, y1 = _conf_terms(conf, i, j + 1, d, ver)
        x2, y2 = _conf_terms(conf, i, j + 2, d, ver)
        x3, y3 = _conf_terms(conf, i, j + 3, d, ver)
        x4, y4 = _conf_terms(conf, i, j + 4, d, ver)
        x5, y5 = _conf_terms(conf, i, j + 5, d, ver)
        x6, y6 = _conf_terms(conf, i, j + 6, d, ver)
        x7, y7 = _conf_terms(conf, i, j + 7, d, ver)
        c0, c1, c2, c3, c4, c5, c6, c7 = c0 + x0, c1 + x1, c2 + x2, c3 + x3, c4 + x4, c5 + x5, c6 + x6, c7 + x7
        v0, v1, v2, v3, v4, v5, v6, v7 = v0 + y0, v1 + y1, v2 + y2, v3 + y3, v4 + y4, v5 + y5, v6 + y6, v7 + y7
        j += 8
    cs = ((c0 + c1) + (c2 + c3)) + ((c4 + c5) + (c6 + c7))
    vs = ((v0 + v1) + (v2 + v3)) + ((v4 + v5) + (v6 + v7))
    while j < K:
        x, y = _conf_terms(conf, i, j, d, ver)
        cs, vs = cs + x, vs + y
        j += 1
    return cs, vs


# ---- goodput's observe and keep_drafting, each step's one call (Evidence.observe with PositionFactors.forget_add)


@njit(cache=True, nogil=True)
def _drafting_rows(keep, conf, s, cal, depths, j1, idx):
    """`drafting_keep`'s pass over the rows: keep cleared, s <- s x min(confidence (0 where NaN) x cal, 1), and the
    rows drafting (confidence not NaN) with depths past j1 written to idx. Returns their count."""
    m = 0
    for i in range(s.shape[0]):
        keep[i] = False
        c = conf[i]
        on = not math.isnan(c)
        s[i] = s[i] * minimum((c if on else 0.0) * cal[i], 1.0)
        if on and depths[i] > j1:
            idx[m] = i
            m += 1
    return m


@njit(cache=True, nogil=True)
def _evidence_rows(drafted, accepted, conf, table, cols, estimate, paired, col):
    """`evidence_counts`' per-row sums and table updates; where col holds columns (col [4, K]), also
    `position_sums`' column sums from the counts (row i verified its positions below min(drafted, accepted + 1),
    accepted those below accepted), each column's terms in row order: for estimates finite and >= 0 and K > 1,
    where each term numpy adds for a position a row did not reach is +0 (identity). Returns (the batch's sums of
    accepted, rejected, confidence, drafted, verified confidence and verified, the drafted rows' mean depth)."""
    n, K = conf.shape
    sums = col.shape[1] > 0
    csum, vrow = np.empty(n), np.empty(n)
    row_c, row_v = np.empty(K), np.empty(K)
    acc_sum, dr_sum, ver_sum, rej_sum, dr_rows = 0, 0, 0, 0.0, 0
    for i in range(n):
        d, a = drafted[i], accepted[i]
        ver = min(d, a + 1)
        if 8 <= K <= 128:   # (`_row_conf_sums` in registers)
            csum[i], vrow[i] = _row_conf_block(conf, i, d, ver)
        else:
            csum[i], vrow[i] = _row_conf_sums(conf, i, d, ver, row_c, row_v)
        rej = 1.0 if a < d else 0.0
        table[i, cols[0]] += a
        table[i, cols[1]] += rej
        table[i, cols[2]] += csum[i]
        table[i, cols[3]] += d
        table[i, cols[4]] += vrow[i]
        table[i, cols[5]] += ver
        acc_sum += a
        rej_sum += rej
        dr_sum += d
        ver_sum += ver
        dr_rows += d > 0
        if sums:
            _position_terms(col, K, d, a, ver, estimate[i], paired)
    return (acc_sum, rej_sum, pairwise(csum, 0, n), dr_sum, pairwise(vrow, 0, n), ver_sum,
            dr_sum / dr_rows if dr_rows else np.nan)


@njit(cache=True, nogil=True, inline="always")
def _row_conf_sums(conf, i, d, ver, row_c, row_v):
    """Row i's confidence sums over its drafted (j < d) and verified (j < ver) positions, NaN as 0: numpy's sums of
    c x (j < d) and c x (j < ver) (`pairwise`; below 8 positions its plain loop, without the row buffers)."""
    K = conf.shape[1]
    if K < 8:
        cs, vs = 0.0, 0.0
        for j in range(K):
            c = conf[i, j]
            c = 0.0 if math.isnan(c) else c
            cs += c * (1.0 if j < d else 0.0)
            vs += c * (1.0 if j < ver else 0.0)
        return cs, vs
    for j in range(K):
        c = conf[i, j]
        c = 0.0 if math.isnan(c) else c
        row_c[j] = c * (1.0 if j < d else 0.0)
        row_v[j] = c * (1.0 if j < ver else 0.0)
    return pairwise(row_c, 0, K), pairwise(row_v, 0, K)


@njit(cache=True, nogil=True, inline="always")
def _position_terms(col, K, d, a, ver, e, paired):
    """One row's non-zero terms of `position_sums`' columns (see `_evidence_rows`)."""
    for p in range(min(ver, K)):
        col[1, p] += e
    for p in range(min(ver, a, K)):
        col[0, p] += 1.0
    if paired:
        first = 0 < ver and 0 < a
        for p in range(min(d, K)):
            col[3, p] += e
            if first:
                col[2, p] += 1.0


@njit(cache=True, nogil=True)
def evidence_observe(drafted, accepted, conf, table, cols, exps, estimate, paired, acc_s, exp_s, first_acc, first_exp,
                     f, prior, optimism):
    """`goodput_evidence.Evidence.observe`'s step in one pass: `evidence_counts` (the per-request `table`, the
    batch's sums), keep = exps[the drafted sum] (`exps`: np.exp(-d / memory) at d = 0, 1, ...: numpy's exp, as
    observe computes it), then `PositionFactors.forget_add(keep, ...)` (`forget_add_sums`, with `paired` over the
    rows' drafted; the column sums from the counts where `_evidence_rows` may) and its factors at the new sums
    written to f (`position_factors_into`; paired: the policy's PositionFactors.paired). Returns (status, keep, the
    sums of accepted, rejected, confidence, drafted, verified confidence and verified, the drafted rows' mean
    depth, the factors' ok); status 0: done; else nothing written: 2, no row drafted; 1, the drafted sum outside
    the table, the rows' vectors and table not n long, the table short of a column or a sum of K positions."""
    K = conf.shape[1]
    status, d, direct = _evidence_status(drafted, accepted, conf, table, cols, exps, estimate)
    if min(acc_s.shape[0], exp_s.shape[0], first_acc.shape[0], first_exp.shape[0]) < K:
        status = 1
    if status:
        return status, 0.0, 0, 0.0, 0.0, 0, 0.0, 0, 0.0, False
    keep = exps[d]
    scale4(acc_s, exp_s, first_acc, first_exp, keep)
    if direct:
        col = np.zeros((4, K))
        a_sum, rej, csum, d_sum, vconf, ver, dbar = _evidence_rows(drafted, accepted, conf, table, cols, estimate,
                                                                   paired, col)
        _add_columns(col, K, acc_s, exp_s, first_acc, first_exp, paired)
    else:
        verified, acc_mask, a_sum, rej, csum, d_sum, vconf, ver, dbar = evidence_counts(drafted, accepted, conf,
                                                                                        table, cols)
        position_sums(verified, acc_mask, estimate, drafted, paired, acc_s, exp_s, first_acc, first_exp)
    ok = position_factors_into(f, acc_s, exp_s, first_acc, first_exp, prior, optimism, paired)
    return 0, keep, a_sum, rej, csum, d_sum, vconf, ver, dbar, ok


@njit(cache=True, nogil=True)
def pad_shape(drafted, ctx):
    """`cost.pad_extra`'s shapes after verification (n rows, n > 0): k, the deepest row's drafts (at least 0), and
    top, the longest context (`int_stats` of each); whether nothing pads (one row, or every row at context top
    and k drafts; else the padded verify's shapes are top and k at every row). Returns (nothing pads, k, top)."""
    dmin, k, _ = int_stats(drafted)
    cmin, top, _ = int_stats(ctx)
    k = max(k, 0)
    return drafted.shape[0] == 1 or (cmin == top and dmin == k), k, top


@njit(cache=True, nogil=True)
def _evidence_status(drafted, accepted, conf, table, cols, exps, estimate):
    """`evidence_observe`'s checks: (status: 0 to go on, 1 the drafted sum d outside exps or a row vector, the table
    or its columns not the rows', 2 no row drafted; d; whether its column sums may come from the counts: two or
    more positions and every estimate finite and >= 0)."""
    n, K = conf.shape
    d, some, direct = 0, False, K > 1
    for i in range(n):
        d += drafted[i]
        some = some or drafted[i] != 0
    if not (accepted.shape[0] == estimate.shape[0] == table.shape[0] == n and 0 <= d < exps.shape[0]):
        return 1, d, False
    for j in range(cols.shape[0]):
        if not 0 <= cols[j] < table.shape[1]:
            return 1, d, False
    if not some:
        return 2, d, False
    for i in range(n):
        e = estimate[i]
        direct = direct and 0.0 <= e < math.inf
    return 0, d, direct


# ---- the kit's per-step blocks: ConfidenceCalibration, PerRequest, shrunk_rates, expected_tokens, PositionFactors,
# tie_bands, PaddingFit, the cost tables and the idle rules ----------------------------------------------------------

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


@njit(cache=True, nogil=True)
def _sum(a):
    """`a.sum()` of a contiguous float64 vector (numpy's add.reduce: 0.0 + the pairwise sum)."""
    return 0.0 + pairwise(a, 0, a.shape[0])


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


@functools.lru_cache(maxsize=1)
def blas_dot_matches() -> bool:
    """Whether `_ddot` equals this machine's `x @ y` bit for bit on random vectors (lengths 1 to 80)."""
    rng = np.random.default_rng(47)
    for n in list(range(1, 81)) * 4:
        x, y = rng.normal(size=n) * 10.0 ** rng.integers(-3, 4, n), rng.normal(size=n)
        if _ddot(x, y) != float(x @ y):
            return False
    return True


# ---- kit.tree's per-step blocks: RankEstimate's chain steps and its rounded table ---------------------------


@njit(cache=True, nogil=True)
def chain_add(drafted, accepted, slots, cnt, keep):
    """RankEstimate.observe_groups over chain_groups' groups in one pass (row i's tree a chain of drafted[i]
    nodes, its rows per accepted length at cnt[slots[k]:], slots[k] < 0: no group yet): -1 (nothing changed)
    where a drafting row's chain has no group or its accepted length is outside 0..k, 0 where no row drafted;
    else cnt *= keep, then + 1.0 at each drafting row's (chain, accepted length) in row order, and 1."""
    some = False
    for i in range(drafted.shape[0]):
        k = drafted[i]
        if k == 0:
            continue
        if k < 0 or k >= slots.shape[0] or slots[k] < 0 or accepted[i] < 0 or accepted[i] > k:
            return -1
        some = True
    if not some:
        return 0
    for j in range(cnt.shape[0]):
        cnt[j] *= keep
    for i in range(drafted.shape[0]):
        if drafted[i] > 0:
            cnt[slots[drafted[i]] + accepted[i]] += 1.0
    return 1


@njit(cache=True, nogil=True, error_model="numpy")
def started_table(t, hits, trials, strength, scale, prior, table, rounded):
    """RankEstimate.start with a table t, its table, and that rounded as np.round(table x scale) / scale (half to
    even): `hazards`(t) into prior, `rank_table` into table, the rounded table into rounded."""
    hazards(t, prior)
    rank_table(hits, trials, prior, strength, table)
    for r in range(table.shape[0]):
        rounded[r] = np.rint(table[r] * scale) / scale


# ---- kit.tree's plan rows grouped (kit.tree.pair_groups) -------------------------------------------------------


@njit(cache=True, nogil=True)
def group_rows(grp, G, out):
    """The rows of each group g in 0..G - 1 (grp[i]: row i's group) in row order, end to
    end into out[:n], and where each group starts into out[n:n + G + 1] (np.flatnonzero(grp == g) is
    out[start[g]:start[g + 1]]). Returns False, writing nothing, where an entry is outside 0..G - 1."""
    n = grp.shape[0]
    for i in range(n):
        if grp[i] < 0 or grp[i] >= G:
            return False
    for g in range(G + 1):
        out[n + g] = 0
    for i in range(n):
        out[n + grp[i] + 1] += 1
    for g in range(G):
        out[n + g + 1] += out[n + g]
    at = out[n:n + G].copy()   # each group's next free slot
    for i in range(n):
        g = grp[i]
        out[at[g]] = i
        at[g] += 1
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


@njit(cache=True, nogil=True)
def conf_counts(lg, l1p, ok, keep, work, lim, scale, a, b, lam, two):
    """`conf_bins` on a kept work array whose rows N and ACC are the counts (updated in place) and X, XX the bins'
    x and x^2."""
    return conf_bins(lg, l1p, ok, keep, work[N], work[ACC], work, lim, scale, work[X], work[XX], a, b, lam, two)


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


@njit(cache=True, nogil=True, inline="always")
def _ascending(a):
    """Whether a[i] >= a[i - 1] for every i."""
    for i in range(1, a.shape[0]):
        if a[i] < a[i - 1]:
            return False
    return True


@njit(cache=True, nogil=True)
def align_rows(old_ids, old, ids, init, new, ids_copy):
    """`PerRequest.align`'s new rows, into new [len(ids), fields]: each id's row of `old` where old_ids holds it
    (its first row in a stable sort of old_ids, as np.argsort(kind="stable") and np.searchsorted find it), else
    `init`; ids copied into ids_copy. Where old_ids ascend (the stable sort leaves them as they are) the first row
    whose id is not below the key is found by bisection, as np.searchsorted's left side finds it. Returns the
    largest id (int(ids.max(initial=-1)))."""
    n, f = ids.shape[0], init.shape[0]
    top = -1
    for i in range(n):
        ids_copy[i] = ids[i]
        top = max(top, ids[i])
        for j in range(f):
            new[i, j] = init[j]
    m = old_ids.shape[0]
    if m == 0:
        return top
    if _ascending(old_ids):
        for i in range(n):
            key = ids[i]
            lo, hi = 0, m
            while lo < hi:
                mid = (lo + hi) >> 1
                if old_ids[mid] < key:
                    lo = mid + 1
                else:
                    hi = mid
            if lo < m and old_ids[lo] == key:
                for j in range(f):
                    new[i, j] = old[lo, j]
        return top
    order = np.argsort(old_ids, kind="mergesort")
    srt = np.empty(m, old_ids.dtype)
    for i in range(m):
        srt[i] = old_ids[order[i]]
    for i in range(n):
        at = min(np.searchsorted(srt, ids[i]), m - 1)
        if srt[at] == ids[i]:
            for j in range(f):
                new[i, j] = old[order[at], j]
    return top


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
    _add_columns(col, k, acc_s, exp_s, first_acc, first_exp, paired)



@njit(cache=True, nogil=True)
def _add_columns(col, k, acc_s, exp_s, first_acc, first_exp, paired):
    """The step's column sums col [4, k] added to the position sums (the first two, and the paired two where
    `paired`), position by position."""
    for p in range(k):
        acc_s[p] += col[0, p]
        exp_s[p] += col[1, p]
        if paired:
            first_acc[p] += col[2, p]
            first_exp[p] += col[3, p]

@njit(cache=True, nogil=True)
def position_sums_counts(k, verified, accepted, estimate, drafted, paired, acc_s, exp_s, first_acc, first_exp):
    """`position_sums` where row i verified its positions below verified[i] and accepted those below accepted[i]:
    the masks p < verified[i], p < accepted[i] built here, then `position_sums`."""
    rows = verified.shape[0]
    vm, am = np.empty((rows, k), np.bool_), np.empty((rows, k), np.bool_)
    for i in range(rows):
        for p in range(k):
            vm[i, p] = p < verified[i]
            am[i, p] = p < accepted[i]
    position_sums(vm, am, estimate, drafted, paired, acc_s, exp_s, first_acc, first_exp)


@njit(cache=True, nogil=True)
def scale4(a, b, c, d, keep):
    """a, b, c, d *= keep (`PositionFactors.forget`)."""
    for x in (a, b, c, d):
        for i in range(x.shape[0]):
            x[i] *= keep


@njit(cache=True, nogil=True, error_model="numpy")
def position_factors(k, accepted, expected, first_acc, first_exp, prior, optimism, paired):
    """`PositionFactors._factor`'s operations (`position_factors_into` a new array of k). Returns (f, ok)."""
    f = np.empty(k)
    return f, position_factors_into(f, accepted, expected, first_acc, first_exp, prior, optimism, paired)


@njit(cache=True, nogil=True, error_model="numpy")
def position_factors_into(f, accepted, expected, first_acc, first_exp, prior, optimism, paired):
    """`PositionFactors._factor`'s operations for positions 0..len(f)-1, written to f: (accepted + P) / (expected +
    P); paired, divided by the selection ratio (first_acc + P f_0) / (first_exp + P) and multiplied by f_0; raised
    by optimism x 0.5 sqrt(e) / (e + P), at most to max(f, 1); 1 past the sums. Returns True, or False where an
    expected sum is negative (np.sqrt warns there: the numpy form)."""
    k = f.shape[0]
    f[:] = 1.0
    m = min(k, accepted.shape[0])
    for p in range(m):
        if expected[p] < 0.0:
            return False
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
    return True


@njit(cache=True, nogil=True, error_model="numpy")
def tie_bands(a, tol):
    """`acceptance.tie_bands`: np.unique's sorted distinct values, counts and inverse, the bands (`bands`), each
    band's mean sum(u x count) / sum(count) summed in ascending order (np.bincount's), read back per value.
    Returns (the values, True) (a itself where tol <= 0, fewer than 2 values or one distinct value), or (a,
    False) where a holds NaN or a zero (np.unique's pick between -0.0 and 0.0): the numpy form decides."""
    n = a.shape[0]
    if tol <= 0.0 or n < 2:
        return a, True
    for i in range(n):
        if a[i] != a[i] or a[i] == 0.0:
            return a, False
    return tie_means(a, np.argsort(a), tol), True


@njit(cache=True, nogil=True)
def tie_means(a, order, tol):
    """`tie_bands`' values past its early outs, with a's ascending order given (`order`)."""
    n = a.shape[0]
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
        return a
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
    return out


# ---- the drain's kept buffers and its answer (drain.finish_best) ----------------------------------------------

LN2 = math.log(2.0)


@njit(cache=True, nogil=True, error_model="numpy")
def _drain_start(x, gm, gs, count, a, b):
    """The first grid point of a row (its groups a..b) where 1 - F may be below 1. Before it every product F is at
    most 2^-56 for any tanh within 2^-49 of the true one (numpy's is: tests/test_kit.py), each factor's CDF being
    at most 2 max(e^(2 arg), 2^-50) (the tanh form's CDF is e^(2 arg) / (1 + e^(2 arg))), raised to its count; so
    1 - F is 1.0 exactly there (`drain_sums` sets F there to 0), and no argument there is computed."""
    top, floor = -56.0 * LN2, -50.0 * LN2
    for i in range(x.shape[0]):
        L = 0.0   # the log of the product's bound
        for q in range(a, b):
            u = 2.0 * _cdf_argument(x[i], gm[q], gs[q])
            v = LN2 + (u if u > floor else floor)
            if v < 0.0:
                L += count[q] * v
        if not L <= top:
            return i
    return x.shape[0]


@njit(cache=True, nogil=True, error_model="numpy")
def finish_setup_into(e, e3, rem, points, mu, sd, args, power, groups, num, T, skip):
    """`finish_setup` written into the caller's buffers (mu, sd [D, n]; args and power; groups [D n, 5]), but for
    the depths d that cannot give `ratio_best(num, maxima, T)`'s answer (skip[d], `_drain_skips`): returns (the
    arguments' number, the `_RAISED` ones' number, the groups' number); where args is shorter than the
    arguments, (their number, -1, the groups' number) and nothing in args or power."""
    finish_moments(e, e3, rem, mu, sd)
    D, n = mu.shape
    _drain_skips(mu, sd, points, num, T, skip)
    x, gm, gs, count = np.empty((D, points)), np.empty(D * n), np.empty(D * n), np.empty(D * n)
    g = _drain_groups(mu, sd, points, x, groups, gm, gs, count, skip)
    k, kp = _drain_offsets(groups[:g])
    if k > args.shape[0] or kp > power.shape[0]:
        return k, -1, g
    _drain_fill(x, groups[:g], gm, gs, count, args, power)
    return k, kp, g


@njit(cache=True, nogil=True, error_model="numpy")
def drain_best(t, groups, mu, sd, points, out, num, T, skip):
    """`drain_sums` into out (inf where skip), then `ratio_best(num, out, T)`: (the first best depth, its value);
    (-1, NaN) where a sum is NaN (the caller's one-row form)."""
    if _drain_sums_into(t, groups, mu, sd, points, out, skip):
        return -1, np.nan
    return ratio_best(num, out, T)


@njit(cache=True, nogil=True, error_model="numpy")
def _drain_skips(mu, sd, points, num, T, skip):
    """skip[d]: whether depth d's ratio num / (S_d T[d]) is sure to fall below another depth's, whatever its maximum
    S_d (then `ratio_best` cannot pick d, and its inf there gives 0 < that other's). A maximum with a proper grid
    from lo > 0 to hi is lo plus a trapezoid sum of 1 - F in [0, 1] (F a product of CDFs in [0, 1]), so S_d <= top
    = min(hi (1 + 1e-12) + (hi - lo) 1e-6 (rounding), `_drain_top`), and S_d >= `_drain_floor`. Rounding keeps
    order: num / (floor T[d]) bounds the ratio above, num / (top T[d]) below. Only for num, lo and T[d] positive
    and finite (else False)."""
    D = mu.shape[0]
    best = -1.0
    up = np.empty(D)
    for d in range(D):
        lo, hi, step, odd = _drain_bounds(mu, sd, d, points)
        up[d] = np.inf
        if odd or not (0.0 < lo < np.inf and 0.0 < T[d] < np.inf and 0.0 < num < np.inf):
            continue
        up[d] = num / (_drain_floor(mu[d], sd[d], lo, step, points) * T[d])
        top = min(hi * (1.0 + 1e-12) + (hi - lo) * 1e-6, _drain_top(mu[d], sd[d], lo, hi, step))
        best = max(best, num / (top * T[d]))
    for d in range(D):
        skip[d] = up[d] < best


@njit(cache=True, nogil=True, error_model="numpy")
def _drain_top(m, s, lo, hi, step):
    """A top over a row's maximum (`_drain_skips`; sd >= 0): from x_c = max(mu + c sd) on, every factor of F (the
    rows' CDFs, their powers, the constant rows' cut) is within e^(-2 arg(c)) + 2^-49 of 1 per row (numpy's tanh
    within 2^-49 of the true one, 1 - tanh(a) <= 2 e^(-2a)), so 1 - F <= beta = n (e^(-2 arg(c)) + 2^-48)
    (rounding included) and the trapezoid sum is at most (x_c - lo) + step + (hi - x_c) beta: the least over c in
    2.5, 3, 3.5, 4 of (max(x_c, lo) + 1.01 step + (hi - x_c) beta + (hi - lo) 1e-9) (1 + 1e-12)."""
    n, top = m.shape[0], np.inf
    for c in (2.5, 3.0, 3.5, 4.0):
        xc = -np.inf
        for i in range(n):
            xc = max(xc, m[i] + c * s[i])
        beta = n * (math.exp(-2.0 * _cdf_argument(c - 1e-6, 0.0, 1.0)) * (1.0 + 1e-12) + 2.0 ** -48)
        xc = max(xc, lo)
        top = min(top, (xc + 1.01 * step + (hi - xc) * beta + (hi - lo) * 1e-9) * (1.0 + 1e-12))
    return top


@njit(cache=True, nogil=True, error_model="numpy")
def _drain_floor(m, s, lo, step, points):
    """A floor under a row's maximum (`_drain_skips`): lo + 0.9999 x the trapezoid sum's floor from lo to x_J, the
    last grid point (`_drain_grid`'s value) at most the largest mean of the rows with sd > 0, then x (1 - 1e-12).
    There that row's factor, and so F, is at most u = min(0.5, 2 max(e^(2 arg), 2^-50)) + 2^-50 (its CDF below
    e^(2 arg) and 0.5, numpy's tanh within 2^-49 of the true one), rising along the grid: in 16 pieces of the
    grid, each piece's 1 - F is at least 1 - u at its right end. lo where no row has sd > 0."""
    top, ts = -np.inf, 0.0
    for i in range(m.shape[0]):
        if s[i] > 0.0 and m[i] > top:
            top, ts = m[i], s[i]
    J = int(min(max((top - lo) / step - 1.0, 0.0), points - 2.0)) if top > lo else 0
    x = float(J) * step + lo
    while J > 0 and not x <= top:
        J -= 1
        x = float(J) * step + lo
    total, xa, prev = 0.0, lo, 0
    for c in range(1, 17):
        j = c * J // 16
        if j == prev:
            continue
        xb = float(j) * step + lo
        u = min(0.5, 2.0 * max(math.exp(2.0 * _cdf_argument(xb, top, ts)) * (1.0 + 1e-12), 2.0 ** -50))
        total += (xb - xa) * (1.0 - (u + 2.0 ** -50))
        xa, prev = xb, j
    return (lo + 0.9999 * total) * (1.0 - 1e-12)


@njit(cache=True, nogil=True)
def padding_calibration_observe(ps, pad, pkeep, prev, sticky, cautious, s, pv, mv, draft, pd, forwards, md, keep,
                                prior, clip, fixed, unidentified):
    """`padding_update(ps, pv, pad, mv, pkeep, prev, sticky, cautious, 2.0)` then `calibration_observe(s, pv, mv,
    draft, ...)` in one call (CostCalibration.observe with a padding feature): padding_update's returns."""
    r = padding_update(ps, pv, pad, mv, pkeep, prev, sticky, cautious, 2.0)
    calibration_observe(s, pv, mv, draft, pd, forwards, md, keep, prior, clip, fixed, unidentified)
    return r


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
def _pf_solve2(s, A, j):
    """`PaddingFit._solve` on features 0 and j (1 or 2; the other at 0): (solved, c0, c1, c2, the last one's
    standard error)."""
    aii, aij, ajj = A[0], A[1] if j == 1 else A[2], A[3] if j == 1 else A[5]
    det = aii * ajj - aij * aij
    if det == 0.0:
        return False, 0.0, 0.0, 0.0, 0.0
    ci, cj = (ajj * s[6] - aij * s[6 + j]) / det, (aii * s[6 + j] - aij * s[6]) / det
    c1, c2 = (cj, 0.0) if j == 1 else (0.0, cj)
    last = aii / det
    se = math.sqrt(_pf_rss(s, ci, c1, c2) / (s[10] - 2) * (0.0 if 0.0 > last else last))
    return True, ci, c1, c2, se


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
    A = (s[0] + s[0] * 1e-9, s[1], s[2], s[3] + s[3] * 1e-9, s[4], s[5] + s[5] * 1e-9)   # (the diagonal lifted)
    ok, c0, c1, c2, se = _pf_solve3(s, A)
    if ok and c1 < 0.0:
        ok, c0, c1, c2, se = _pf_solve2(s, A, 2)
    if not ok:
        return _pf_hold(s, A, prev, 0.0, False, sticky, cautious)
    okp, p0, p1, p2, _ = _pf_solve2(s, A, 1)
    if not okp:
        return _pf_hold(s, A, prev, 0.0, False, sticky, cautious)
    gain = (_pf_rss(s, p0, p1, p2) - _pf_rss(s, c0, c1, c2)) / s[10] >= (0.01 * s[7] / s[10]) ** two
    if gain and c0 > 0.0 and c2 > 3.0 * se and c2 > 0.02 * c0:
        return (c0 if c0 < c2 else c2), c0, c1, True
    if not c2 + 3.0 * se < prev:
        return _pf_hold(s, A, prev, c2 + 3.0 * se, True, sticky, cautious)
    return _pf_hold(s, A, 0.0, c2 + 3.0 * se, True, sticky, cautious)


# ---- CostCalibration's per-phase fits (kit.calibration): the state holds, per phase i (0 draft, 1 verify), the
# decayed sums at 6i..6i+5 and the fit (scale, fixed) at 12 + 2i, 13 + 2i


@njit(cache=True, nogil=True, inline="always")
def _pos_max(x):
    """Python's max(x, 0.0) (NaN stays NaN)."""
    return 0.0 if 0.0 > x else x


@njit(cache=True, nogil=True)
def _calib_solve(s, o, prior):
    """`CostCalibration._solve` of the sums s[o:o + 6]: (scale, fixed)."""
    w = s[o + 5]
    if w <= 0.0 or s[o] <= 0.0:
        return 1.0, 0.0
    k = prior / w
    a11, a12, a22 = s[o] * (1 + k), s[o + 1], s[o + 2] * (1 + k) if s[o + 2] > 0 else 1.0
    b1, b2 = s[o + 3] + k * s[o], s[o + 4]
    det = a11 * a22 - a12 * a12
    if det <= 0.0:
        return 1.0, 0.0
    scale, fixed = (b1 * a22 - b2 * a12) / det, (a11 * b2 - a12 * b1) / det
    if scale < 0.0 or fixed < 0.0:
        return (_pos_max(b1 / a11), 0.0) if fixed < 0.0 else (0.0, _pos_max(b2 / a22))
    return scale, fixed


@njit(cache=True, nogil=True)
def _calib_solve_fixed(s, o, prior, unidentified):
    """`CostCalibration._solve_fixed` of the sums s[o:o + 6]."""
    if s[o + 5] <= 0.0 or s[o] <= 0.0 or s[o + 2] <= 0.0 or \
            1.0 - s[o + 1] * s[o + 1] / (s[o] * s[o + 2]) >= unidentified:
        return _calib_solve(s, o, prior)
    k = prior / s[o + 5]
    fixed = (s[o + 4] - s[o + 1]) / (s[o + 2] * (1 + k))
    if fixed >= 0.0:
        return 1.0, fixed
    return _pos_max((s[o + 3] + k * s[o]) / (s[o] * (1 + k))), 0.0


@njit(cache=True, nogil=True)
def calibration_update(s, i, predicted, count, measured, keep, prior, fixed, unidentified):
    """`CostCalibration.update` of phase i in the state s: each sum v x keep + its feature product, then the fit
    (`_calib_solve_fixed` where `fixed`, else `_calib_solve`)."""
    o = 6 * i
    s[o] = s[o] * keep + predicted * predicted
    s[o + 1] = s[o + 1] * keep + predicted * count
    s[o + 2] = s[o + 2] * keep + count * count
    s[o + 3] = s[o + 3] * keep + predicted * measured
    s[o + 4] = s[o + 4] * keep + count * measured
    s[o + 5] = s[o + 5] * keep + 1.0
    scale, fx = _calib_solve_fixed(s, o, prior, unidentified) if fixed else _calib_solve(s, o, prior)
    s[12 + 2 * i], s[13 + 2 * i] = scale, fx


@njit(cache=True, nogil=True)
def calibration_observe(s, pv, mv, draft, pd, forwards, md, keep, prior, clip, fixed, unidentified):
    """`CostCalibration.observe`'s fits: the verify's update (pv predicted, mv measured, count 1), then, `draft`,
    the draft's (pd, md, count forwards), md first clipped at clip x (scale x pd + fixed x forwards) where clip > 0
    (Python's min)."""
    calibration_update(s, 1, pv, 1.0, mv, keep, prior, False, unidentified)
    if draft:
        if clip > 0.0:
            x = clip * (s[12] * pd + s[13] * forwards)
            md = x if x < md else md
        calibration_update(s, 0, pd, forwards, md, keep, prior, fixed, unidentified)


# ---- StepCost's step reading: the contexts' mean, max and 2 % buckets in one pass (kit.cost) -------------------


@njit(cache=True, nogil=True)
def context_keys(a, exact_below):
    """`StepCost.update`'s reading of a non-empty int64 vector of contexts: (ok, mean, exact, max, the 2 % buckets
    int(log1p(x) x 50) of the max and of the mean): mean = float(sum) / n (`int_stats`' exact integer sum), exact
    where that is float(a.mean()) to the bit (n <= 4096, every value strictly within +-exact_below), log1p libm's
    (as Python's math.log1p). ok False (the rest 0) where a value is negative: the caller's Python form."""
    lo, hi, total = int_stats(a)
    if lo < 0:
        return False, 0.0, False, 0, 0, 0
    n = a.shape[0]
    mean = float(total) / n
    exact = n <= 4096 and -exact_below < lo and hi < exact_below
    return True, mean, exact, hi, int(math.log1p(float(hi)) * 50.0), int(math.log1p(mean) * 50.0)


# ---- the makespan gate's expected maximum (drain.expected_max, not grouped): its CDF arguments past SATURATED
# (tanh exactly 1: a factor of exactly 1 in the product) skipped, numpy's tanh on the others between two loops ----


@njit(cache=True, nogil=True)
def max_arguments(mu, sd, x, args, at):
    """expected_max's grid x (np.linspace(lo, hi, x.size): i x step + lo, the last point hi; lo = max(mu - 6 sd),
    hi = max(mu + 6 sd)) and, for each row with sd > 0 (in order) and grid point, normal_cdf's tanh argument
    ((z + (0.044715 z) z z) x 0.7978845608028654, z = (x - mu) / sd) where it is at most SATURATED, into args
    (their row x x.size + point into `at`). Returns (count, lo, hi, ok); ok False (nothing else meant) where a value
    is not finite, an sd negative, the grid degenerate (hi - lo <= 0, a zero step) or x.size < 2: the numpy form."""
    n, points = mu.shape[0], x.shape[0]
    lo, hi = -np.inf, -np.inf
    for i in range(n):
        m, s = mu[i], sd[i]
        if not (math.isfinite(m) and math.isfinite(s)) or s < 0.0:
            return 0, 0.0, 0.0, False
        a, b = m - 6.0 * s, m + 6.0 * s
        lo, hi = (a if a > lo else lo), (b if b > hi else hi)
    step = (hi - lo) / (points - 1) if points >= 2 else 0.0
    if n == 0 or not hi - lo > 0.0 or step == 0.0:
        return 0, lo, hi, False
    for j in range(points):
        x[j] = float(j) * step + lo
    x[points - 1] = hi
    k = 0
    for i in range(n):
        m, s = mu[i], sd[i]
        if s > 0.0:
            for j in range(points):
                z = (x[j] - m) / s
                t = 0.044715 * z
                t *= z
                t *= z
                z = (z + t) * 0.7978845608028654
                if not z > SATURATED:
                    args[k] = z
                    at[k] = i * points + j
                    k += 1
    return k, lo, hi, True


@njit(cache=True, nogil=True)
def max_integral(mu, sd, x, th, at, k, lo, F):
    """expected_max from `max_arguments`' grid and np.tanh of its arguments (th, the first k): F[j] the product
    over the rows with sd > 0, in order, of 0.5 x (th + 1.0) (1 where saturated, its factor skipped: x 1.0 is
    exact), times (x >= the largest mu of sd = 0) where a row has none; then lo + the trapezoid sum of 1 - F,
    np.trapezoid's arithmetic with numpy's pairwise sum (into F's first points - 1 entries)."""
    n, points = mu.shape[0], x.shape[0]
    for j in range(points):
        F[j] = 1.0
    for q in range(k):
        j = at[q] % points
        F[j] = F[j] * ((th[q] + 1.0) * 0.5)
    top, flat = -np.inf, False
    for i in range(n):
        if not sd[i] > 0.0:
            flat = True
            top = mu[i] if mu[i] > top else top
    if flat:
        for j in range(points):
            F[j] = F[j] * (1.0 if x[j] >= top else 0.0)
    prev = 1.0 - F[0]
    for j in range(1, points):
        y = 1.0 - F[j]
        F[j - 1] = (x[j] - x[j - 1]) * (y + prev) / 2.0
        prev = y
    return lo + (0.0 + pairwise(F, 0, points - 1))


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
def padded_tables(verify, n, flat, pad):
    """`cost.as_padded`'s tables into flat (verify's size) and pad (verify.size // max(n, 1)): the verify without
    drafts at every x (np.full_like), and np.diff of the verify read every n drafts (`every_row_deep`)."""
    size = verify.shape[0]
    for i in range(size):
        flat[i] = verify[0]
    deep = size // max(n, 1) + 1
    prev = verify[0]
    for p in range(1, deep):
        cur = verify[min(p * n, size - 1)]
        pad[p - 1] = cur - prev
        prev = cur


@njit(cache=True, nogil=True)
def corrected(verify, draft, state, timed, idle, extra, v, d, pad):
    """`CostCalibration.correct`'s unpadded tables into v and d: sv x verify + cv and sd x draft + cd with draft[0]
    = 0, the fits (scale, fixed) read from CostCalibration's state (draft at 12-13, verify at 14-15); `timed`:
    then `PolicyTime.apply`'s, verify + idle and pad (its size: one more than the tables' positions) zeros with
    pad[0] = 0.0 + extra."""
    sv, cv, sd, cd = state[14], state[15], state[12], state[13]
    for i in range(verify.shape[0]):
        v[i] = sv * verify[i] + cv
    for i in range(draft.shape[0]):
        d[i] = sd * draft[i] + cd
    d[0] = 0.0
    if timed:
        for i in range(verify.shape[0]):
            v[i] = v[i] + idle
        for p in range(pad.shape[0]):
            pad[p] = 0.0
        pad[0] += extra


@njit(cache=True, nogil=True)
def interp_into(xp, fp, out):
    """np.interp(np.arange(out.size), xp, fp) into out, for an ascending xp: fp[0] below xp[0], fp[-1] from the last
    point on, and per step j of the grid (its points x, xp[j] <= x < xp[j + 1], as numpy's search finds them)
    fp[j] at xp[j] itself, else numpy's slope form (dy / dx) x (x - xp[j]) + fp[j], where that is NaN its
    fallbacks (`_interp_step`; one pass over the step's points). Returns False where xp does not ascend (nothing
    written: the numpy form)."""
    n, m = xp.shape[0], out.shape[0]
    for j in range(1, n):
        if not xp[j] > xp[j - 1]:
            return False
    i = 0
    while i < m and float(i) < xp[0]:
        out[i] = fp[0]
        i += 1
    for j in range(n - 1):
        x0, x1, f0, f1 = xp[j], xp[j + 1], fp[j], fp[j + 1]
        if i < m and float(i) == x0:
            out[i] = f0
            i += 1
        hi = m if x1 >= m else (i if x1 <= i else int(math.ceil(x1)))   # (the points below x1)
        slope = (f1 - f0) / (x1 - x0)
        for k in range(i, hi):
            v = slope * (float(k) - x0) + f0
            out[k] = v if v == v else _interp_step(float(k), x0, x1, f0, f1)
        i = max(i, hi)
    for k in range(i, m):
        out[k] = fp[n - 1]
    return True


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
