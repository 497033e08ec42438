"""Compiled loops of kit.tree's plan search (numba, cached on disk): the candidates' parts of a tree step's price
and the best candidate per depth cap. Each computes what the numpy code it replaces (`plan_trees` over
`TreePrice.seconds`) computed: the same IEEE operations in the same order, np.interp's rule over an arange grid,
numpy's pairwise sum over a row (its 0.0 start, blocks of 8 accumulators), and np.argmax's first maximum (a NaN
wins), so a plan does not depend on it. numpy's error model: a division by zero
gives inf or NaN, as numpy's does."""
from __future__ import annotations

import math

import numpy as np
from numba import njit


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


@njit(cache=True, nogil=True, inline="always", error_model="numpy")
def pairwise(a, lo, n):
    """numpy's pairwise sum of a[lo:lo + n] for n <= 128 (without the reduction's 0.0 start)."""
    if n < 8:
        res = 0.0
        for i in range(lo, lo + n):
            res += a[i]
        return res
    else:
        r0, r1, r2, r3 = a[lo], a[lo + 1], a[lo + 2], a[lo + 3]
        r4, r5, r6, r7 = a[lo + 4], a[lo + 5], a[lo + 6], a[lo + 7]
        i = 8
        while i < n - (n % 8):
            j = lo + i
            r0, r1, r2, r3 = r0 + a[j], r1 + a[j + 1], r2 + a[j + 2], r3 + a[j + 3]
            r4, r5, r6, r7 = r4 + a[j + 4], r5 + a[j + 5], r6 + a[j + 6], r7 + a[j + 7]
            i += 8
        res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
        while i < n:
            res += a[lo + i]
            i += 1
        return res


@njit(cache=True, nogil=True, error_model="numpy")
def _whole_levels(L, N, cols, dbuf, doff, oh, base, fw, ds, moved):
    """Per node count lo in 0..N: its levels' draft seconds (a table entry each, as np.interp gives at a grid
    point; + oh where the level has tokens) in base[lo], their sum (np.sum's order) in ds[lo], the levels with
    tokens in fw[lo], and the level that node lo moves (-1: none, -2: several) in moved[lo]."""
    for lo in range(N + 1):
        cnt, m = 0, -1
        for c in range(cols):
            a = L[lo, c]
            pos = a > 0
            base[lo, c] = dbuf[doff + a] + (oh if pos else oh * 0.0)
            if pos:
                cnt += 1
            if lo < N and L[lo + 1, c] != a:
                m = c if m == -1 else -2
        fw[lo], moved[lo] = cnt, m
        ds[lo] = 0.0 + pairwise(base[lo], 0, cols)


@njit(cache=True, nogil=True, inline="always", error_model="numpy")
def _level_seconds(L, lo, f, c, dbuf, doff, dlen, oh):
    """Level c's draft seconds at node count lo + f (np.interp between its grid points, + oh where it has
    tokens), whether it has tokens, and whether it had at lo."""
    a = L[lo, c]
    lv = float(a) + f * float(L[lo + 1, c] - a)
    pos = lv > 0
    return interp(lv, dbuf, doff, dlen) + (oh if pos else oh * 0.0), pos, a > 0


@njit(cache=True, nogil=True, inline="always", error_model="numpy")
def _between(L, lo, f, cols, dbuf, doff, dlen, oh, base, fw, buf):
    """Summed draft seconds and forwards of node count lo + f (0 < f <= 1) where node lo moves several levels:
    base[lo] with the moved levels' seconds in place, summed in np.sum's order."""
    cnt = fw[lo]
    for c in range(cols):
        if L[lo + 1, c] == L[lo, c]:
            buf[c] = base[lo, c]
        else:
            buf[c], pos, was = _level_seconds(L, lo, f, c, dbuf, doff, dlen, oh)
            cnt += (1 if pos else 0) - (1 if was else 0)
    return 0.0 + pairwise(buf, 0, cols), float(cnt)


@njit(cache=True, nogil=True, error_model="numpy")
def _moved_run(L, lo, m, i0, i1, steps, cols, dbuf, doff, dlen, oh, base, fw, out, o):
    """Candidates i0..i1 - 1 (0 < f <= 1) of node count lo, whose node moves level m: base[lo] with that level's
    seconds in place, summed in np.sum's order, and the forwards."""
    row = base[lo]
    old, a = row[m], L[lo, m]
    d, fa = float(L[lo + 1, m] - a), float(a)
    cnt = fw[lo] - (1 if a > 0 else 0)
    inner = 0 <= a and a + 1 <= dlen - 1   # np.interp's grid step a..a + 1 (x below a + 1: below its last point)
    y0 = dbuf[doff + a] if inner else 0.0
    slope = dbuf[doff + a + 1] - y0 if inner else 0.0
    for i in range(i0, i1):
        lv = fa + (i / steps - lo) * d
        pos = lv > 0
        v = slope * (lv - fa) + y0   # interp's slope form on that step
        if not (inner and fa < lv < fa + 1.0) or math.isnan(v):
            v = interp(lv, dbuf, doff, dlen)
        row[m] = v + (oh if pos else oh * 0.0)
        out[1, o + i] = 0.0 + pairwise(row, 0, cols)
        out[2, o + i] = float(cnt + (1 if pos else 0))
    row[m] = old


