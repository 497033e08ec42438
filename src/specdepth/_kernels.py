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
def advance(x, accepted):
    """x[i] += accepted[i] + 1 (the tokens a verify emits per row: accepted drafts + the bonus/correction)."""
    for i in range(x.shape[0]):
        x[i] += accepted[i] + 1


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
def leading_run(acc, cap):
    """Per row: the number of leading True entries of acc, at most cap[i] (the row's drafts)."""
    n, k = acc.shape
    out = np.empty(n, np.int64)
    for i in range(n):
        lim = min(cap[i], k)
        r = 0
        while r < lim and acc[i, r]:
            r += 1
        out[i] = r
    return out


def leading_runs(acc):
    """Per row: the number of leading True entries of acc (all k when the row is all True)."""
    return leading_run(acc, np.full(acc.shape[0], acc.shape[1], np.int64))


@njit(cache=True, nogil=True)
def commit(generated, output_len, accepted_w, rejected_w, drafted_total, accepted_total, last_depth,
           depth_changes, ring_accepted, ring_drafted, hptr, drafted, accepted, decay, joint, K1, drafting):
    """The engine's per-step bookkeeping over the running batch (named columns of the RowTable): emit
    accepted + 1 tokens per row (clipped at its output length), decay and update the per-row acceptance
    counts of rows that drafted, the per-row totals, the depth-change count, the history rings at column
    hptr and the joint (drafted, accepted) histogram. Returns (accepted, drafted, emitted, finished) totals."""
    n = generated.shape[0]
    a_sum = d_sum = out = n_done = 0
    for i in range(n):
        d = drafted[i]
        a = accepted[i]
        e = min(a + 1, output_len[i] - generated[i])
        generated[i] += e
        out += e
        a_sum += a
        d_sum += d
        if drafting:
            if d > 0:
                accepted_w[i] *= decay
                rejected_w[i] *= decay
            accepted_w[i] += a
            if a < d:
                rejected_w[i] += 1.0
            drafted_total[i] += d
            accepted_total[i] += a
        if last_depth[i] >= 0 and last_depth[i] != d:
            depth_changes[i] += 1
        last_depth[i] = d
        joint[d * K1 + a] += 1
        ring_accepted[i, hptr] = a
        ring_drafted[i, hptr] = d
        if generated[i] >= output_len[i]:
            n_done += 1
    return a_sum, d_sum, out, n_done


@njit(cache=True, nogil=True, inline="always")
def _compact_columns(keep, M, fill):
    m = 0
    for i in range(keep.shape[0]):
        if keep[i]:
            if m != i:
                for j in range(M.shape[0]):
                    M[j, m] = M[j, i]
            m += 1
    for i in range(m, keep.shape[0]):   # the freed rows hold their fill values again
        for j in range(M.shape[0]):
            M[j, i] = fill[j]
    return m


@njit(cache=True, nogil=True)
def compact_flat(keep, Mi, fill_i, Mf, fill_f):
    """Mi, Mf [columns, capacity] (the RowTable's int and float columns): move the kept rows to the front,
    in order, in place, and reset the freed rows to their fill values; returns how many were kept."""
    _compact_columns(keep, Mf, fill_f)
    return _compact_columns(keep, Mi, fill_i)


@njit(cache=True, nogil=True)
def compact_rows(keep, A, fill):
    """A [capacity, width]: move the kept rows A[i] to the front, in order, in place, and reset the freed
    rows to `fill`; returns the count."""
    m = 0
    for i in range(keep.shape[0]):
        if keep[i]:
            if m != i:
                A[m] = A[i]
            m += 1
    A[m:keep.shape[0]] = fill
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


_TWO32 = 1.0 / 4294967296.0
_TWO53 = 1.0 / 9007199254740992.0


@njit(cache=True, nogil=True, inline="always")
def _keyed_draw(bu, bz, position, level, logit_normal, spread, calibration, decay, j):
    """(confidence, accepted) of the draft token for output `position` of the request whose stream bases
    are bu (stream 0: u) and bz (stream 1: z), proposed at draft position j of its step. See keyed_block."""
    step = (np.uint64(position) + np.uint64(1)) * _GOLD
    u = float(_mix(bu + step) >> _S11) * _TWO53
    if logit_normal:
        hz = _mix(bz + step)
        u1 = (float(hz >> np.uint64(32)) + 0.5) * _TWO32
        u2 = float(hz & np.uint64(0xFFFFFFFF)) * _TWO32
        z = np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)
        c = 1.0 / (1.0 + np.exp(-(level + spread * z)))
        p = c if calibration == 1.0 else c ** calibration
    else:
        c = level
        for _ in range(j):   # level x decay ** j, as repeated products
            c *= decay
        p = c
    return c, u < p


