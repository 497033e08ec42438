"""Compiled inner loops of the engine step and the simulator (numba, cached on disk).

Each function replaces several numpy calls that each cost a few microseconds on arrays of a few dozen
rows; one compiled call costs about one. They compute exactly what the numpy expressions they replace
computed (integer sums stay integers; float operations happen in the same order), so results do not
depend on them. The first calls in a fresh checkout compile them (~15 s on a 2-core machine); later processes load
the compiled code from `__pycache__` (numba's `cache=True`).
"""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def depth_stats(d):
    """(min, max, sum) of an int64 depth vector; (0, 0, 0) when empty."""
    n = d.shape[0]
    if n == 0:
        return 0, 0, 0
    lo = hi = d[0]
    tot = 0
    for i in range(n):
        x = d[i]
        tot += x
        if x < lo:
            lo = x
        elif x > hi:
            hi = x
    return lo, hi, tot


@njit(cache=True, nogil=True)
def ragged_sums(ctx, q):
    """(query tokens, attended (query, key) pairs, context tokens) of a ragged forward where row i
    feeds q[i] new tokens over ctx[i] cached ones (causal inside its query block)."""
    t = 0
    c = 0
    qc = 0
    qq = 0
    for i in range(ctx.shape[0]):
        qi = q[i]
        t += qi
        c += ctx[i]
        qc += qi * ctx[i]
        qq += qi * (qi + 1)
    return float(t), float(qc) + float(qq) * 0.5, float(c)


@njit(cache=True, nogil=True)
def int_sum(a):
    s = 0
    for i in range(a.shape[0]):
        s += a[i]
    return s


@njit(cache=True, nogil=True)
def position_counts(ctx, depths):
    """For draft positions p = 0..max(depths)-1: rows with depths > p, and the sum of their contexts."""
    k = 0
    for i in range(depths.shape[0]):
        if depths[i] > k:
            k = depths[i]
    cnt = np.zeros(k + 1, np.int64)
    csum = np.zeros(k + 1, np.int64)
    for i in range(depths.shape[0]):
        d = max(depths[i], 0)
        cnt[d] += 1
        csum[d] += ctx[i]
    # suffix sums: rows with depth >= p + 1
    n_ge = np.zeros(k, np.int64)
    c_ge = np.zeros(k, np.int64)
    run_n = 0
    run_c = 0
    for p in range(k, 0, -1):
        run_n += cnt[p]
        run_c += csum[p]
        n_ge[p - 1] = run_n
        c_ge[p - 1] = run_c
    return n_ge, c_ge


@njit(cache=True, nogil=True)
def leading_accepted(acc, drafted, ctx):
    """Per row: the accepted drafts (leading True entries of acc, at most drafted[i]); advances ctx by
    those plus the bonus/correction token."""
    n, k = acc.shape
    out = np.empty(n, np.int64)
    for i in range(n):
        lim = min(drafted[i], k)
        r = 0
        while r < lim and acc[i, r]:
            r += 1
        out[i] = r
        ctx[i] += r + 1
    return out


@njit(cache=True, nogil=True)
def leading_run(acc):
    """Per row: the number of leading True entries of acc (all k when the row is all True)."""
    n, k = acc.shape
    out = np.empty(n, np.int64)
    for i in range(n):
        r = 0
        while r < k and acc[i, r]:
            r += 1
        out[i] = r
    return out


@njit(cache=True, nogil=True)
def commit(I, F, hacc, hdr, hptr, drafted, accepted, decay, joint, K1, drafting):
    """The engine's per-step bookkeeping over the running batch (see BatchState for the columns):
    emit accepted + 1 tokens per row (clipped at its output length), decay and update the per-row
    acceptance counts of rows that drafted, the per-row totals, the history ring at column hptr and
    the joint (drafted, accepted) histogram. Returns (accepted, drafted, emitted, finished) totals."""
    n = I.shape[0]
    a_sum = d_sum = out = n_done = 0
    for i in range(n):
        d = drafted[i]
        a = accepted[i]
        e = min(a + 1, I[i, 3] - I[i, 2])
        I[i, 2] += e
        out += e
        a_sum += a
        d_sum += d
        if drafting:
            if d > 0:
                F[i, 2] *= decay
                F[i, 3] *= decay
            F[i, 2] += a
            if a < d:
                F[i, 3] += 1.0
            I[i, 5] += d
            I[i, 6] += a
        joint[d * K1 + a] += 1
        hacc[i, hptr] = a
        hdr[i, hptr] = d
        if I[i, 2] >= I[i, 3]:
            n_done += 1
    return a_sum, d_sum, out, n_done


@njit(cache=True, nogil=True)
def compact(keep, I, F, hacc, hdr):
    """Move the kept rows to the front, in order, in place; returns how many were kept."""
    m = 0
    for i in range(keep.shape[0]):
        if keep[i]:
            if m != i:
                I[m] = I[i]
                F[m] = F[i]
                hacc[m] = hacc[i]
                hdr[m] = hdr[i]
            m += 1
    return m


# ---- counter-based random numbers: the simulator's acceptance field ------------------------------------
# A draft token's outcome is a function of (run key, request id, absolute output position, stream), not of
# the order in which the simulation asks for it: every policy sees the same acceptance field (common random
# numbers), as greedy speculative decoding does (the draft's proposal for output position m given the
# target's prefix is fixed, whoever decides how deep to draft). splitmix64 finalisers as the hash.
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLD = np.uint64(0x9E3779B97F4A7C15)
_S30, _S27, _S31, _S11 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(11)


