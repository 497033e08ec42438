"""Compiled loops of the kit's searches (numba, cached on disk), for the float loops whose numpy form is a few
calls per position on arrays of a few dozen rows. Each computes what the numpy code it replaces computed: the
same IEEE operations (+, -, x, no fused or reordered arithmetic) in the same order, and the same first-maximum
rule as np.argmax, so a plan does not depend on it."""
from __future__ import annotations

import math

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def by_position(C, K, G, ver, dr, pad, has_pad, n, base):
    """`search._by_position` over a cumulative table C[m, p] (the best m rows' values at position p): per
    position the m in 0..prev maximising C[m, p] - G x (draft[m] (+ pad[p] for m > 0) + verify[x + m] -
    verify[x]); stops at m = 0 or a gain <= 0. Returns (the m per position, their count, value, seconds)."""
    ms = np.zeros(K, np.int64)
    x, e, tdraft, prev, count = 0, base, 0.0, n, 0
    for p in range(K):
        vx = ver[x]
        m, best, dm = 0, 0.0, 0.0
        for j in range(prev + 1):
            dj = dr[j] + pad[p] if has_pad and j > 0 else dr[j]
            g = C[j, p] - G * (dj + ver[x + j] - vx)
            if j == 0 or (not math.isnan(best) and (g > best or math.isnan(g))):
                m, best, dm = j, g, dj
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
        vx = ver[x]
        m, best, dm = 0, 0.0, 0.0
        for j in range(k + 1):
            dj = dr[j] + pad[p] if has_pad and j > 0 else dr[j]
            g = c[j] - G * (dj + ver[x + j] - vx)
            if j == 0 or (not math.isnan(best) and (g > best or math.isnan(g))):
                m, best, dm = j, g, dj
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
        e[k] = 0.0 + pairwise_sum(row, 0, n)
    T = step_seconds(x, deep, verify, draft_n, pad)
    best, bg = 0, 0.0
    for k in range(K):
        g = e[k] / T[k]
        if k == 0 or (not math.isnan(bg) and (g > bg or math.isnan(g))):
            best, bg = k, g
    return best, bg


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
def verified_masks(drafted, accepted, deep):
    """Per row and draft position p < deep: whether p was verified (p < min(drafted, accepted + 1)) and whether it
    was accepted (p < accepted)."""
    n = drafted.shape[0]
    ver = np.zeros((n, deep), np.bool_)
    acc = np.zeros((n, deep), np.bool_)
    for i in range(n):
        v = min(drafted[i], accepted[i] + 1)
        for p in range(min(v, deep)):
            ver[i, p] = True
        for p in range(min(max(accepted[i], 0), deep)):
            acc[i, p] = True
    return ver, acc


@njit(cache=True, nogil=True)
def capped(depths, remaining, kmax, room):
    """`CostAwarePolicy.finish`'s first part: min(depths, `search.draft_caps`) per row, and whether their sum fits
    in `room` (then `search.fit_token_cap` keeps them)."""
    out = np.empty(depths.shape[0], np.int64)
    total = 0
    for i in range(depths.shape[0]):
        out[i] = min(depths[i], min(max(remaining[i] - 1, 0), kmax))
        total += out[i]
    return out, total <= room


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


@njit(cache=True, nogil=True)
def scaled_tokens(col, f):
    """`search.uniform_depth`'s draining rows at the batch's level: e[k, i] = mean_k(col[k] over the n rows) x
    f[k, i] / mean_k(f[k]), the means as np.mean's (np.sum's order, then / n)."""
    K, n = f.shape
    e = np.empty((K, n))
    row = np.empty(n)
    for k in range(K):
        row[:] = col[k]
        m = (0.0 + pairwise_sum(row, 0, n)) / n
        fm = (0.0 + pairwise_sum(f[k], 0, n)) / n
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


@njit(cache=True, nogil=True)
def finish_moments(e, e3, rem):
    """`search._steps_to_finish`'s normal approximation: per depth k and row i, the mean rem_i / e[k, i] steps and
    its sd, sqrt(rem_i x max(L2 - (e - 1)^2, 0) / e3), L2[k] the running sum over p < k of (2p + 1) x
    (e[p + 1] - e[p]) (np.cumsum's order); e3 = e ** 3 (numpy's power)."""
    K, n = e.shape
    mu, sd = np.empty((K, n)), np.empty((K, n))
    for i in range(n):
        L = 0.0
        for k in range(K):
            if k > 0:
                t = (2.0 * (k - 1) + 1.0) * (e[k, i] - e[k - 1, i])
                L = t if k == 1 else L + t
            w = e[k, i] - 1.0
            v = L - w * w
            mu[k, i] = rem[i] / e[k, i]
            sd[k, i] = math.sqrt(rem[i] * (v if v >= 0.0 or math.isnan(v) else 0.0) / e3[k, i])   # np.maximum
    return mu, sd