@njit(cache=True, nogil=True)
def keyed_block(key, ids, pos, k, level, logit_normal, spread, calibration, decay=1.0):
    """The acceptance block of the next k draft positions of every row: row i's draft j proposes output
    position pos[i] + j of request ids[i]. logit_normal False: confidence = level[i] x decay ** j, accepted
    iff u < that (iid, beta: decay 1; acceptance=decay: < 1). True: confidence = sigmoid(level[i] + spread * z), accepted iff
    u < confidence ** calibration. u: one 64-bit hash per (request, position) on stream 0; z: Box-Muller
    over the two 32-bit halves of one hash on stream 1."""
    n = ids.shape[0]
    conf = np.empty((n, k))
    acc = np.empty((n, k), np.bool_)
    for i in range(n):
        bu = _row_base(key, ids[i], 0)
        bz = _row_base(key, ids[i], 1)
        for j in range(k):
            conf[i, j], acc[i, j] = _keyed_draw(bu, bz, pos[i] + j, level[i], logit_normal, spread, calibration,
                                                decay, j)
    return conf, acc


@njit(cache=True, nogil=True)
def keyed_at(key, ids, pos, rows, offset, level, logit_normal, spread, calibration, decay, conf, acc):
    """Draft position `offset` of the rows `rows` only: fills conf[r, offset] and acc[r, offset] with the
    outcomes keyed_block draws there (output position pos[r] + offset of request ids[r])."""
    for t in range(rows.shape[0]):
        r = rows[t]
        conf[r, offset], acc[r, offset] = _keyed_draw(_row_base(key, ids[r], 0), _row_base(key, ids[r], 1),
                                                      pos[r] + offset, level[r], logit_normal, spread, calibration,
                                                      decay, offset)


@njit(cache=True, nogil=True)
def keyed_leading(key, ids, pos, drafted, level, logit_normal, spread, calibration, decay):
    """Per row: how many of its drafted[i] drafts the target accepts (the leading accepted run of the same
    outcomes keyed_block draws), drawing only up to the first rejection."""
    n = ids.shape[0]
    out = np.zeros(n, np.int64)
    for i in range(n):
        if drafted[i] <= 0:
            continue
        bu = _row_base(key, ids[i], 0)
        bz = _row_base(key, ids[i], 1)
        r = 0
        while r < drafted[i] and _keyed_draw(bu, bz, pos[i] + r, level[i], logit_normal, spread, calibration,
                                             decay, r)[1]:
            r += 1
        out[i] = r
    return out


def roofline_seconds(flops, tokens, ctx_tokens, weight_bytes, kv_bytes, inv_flops, inv_bytes, overhead, comm):
    """The roofline, the one place it is written: a forward over `tokens` new tokens attending to
    `ctx_tokens` cached ones reads every weight once and each token's KV once, and takes
    max(FLOPs / achieved FLOP/s, bytes / achieved bytes/s) plus a fixed overhead plus `comm` seconds per
    token (a tensor-parallel group's all-reduces; 0 on one GPU). All terms are per GPU. `cost.RooflineCost`
    calls this plain Python function; `roofline_positions` calls its compiled twin (`_roofline_seconds`)."""
    mem = weight_bytes + kv_bytes * (ctx_tokens + tokens)
    return max(flops * inv_flops, mem * inv_bytes) + overhead + comm * tokens


_roofline_seconds = njit(cache=True, nogil=True, inline="always")(roofline_seconds)


@njit(cache=True, nogil=True)
def roofline_many(flops, tokens, ctx_tokens, w, kv, inv_f, inv_b, oh, ca):
    """roofline_seconds of each forward of arrays of them (the same arithmetic)."""
    out = np.empty(flops.shape[0])
    for j in range(flops.shape[0]):
        out[j] = _roofline_seconds(flops[j], tokens[j], ctx_tokens[j], w, kv, inv_f, inv_b, oh, ca)
    return out


@njit(cache=True, nogil=True)
def roofline_forward(ctx, q, a, b, w, kv, inv_f, inv_b, oh, ca):
    """RooflineCost.target_forward/draft_forward over a ragged batch in one pass: (seconds, flops), the same
    arithmetic in the same order as the Python path (ragged_sums, then the roofline)."""
    t, pairs, c = ragged_sums(ctx, q)
    f = a * t + b * pairs
    return _roofline_seconds(f, t, c, w, kv, inv_f, inv_b, oh, ca), f