@njit(cache=True, nogil=True, inline="always")
def _mix(x):
    x = (x ^ (x >> _S30)) * _M1
    x = (x ^ (x >> _S27)) * _M2
    return x ^ (x >> _S31)


@njit(cache=True, nogil=True, inline="always")
def keyed_uniform(key, rid, pos, stream):
    """A uniform in [0, 1) determined by (key, request id, position, stream)."""
    h = _mix(np.uint64(key) ^ _mix(np.uint64(rid) * _GOLD + np.uint64(stream)))
    h = _mix(h + (np.uint64(pos) + np.uint64(1)) * _GOLD)
    return float(h >> _S11) * (1.0 / 9007199254740992.0)


@njit(cache=True, nogil=True, inline="always")
def keyed_normal(key, rid, pos, stream):
    """A standard normal (Box-Muller over streams `stream`, `stream + 1`)."""
    u1 = keyed_uniform(key, rid, pos, stream)
    u2 = keyed_uniform(key, rid, pos, stream + 1)
    return np.sqrt(-2.0 * np.log(1.0 - u1)) * np.cos(2.0 * np.pi * u2)


@njit(cache=True, nogil=True)
def _keyed_gamma(key, rid, a, stream):
    """Gamma(a, 1) by Marsaglia-Tsang on the keyed streams stream..stream+3 (attempt i = position i)."""
    boost = 1.0
    if a < 1.0:
        boost = keyed_uniform(key, rid, 0, stream + 3) ** (1.0 / a)
        a += 1.0
    d = a - 1.0 / 3.0
    c = 1.0 / np.sqrt(9.0 * d)
    for i in range(1 << 20):
        x = keyed_normal(key, rid, i, stream)
        v = 1.0 + c * x
        if v <= 0.0:
            continue
        v = v * v * v
        u = keyed_uniform(key, rid, i, stream + 2)
        if u < 1.0 - 0.0331 * x ** 4 or np.log(u) < 0.5 * x * x + d * (1.0 - v + np.log(v)):
            return d * v * boost
    return a * boost   # unreachable in practice (acceptance rate > 95 %)


@njit(cache=True, nogil=True)
def keyed_beta(key, ids, a, b):
    """One Beta(a, b) draw per request id (streams 16..23), the same whatever order requests arrive in."""
    out = np.empty(ids.shape[0])
    for i in range(ids.shape[0]):
        x = _keyed_gamma(key, ids[i], a, 16)
        y = _keyed_gamma(key, ids[i], b, 20)
        out[i] = x / (x + y) if x + y > 0.0 else a / (a + b)
    return out


@njit(cache=True, nogil=True, inline="always")
def _row_base(key, rid, stream):
    return _mix(np.uint64(key) ^ _mix(np.uint64(rid) * _GOLD + np.uint64(stream)))


@njit(cache=True, nogil=True)
def keyed_block(key, ids, pos, k, level, logit_normal, spread, calibration, decay=1.0):
    """The acceptance block of the next k draft positions of every row: row i's draft j proposes output
    position pos[i] + j of request ids[i]. logit_normal False: confidence = level[i] x decay ** j,
    accepted iff u < that (iid, beta: decay 1; decay: < 1). True: confidence = sigmoid(level[i] + spread * z), accepted iff
    u < confidence ** calibration. u: one 64-bit hash per (request, position) on stream 0; z: Box-Muller
    over the two 32-bit halves of one hash on stream 1."""
    n = ids.shape[0]
    conf = np.empty((n, k))
    acc = np.empty((n, k), np.bool_)
    two32 = 1.0 / 4294967296.0
    for i in range(n):
        bu = _row_base(key, ids[i], 0)
        bz = _row_base(key, ids[i], 1)
        f = 1.0
        for j in range(k):
            step = (np.uint64(pos[i] + j) + np.uint64(1)) * _GOLD
            u = float(_mix(bu + step) >> _S11) * (1.0 / 9007199254740992.0)
            if logit_normal:
                hz = _mix(bz + step)
                u1 = (float(hz >> np.uint64(32)) + 0.5) * two32
                u2 = float(hz & np.uint64(0xFFFFFFFF)) * two32
                z = np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)
                c = 1.0 / (1.0 + np.exp(-(level[i] + spread * z)))
                p = c if calibration == 1.0 else c ** calibration
            else:
                c = level[i] * f
                f *= decay
                p = c
            conf[i, j] = c
            acc[i, j] = u < p
    return conf, acc


@njit(cache=True, nogil=True)
def roofline_positions(ctx, depths, a, b, w, kv, inv_f, inv_b, oh):
    """RooflineCost.draft_positions in one pass: (seconds, flops) of the draft forwards of a step, at
    position p one token for each row with depths > p at context ctx + p (same arithmetic, same order)."""
    n_ge, c_ge = position_counts(ctx, depths)
    seconds = 0.0
    flops = 0.0
    for p in range(n_ge.shape[0]):
        n = float(n_ge[p])
        c = float(c_ge[p]) + p * n
        f = a * n + b * (c + n)
        mem = w + kv * (c + n)
        seconds += max(f * inv_f, mem * inv_b) + oh
        flops += f
    return seconds, flops