# ---- the drain's expected maxima (drain.expected_maxes) --------------------------------------------------
# numpy's tanh and power (vector code whose last bits differ from libm's) run between these kernels on the
# gathered arguments. A CDF argument above SATURATED has tanh exactly 1, so its CDF, its power and its factor in
# the product are exactly 1: the arguments rise along the grid, and each group's are cut where they pass it.
SATURATED = 22.0


@njit(cache=True, nogil=True)
def drain_setup(mu, sd, points):
    """expected_maxes' grids and CDF arguments for rows d of [D, n] arrays (the same operations): lo, hi, x [D,
    points] (i x step + lo, the last point hi), `odd` (a degenerate or non-finite grid: the caller's one-row form),
    the groups (`drain._row_groups` over the rows with sd > 0 and mu + 6 sd > lo: d, mu, sd, count, ascending),
    and per group the tanh arguments of its grid points below saturation (`args[off[g]:off[g] + size[g]]`)."""
    D, n = mu.shape
    lo, hi = np.empty(D), np.empty(D)
    odd = np.zeros(D, np.bool_)
    x = np.empty((D, points))
    for d in range(D):
        a, b = mu[d, 0] - 6.0 * sd[d, 0], mu[d, 0] + 6.0 * sd[d, 0]
        for r in range(1, n):
            a = max(a, mu[d, r] - 6.0 * sd[d, r])
            b = max(b, mu[d, r] + 6.0 * sd[d, r])
        step = (b - a) / (points - 1)
        lo[d], hi[d] = a, b
        odd[d] = not (math.isfinite(a) and math.isfinite(b) and b - a > 0.0 and step != 0.0)
        for i in range(points):
            x[d, i] = float(i) * step + a
        x[d, points - 1] = b
    gd, gm, gs, gc = _groups(mu, sd, lo, odd)
    off = np.empty(gd.shape[0], np.int64)
    size = np.empty(gd.shape[0], np.int64)
    args = np.empty(gd.shape[0] * points)
    k = 0
    for g in range(gd.shape[0]):
        d, m, s = gd[g], gm[g], gs[g]
        a, b = 0, points   # the first saturated point, by bisection (the arguments do not fall along the grid)
        while a < b:
            h = (a + b) // 2
            if _cdf_argument(x[d, h], m, s) > SATURATED:
                b = h
            else:
                a = h + 1
        off[g], size[g] = k, a
        for i in range(a):
            args[k + i] = _cdf_argument(x[d, i], m, s)
        k += a
    return lo, hi, x, odd, gd, gc, off, size, args[:k]


@njit(cache=True, nogil=True, inline="always")
def _cdf_argument(x, m, s):
    """The argument of tanh in `drain.normal_cdf((x - m) / s)`, in its operations' order."""
    z = (x - m) / s
    return (z + 0.044715 * z * z * z) * 0.7978845608028654


@njit(cache=True, nogil=True)
def _groups(mu, sd, lo, odd):
    """`drain._row_groups` over the rows d not `odd`, with near = sd > 0 and mu + 6 sd > lo[d]."""
    D, n = mu.shape
    gd, gm = np.empty(D * n, np.int64), np.empty(D * n)
    gs, gc = np.empty(D * n), np.empty(D * n)
    g = 0
    m, s = np.empty(n), np.empty(n)
    for d in range(D):
        k = 0
        for i in range(n):
            if not odd[d] and sd[d, i] > 0.0 and mu[d, i] + 6.0 * sd[d, i] > lo[d]:
                m[k], s[k] = mu[d, i], sd[d, i]
                k += 1
        order = np.argsort(m[:k])
        for i in range(1, k):   # ties of mu by sd (insertion: the runs of equal mu are short)
            j, o = i, order[i]
            while j > 0 and m[order[j - 1]] == m[o] and s[order[j - 1]] > s[o]:
                order[j] = order[j - 1]
                j -= 1
            order[j] = o
        for i in range(k):
            a, b = m[order[i]], s[order[i]]
            if i > 0 and a == gm[g - 1] and b == gs[g - 1]:
                gc[g - 1] += 1.0
            else:
                gd[g], gm[g], gs[g], gc[g] = d, a, b, 1.0
                g += 1
    return gd[:g], gm[:g], gs[:g], gc[:g]