@njit(cache=True, nogil=True)
def roofline_verify(ctx, depths, a, b, w, kv, inv_f, inv_b, oh, ca):
    """roofline_forward's seconds with q = depths + 1 (CostModel.verify_time: each row its drafts and one token),
    the same integers and arithmetic without the query array."""
    t = 0
    c = 0
    qc = 0
    qq = 0
    for i in range(ctx.shape[0]):
        qi = depths[i] + 1
        t += qi
        c += ctx[i]
        qc += qi * ctx[i]
        qq += qi * (qi + 1)
    tf, pairs, cf = float(t), float(qc) + float(qq) * 0.5, float(c)
    return _roofline_seconds(a * tf + b * pairs, tf, cf, w, kv, inv_f, inv_b, oh, ca)


@njit(cache=True, nogil=True)
def roofline_uniform_verify(n, context, drafts, tt):
    """roofline_verify of n rows each at `context` with `drafts` drafts (tt: its eight terms as a float array): its
    integer sums as products, n x one row's (int64 products wrap as the sums do, modulo 2^64: the same integers),
    then its arithmetic."""
    q = drafts + 1
    t, c, qc, qq = n * q, n * context, n * (q * context), n * (q * (q + 1))
    tf, pairs, cf = float(t), float(qc) + float(qq) * 0.5, float(c)
    return _roofline_seconds(tt[0] * tf + tt[1] * pairs, tf, cf, tt[2], tt[3], tt[4], tt[5], tt[6], tt[7])


@njit(cache=True, nogil=True)
def roofline_padded_verify(ctx, depths, tt):
    """RooflineCost.padded_verify_time of n >= 1 rows: (whether any row pads, roofline_uniform_verify(n, top, k, tt)
    where one does, else 0.0), top the longest context and k the deepest row's drafts (at least 0); nothing pads
    where n is 1 or every row is at context top with k drafts. The minima and maxima in one pass."""
    n = ctx.shape[0]
    cmin, top, dmin, k = ctx[0], ctx[0], depths[0], depths[0]
    for i in range(1, n):
        c, d = ctx[i], depths[i]
        cmin, top = min(cmin, c), max(top, c)
        dmin, k = min(dmin, d), max(k, d)
    k = max(k, 0)
    if n == 1 or (cmin == top and dmin == k):
        return False, 0.0
    return True, roofline_uniform_verify(n, top, k, tt)


@njit(cache=True, nogil=True)
def roofline_positions(ctx, depths, a, b, w, kv, inv_f, inv_b, oh, ca):
    """RooflineCost.draft_positions in one pass: (seconds, flops) of the draft forwards of a step, at
    position p one token for each row with depths > p at context ctx + p (same arithmetic, same order;
    ca: communication seconds per token, 0 on one GPU)."""
    n_ge, c_ge = position_counts(ctx, depths)
    seconds = 0.0
    flops = 0.0
    for p in range(n_ge.shape[0]):
        n = float(n_ge[p])
        c = float(c_ge[p]) + p * n
        f = a * n + b * (c + n)
        seconds += _roofline_seconds(f, n, c, w, kv, inv_f, inv_b, oh, ca)
        flops += f
    return seconds, flops


@njit(cache=True, nogil=True)
def roofline_step_parts(ctx, depths, tt, dt):
    """(roofline_verify(ctx, depths, *tt), roofline_positions(ctx, depths, *dt)[0]) in one call: a step's predicted
    verify and draft seconds (RooflineCost.step_parts), each term list as a float array."""
    v = roofline_verify(ctx, depths, tt[0], tt[1], tt[2], tt[3], tt[4], tt[5], tt[6], tt[7])
    d = roofline_positions(ctx, depths, dt[0], dt[1], dt[2], dt[3], dt[4], dt[5], dt[6], dt[7])[0]
    return v, d


@njit(cache=True, nogil=True)
def roofline_flat_verify(n, c_all, c_less, dot_all, dot_less, tt):
    """CostModel.row_verify_times priced by the roofline after its sums and dot products (c_all, dot_all: of the n
    float contexts, and of n ones with them; c_less, dot_less: the same without the first row): per row count m (n,
    then n - 1 where n > 1), _sums' tokens float(m) and pairs dot + float(2 m) x 0.5, then target_forward's flops
    and the roofline (tt: its eight terms, a, b, w, kv, inv_f, inv_b, oh, ca)."""
    a, b, w, kv, inv_f, inv_b, oh, ca = tt[0], tt[1], tt[2], tt[3], tt[4], tt[5], tt[6], tt[7]
    t = float(n)
    full = _roofline_seconds(a * t + b * (dot_all + float(2 * n) * 0.5), t, c_all, w, kv, inv_f, inv_b, oh, ca)
    if n <= 1:
        return full, 0.0
    t = float(n - 1)
    less = _roofline_seconds(a * t + b * (dot_less + float(2 * (n - 1)) * 0.5), t, c_less, w, kv, inv_f, inv_b,
                             oh, ca)
    return full, less


