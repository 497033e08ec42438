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