@njit(cache=True, nogil=True)
def drain_cdfs(t, gd, gc, off, size, D):
    """The CDFs (t + 1) x 0.5 from t = tanh(argument), in place, raised as numpy's `block ** count` raises them:
    in a row whose groups do not all count 1, each group with count > 1 (x ** 1 is x exactly); a row of one group
    of count 2 squares (numpy's fast path for a size-1 exponent of 2) here. Returns the bases numpy's power
    raises, their exponents and their positions in t."""
    groups = np.zeros(D, np.int64)
    high = np.zeros(D, np.bool_)
    for g in range(gd.shape[0]):
        groups[gd[g]] += 1
        high[gd[g]] |= gc[g] != 1.0
    for j in range(t.shape[0]):
        t[j] = (t[j] + 1.0) * 0.5
    total = 0
    for g in range(gd.shape[0]):
        if high[gd[g]] and gc[g] != 1.0:
            total += size[g]
    base, ex, at = np.empty(total), np.empty(total), np.empty(total, np.int64)
    k = 0
    for g in range(gd.shape[0]):
        d = gd[g]
        if not high[d] or gc[g] == 1.0:
            continue
        if groups[d] == 1 and gc[g] == 2.0:
            for j in range(off[g], off[g] + size[g]):
                t[j] = t[j] * t[j]
            continue
        for j in range(off[g], off[g] + size[g]):
            base[k], ex[k], at[k] = t[j], gc[g], j
            k += 1
    return base[:k], ex[:k], at[:k]


@njit(cache=True, nogil=True)
def drain_sums(x, lo, hi, c, gd, off, size, mu, sd, odd, raised, at):
    """Per row d not `odd` (NaN for the rest, but the largest mu where hi <= lo): lo[d] + the trapezoid sum (np.sum's pairwise order) of 1 - F over the grid x[d], F the
    product (in group order) of its groups' factors c (`raised` at positions `at`; the saturated ones are 1),
    times (x >= the largest mu of the rows with sd <= 0) where row d has any."""
    D, P = x.shape
    for k in range(at.shape[0]):
        c[at[k]] = raised[k]
    F = np.ones((D, P))
    for g in range(gd.shape[0]):
        d, o = gd[g], off[g]
        for i in range(size[g]):
            F[d, i] = F[d, i] * c[o + i]
    out = np.empty(D)
    terms = np.empty(P - 1)
    for d in range(D):
        if odd[d]:
            out[d] = np.nan
            if math.isfinite(lo[d]) and math.isfinite(hi[d]) and hi[d] - lo[d] <= 0.0:
                out[d] = mu[d].max()   # expected_max's degenerate grid: the largest mean
            continue
        cut, top = False, -math.inf
        for r in range(mu.shape[1]):
            if not sd[d, r] > 0.0:
                cut, top = True, max(top, mu[d, r])
        if cut:
            for i in range(P):
                F[d, i] = F[d, i] * (1.0 if x[d, i] >= top else 0.0)
        for i in range(P - 1):
            terms[i] = (x[d, i + 1] - x[d, i]) * ((1.0 - F[d, i + 1]) + (1.0 - F[d, i])) / 2.0
        out[d] = lo[d] + (0.0 + pairwise_sum(terms, 0, P - 1))
    return out


@njit(cache=True, nogil=True)
def pairwise_sum(a, start, n):
    """numpy's pairwise sum of a[start:start + n] (float64, contiguous): above 128 terms the sum of the two halves'
    (the first a multiple of 8), each summed so (`_block_sum` from 128 terms down); a stack, not recursion (numba's
    cache does not reload recursive functions)."""
    seg = np.empty((64, 3), np.int64)   # (start, length, stage: 0 new, 1 first half done, 2 both)
    vals = np.empty(64)
    top, nv = 0, 0
    seg[0, 0], seg[0, 1], seg[0, 2] = start, n, 0
    while top >= 0:
        s, m, st = seg[top, 0], seg[top, 1], seg[top, 2]
        half = m // 2 - (m // 2) % 8
        if m <= 128:
            vals[nv] = _block_sum(a, s, m)
            nv += 1
            top -= 1
        elif st == 0:
            seg[top, 2] = 1
            top += 1
            seg[top, 0], seg[top, 1], seg[top, 2] = s, half, 0
        elif st == 1:
            seg[top, 2] = 2
            top += 1
            seg[top, 0], seg[top, 1], seg[top, 2] = s + half, m - half, 0
        else:
            nv -= 1
            vals[nv - 1] = vals[nv - 1] + vals[nv]
            top -= 1
    return vals[0]


@njit(cache=True, nogil=True)
def _block_sum(a, start, n):
    """numpy's pairwise sum of at most 128 terms: below 8 in order; else eight running sums combined as
    ((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7)), the rest added in order."""
    if n < 8:
        r = 0.0
        for i in range(start, start + n):
            r += a[i]
        return r
    r0, r1, r2, r3 = a[start], a[start + 1], a[start + 2], a[start + 3]
    r4, r5, r6, r7 = a[start + 4], a[start + 5], a[start + 6], a[start + 7]
    i = 8
    while i < n - n % 8:
        b = start + i
        r0 += a[b]
        r1 += a[b + 1]
        r2 += a[b + 2]
        r3 += a[b + 3]
        r4 += a[b + 4]
        r5 += a[b + 5]
        r6 += a[b + 6]
        r7 += a[b + 7]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        res += a[start + i]
        i += 1
    return res