@njit(cache=True, nogil=True)
def roofline_verify_table(ctx, totals, a, b, w, kv, inv_f, inv_b, oh, ca):
    """CostModel.verify_times priced by the roofline in one pass (n > 0 rows): per total x, q = x / n + 1 tokens a
    row, t = n q, flops a t + b (q c + n q (q + 1) 0.5), c the contexts' sum (the same arithmetic, element by
    element)."""
    csum = 0
    for i in range(ctx.shape[0]):
        csum += ctx[i]
    return roofline_verify_table_at(float(csum), float(ctx.shape[0]), totals, a, b, w, kv, inv_f, inv_b, oh, ca)


@njit(cache=True, nogil=True)
def roofline_verify_table_at(c, nf, totals, a, b, w, kv, inv_f, inv_b, oh, ca):
    """roofline_verify_table with the contexts' sum c and the row count nf given as floats (CostModel.verify_times
    of a float context vector: c = float(np.sum(ctx))), the same arithmetic."""
    out = np.empty(totals.shape[0])
    _verify_table_into(c, nf, totals, a, b, w, kv, inv_f, inv_b, oh, ca, out, 0)
    return out


@njit(cache=True, nogil=True, inline="always")
def _verify_table_into(c, nf, totals, a, b, w, kv, inv_f, inv_b, oh, ca, out, o):
    """roofline_verify_table_at's values into out[o:o + totals.size]."""
    for j in range(totals.shape[0]):
        q = totals[j] / nf + 1.0
        t = nf * q
        f = a * t + b * (q * c + nf * q * (q + 1.0) * 0.5)
        out[o + j] = _roofline_seconds(f, t, c, w, kv, inv_f, inv_b, oh, ca)


@njit(cache=True, nogil=True)
def roofline_draft_forward_table(qs, n, dots, csum, a, b, w, kv, inv_f, inv_b, oh, ca):
    """CostModel.draft_forward_times priced by the roofline after its dot products (dots[j]: np.vecdot of q = qs[j]
    a row with the contexts; csum: their float sum; n rows): t = float(q n), pairs = dots[j] + float(q (q + 1) n)
    x 0.5, flops a t + b pairs (the same integers and arithmetic)."""
    out = np.empty(qs.shape[0])
    for j in range(qs.shape[0]):
        q = qs[j]
        t = float(q * n)
        pairs = dots[j] + float(q * (q + 1) * n) * 0.5
        out[j] = _roofline_seconds(a * t + b * pairs, t, csum, w, kv, inv_f, inv_b, oh, ca)
    return out


@njit(cache=True, nogil=True)
def roofline_tree_levels(ctx, q, a, b, w, kv, inv_f, inv_b, oh, ca):
    """CostModel.draft_level_times priced by the roofline in one pass: per level l (column of q [n, D]), the
    draft forward over the rows with q[i, l] != 0, row i at context ctx[i] + l feeding q[i, l] tokens
    (ragged_sums' integers, then the roofline: the same arithmetic)."""
    n, D = q.shape
    out = np.empty(D)
    for lvl in range(D):
        t = c = qc = qq = 0
        for i in range(n):
            qi = q[i, lvl]
            if qi != 0:
                ci = ctx[i] + lvl
                t += qi
                c += ci
                qc += qi * ci
                qq += qi * (qi + 1)
        tf, pairs, cf = float(t), float(qc) + float(qq) * 0.5, float(c)
        out[lvl] = _roofline_seconds(a * tf + b * pairs, tf, cf, w, kv, inv_f, inv_b, oh, ca)
    return out


@njit(cache=True, nogil=True)
def roofline_tree_tables(csum, n, nodes, dots, tt, dt, out):
    """RooflineCost.tree_tables' two tables into out [nodes + 1 + dots.size + 1]: roofline_verify_table_at(csum,
    float(n), x n for x in 0..nodes, *tt), then 0.0 and roofline_draft_forward_table(1..Q, n, dots, csum, *dt)
    (dots[j]: np.vecdot of q = j + 1 a row with the contexts; csum: their float sum): the same arithmetic."""
    nf = float(n)
    for x in range(nodes + 1):
        q = (float(x) * nf) / nf + 1.0
        t = nf * q
        f = tt[0] * t + tt[1] * (q * csum + nf * q * (q + 1.0) * 0.5)
        out[x] = _roofline_seconds(f, t, csum, tt[2], tt[3], tt[4], tt[5], tt[6], tt[7])
    out[nodes + 1] = 0.0
    for j in range(dots.shape[0]):
        q = j + 1
        t = float(q * n)
        pairs = dots[j] + float(q * (q + 1) * n) * 0.5
        out[nodes + 2 + j] = _roofline_seconds(dt[0] * t + dt[1] * pairs, t, csum, dt[2], dt[3], dt[4], dt[5], dt[6],
                                               dt[7])
    return out