@njit(cache=True, nogil=True, error_model="numpy")
def _segment(prob, L, N, cols, steps, n, ver, dbuf, doff, dlen, oh, out, o):
    """One depth cap's candidates (N nodes, steps per node: candidate i = lo steps + k at x = i / steps nodes, lo
    its floor but at most N - 1, f = x - lo) into out[:, o:o + N steps + 1]: tokens, summed draft seconds,
    forwards, verify seconds (ver: by candidate)."""
    E = np.empty(N + 1)
    E[0] = 0.0
    for i in range(N):
        E[i + 1] = prob[0] if i == 0 else E[i] + prob[i]
    c1 = max(cols, 1)
    base, buf = np.empty((N + 1, c1)), np.empty(c1)
    fw, ds, moved = np.empty(N + 1, np.int64), np.empty(N + 1), np.empty(N + 1, np.int64)
    _whole_levels(L, N, cols, dbuf, doff, oh, base, fw, ds, moved)
    for lo in range(N):
        i0, i1 = lo * steps, lo * steps + (steps + 1 if lo == N - 1 else steps)
        e0, de = E[lo], E[lo + 1] - E[lo]
        for i in range(i0, i1):
            out[0, o + i] = n * ((1.0 + e0) + (i / steps - lo) * de)
            out[3, o + i] = ver[i]
        m = moved[lo]
        for i in range(i0, i1 if m == -1 else i0 + 1):   # f = 0, or no level moves: node count lo's levels
            out[1, o + i], out[2, o + i] = ds[lo], float(fw[lo])
        if m >= 0:
            _moved_run(L, lo, m, i0 + 1, i1, steps, cols, dbuf, doff, dlen, oh, base, fw, out, o)
        elif m == -2:
            for i in range(i0 + 1, i1):
                f = i / steps - lo
                out[1, o + i], out[2, o + i] = _between(L, lo, f, cols, dbuf, doff, dlen, oh, base, fw, buf)
    return o + N * steps + 1


@njit(cache=True, nogil=True, error_model="numpy")
def candidates(probs, poff, Ls, loff, Ns, cols, steps, n, ver, dr, oh):
    """float [4, sum(N steps + 1)]: every depth cap's candidates (`_segment`), segment s from the flat node
    probabilities probs[poff[s]:] and levels Ls[loff[s]:] ([N + 1, cols[s]]), under the verify table `ver`
    (x nodes a row) and the draft table `dr` (one forward of q tokens a row)."""
    S = Ns.shape[0]
    total, M = 0, 1
    for s in range(S):
        total += Ns[s] * steps + 1
        M = max(M, Ns[s] * steps + 1)
    out = np.empty((4, total))
    vx = np.empty(M)
    for i in range(M):
        vx[i] = interp(i / steps, ver, 0, ver.shape[0])
    o = 0
    for s in range(S):
        N, c = Ns[s], cols[s]
        L = Ls[loff[s]:loff[s] + (N + 1) * c].reshape((N + 1, c))
        o = _segment(probs[poff[s]:poff[s] + N], L, N, c, steps, float(n), vx, dr, 0, dr.shape[0], oh, out, o)
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


@njit(cache=True, nogil=True, error_model="numpy")
def _masses(par, dep, rnk, counts, table, R, W):
    """RankEstimate._expected_counts' weights for one tree (node arrays par, dep, rnk; counts[a]: rows that
    accepted a nodes): W[1 + i] the rows whose path ends at node i (W[0]: at the root); returns the rows whose path
    passes through each node, [root, node 0, ...] (the numpy form's bincounts and add.at, in node order)."""
    N = par.shape[0]
    reach, acc = np.empty(N), np.zeros(N + 1)
    level, size = np.zeros(counts.shape[0]), np.zeros(counts.shape[0], np.int64)
    for i in range(N):
        pr = table[rnk[i]] if rnk[i] < R else 0.0
        reach[i] = pr * (reach[par[i]] if par[i] >= 0 else 1.0)
        acc[par[i] + 1] += table[rnk[i]] if rnk[i] < R else 0.0
    for i in range(N):
        m = 1.0 - acc[i + 1]
        reach[i] = reach[i] * (m if (m >= 0.0 or math.isnan(m)) else 0.0)   # now: the path's end weight
        level[dep[i]] += reach[i]
        size[dep[i]] += 1
    W[0] = counts[0]
    for i in range(N):
        lv = level[dep[i]]
        W[i + 1] = counts[dep[i]] * (reach[i] / lv if lv > 0 else 1.0 / size[dep[i]])
    mass = W.copy()
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
    reversed cumsums)."""
    full, ends = np.empty(R + 1), np.empty(R + 1)
    for g in range(noff.shape[0] - 1):
        counts = cnt[coff[g]:coff[g + 1]]
        keep[g] = 0.0 + pairwise(counts, 0, counts.shape[0]) >= 1e-3
        if not keep[g]:
            continue
        a, b = noff[g], noff[g + 1]
        W = np.empty(b - a + 1)
        mass = _masses(par[a:b], dep[a:b], rnk[a:b], counts, table, R, W)
        full[:], ends[:] = 0.0, 0.0
        kids = np.zeros(b - a + 1, np.int64)
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
    return keep


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