@njit(cache=True, nogil=True)
def roofline_draft_table(context, rows, a, b, w, kv, inv_f, inv_b, oh, ca):
    """CostModel.draft_times priced by the roofline in one pass: m rows at `context` each, c = m x context, flops
    a m + b (c + m); 0 seconds for m = 0."""
    out = np.empty(rows.shape[0])
    _draft_table_into(context, rows, a, b, w, kv, inv_f, inv_b, oh, ca, out, 0)
    return out


@njit(cache=True, nogil=True, inline="always")
def _draft_table_into(context, rows, a, b, w, kv, inv_f, inv_b, oh, ca, out, o):
    """roofline_draft_table's values into out[o:o + rows.size]."""
    for j in range(rows.shape[0]):
        m = rows[j]
        out[o + j] = 0.0
        if m != 0.0:
            c = m * context
            out[o + j] = _roofline_seconds(a * m + b * (c + m), m, c, w, kv, inv_f, inv_b, oh, ca)


@njit(cache=True, nogil=True)
def roofline_step_tables(ctx, totals, context, rows, tt, dt, out):
    """RooflineCost.step_tables into out [totals.size + rows.size]: roofline_verify_table(ctx, totals, *tt), then
    roofline_draft_table(context, rows, *dt) (the same arithmetic)."""
    csum = 0
    for i in range(ctx.shape[0]):
        csum += ctx[i]
    _verify_table_into(float(csum), float(ctx.shape[0]), totals, tt[0], tt[1], tt[2], tt[3], tt[4], tt[5], tt[6],
                       tt[7], out, 0)
    _draft_table_into(context, rows, dt[0], dt[1], dt[2], dt[3], dt[4], dt[5], dt[6], dt[7], out, totals.shape[0])


@njit(cache=True, nogil=True, inline="always")
def _grid_axis(grid, x, extrapolate):
    """(lower index, weight of the upper point) of x on a sorted axis; clamped to [0, 1] unless extrapolate."""
    if grid.shape[0] == 1:
        return 0, 0.0
    i = np.searchsorted(grid, x, side="right") - 1
    i = min(max(i, 0), grid.shape[0] - 2)
    w = (x - grid[i]) / (grid[i + 1] - grid[i])
    if extrapolate:
        return i, w
    return i, min(max(w, 0.0), 1.0)


@njit(cache=True, nogil=True)
def table_lookup(lb, lq, C, T, batch, query, context, out):
    """The profile table's time at each (batch, query, context): multilinear in (log2 batch, log2 query,
    context) inside the grid (lb, lq: log2 of the batch and query points), proportional to the tokens beyond
    its largest batch x query, linear beyond its largest context; at least half the table's smallest time.
    (The one kernel whose log2 and power can differ from numpy's in the last bit: they are LLVM's.)"""
    floor = T.min() * 0.5
    for k in range(out.shape[0]):
        b2 = np.log2(max(batch[k], 1.0))
        q2 = np.log2(max(query[k], 1.0))
        scale = 1.0
        if b2 > lb[-1]:
            scale *= 2.0 ** (b2 - lb[-1])
            b2 = lb[-1]
        if q2 > lq[-1]:
            scale *= 2.0 ** (q2 - lq[-1])
            q2 = lq[-1]
        ib, wb = _grid_axis(lb, b2, False)
        iq, wq = _grid_axis(lq, q2, False)
        ic, wc = _grid_axis(C, context[k], context[k] > C[-1])
        total = 0.0
        for db in range(2):
            fb = wb if db else 1.0 - wb
            if fb == 0.0 or ib + db >= lb.shape[0]:
                continue
            for dq in range(2):
                fq = wq if dq else 1.0 - wq
                if fq == 0.0 or iq + dq >= lq.shape[0]:
                    continue
                for dc in range(2):
                    fc = wc if dc else 1.0 - wc
                    if fc == 0.0 or ic + dc >= C.shape[0]:
                        continue
                    total += fb * fq * fc * T[ib + db, iq + dq, ic + dc]
        out[k] = max(total, floor) * scale
