"""Depth search: the depths that maximise expected emitted tokens per second of step time, one depth for the batch
(`uniform_depth`), position by position (`plan_by_position`) or while drafting (`keep_by_margin`), and the
engine's caps on a plan."""
from __future__ import annotations

import numpy as np

from . import kernels
from .acceptance import expected_tokens
from .cost import StepCost
from .drain import expected_maxes, finish_maxes


def plan_by_position(S: np.ndarray, costs, G0: float = 0.0, tie: np.ndarray | None = None,
                     nested: bool = False, base: float | None = None):
    """The goodput search shared by `goodput` and `oracle_expected`: the depths maximising expected emitted
    tokens / step time. S[i, p] = probability that row i's draft at position p (0-based) is emitted (0 where
    worthless); costs: StepCost-like tables. Position by position, the best-ranked m_p rows (m_p <= m_(p-1),
    among the rows drafting at p - 1) that maximise value - G x (draft forward over m_p rows + verify growth)
    draft there, for the goodput G found by Dinkelbach iteration from G0 (G <- E/T of the plan made with G).
    Rows are ranked by S, ties toward larger `tie` (e.g. remaining tokens: no row falls behind the batch).
    Exact when every column ranks the rows alike and values fall with depth (goodput's a_i^p); `nested=True`
    handles rankings that differ by position (a greedy, not exact there). `base`: the value of the step
    without drafts (default: one token per row). Returns (depths, G)."""
    n, K = S.shape
    key = np.zeros(n) if tie is None else -np.asarray(tie, float)
    if key.shape != (n,):
        raise ValueError(f"plan_by_position: tie has shape {key.shape}, S has {n} rows (one tie value per row)")
    base = float(n) if base is None else base
    g_none = base / costs.verify[0]
    if nested and n > _SMALL and COMPILED and _compiled_tables(S, costs, n, K) and not kernels._any_nan(S, key):
        order = np.empty((n, K), np.int64)   # ranked as the compiled searches reach its columns
        ranked = np.zeros(1, np.int64)
        args = (costs.verify, costs.draft, _NO_PAD if costs.pad is None else costs.pad, costs.pad is not None, n, base)

        def compiled(G):
            ms, m, e, t = kernels.nested_search(S, key, order, ranked, K, G, *args)
            return ms[:m], e, t
        ms, best_g = _dinkelbach(compiled, g_none, G0)
        return kernels.nested_depths(order, np.asarray(ms, np.int64), n), best_g
    order = np.lexsort((np.broadcast_to(key[:, None], S.shape), -S), axis=0)   # rows ranked per position
    column = _columns(S, order, nested)
    search = _by_position_small if n <= _SMALL else _by_position
    ms, best_g = _dinkelbach(lambda G: search(column, K, G, costs, n, base), g_none, G0)
    return _depths(ms, column, order, nested or n <= _SMALL), best_g


def _dinkelbach(search, g_none: float, G0: float):
    """Dinkelbach's iteration over `search(G)` -> (a plan's m per position, its value, its seconds): at most 5
    plans, each made at the goodput of the one before, from max(g_none, G0) (no plan: once more at g_none); the
    best plan and its goodput (none and g_none where no plan beats drafting nothing)."""
    G = max(g_none, G0)
    best_g, best = g_none, []
    for _ in range(5):
        cand, e, t = search(G)
        found = len(cand) > 0
        better, g, G, stop = kernels.dinkelbach_next(found, float(e) if found else 0.0, float(t) if found else 1.0,
                                                     float(G), float(g_none), float(best_g))
        if better:
            best_g, best = g, cand
        if stop:
            break
    return best, best_g


def _depths(ms: list, column, order: np.ndarray, by_column: bool) -> np.ndarray:
    """The depths of a plan that drafts the best m_p rows at each position p (`ms`), ranked by `order` (or by
    the nested columns' own choice, `by_column`)."""
    n = order.shape[0]
    if COMPILED and isinstance(column, _NestedColumns):   # compiled, the same rows
        return kernels.nested_depths(order, np.array(ms, np.int64), n)
    depths = np.zeros(n, np.int64)
    rows = np.arange(n)
    for p, m in enumerate(ms):
        rows = column.rows(p, len(rows), m) if by_column else order[:m, p]
        depths[rows] += 1
    return depths


def _columns(S: np.ndarray, order: np.ndarray, nested: bool):
    """The search's column p (cumulative values of the best rows at position p): Python floats for small batches
    (`_SmallColumns`), nested row sets (`_NestedColumns`), or one cumulative table."""
    n, K = S.shape
    if n <= _SMALL:
        return _SmallColumns(S, order, nested)
    if nested:
        return _NestedColumns(S, order)
    C = np.zeros((n + 1, K))
    np.cumsum(np.take_along_axis(S, order, 0), axis=0, out=C[1:])
    return _Table(C)


class _Table:
    """The plain column p: C[:prev + 1, p], C the cumulative values of the best rows per position (searched by the
    compiled `kernels.by_position`)."""

    def __init__(self, C):
        self.C = C

    def __call__(self, p, prev):
        return self.C[:prev + 1, p]


_NO_PAD = np.zeros(0)
_NO_ENDS = np.zeros(0, np.int64)
COMPILED = True   # the compiled loops (kit/kernels.py); False: their numpy form, which they equal (tests compare)
_SMALL = 16   # batches up to this many rows search in plain floats (_SmallColumns)


class _SmallColumns:
    """Both kinds of column (the plain one and _NestedColumns) in Python floats, for small batches, where
    numpy's per-call cost is most of the search: the same sums in the same order, so the same plan."""

    def __init__(self, S, order, nested):
        self.S, self.order, self.nested = S.tolist(), order.T.tolist(), nested
        self.n = len(self.S)
        self._chosen = None
        if not nested:
            self.C = [self._cumulative(p, o) for p, o in enumerate(self.order)]

    def _cumulative(self, p, rows):
        c, acc, S = [0.0], 0.0, self.S
        for i in rows:
            acc += S[i][p]
            c.append(acc)
        return c

    def __call__(self, p, prev):
        if not self.nested:
            return self.C[p]
        if p == 0:
            self._chosen = [True] * self.n
        chosen = self._chosen
        self._last = [i for i in self.order[p] if chosen[i]][:prev]
        return self._cumulative(p, self._last)

    def choose(self, m):
        self._chosen = [False] * self.n
        for i in self._last[:m]:
            self._chosen[i] = True

    def rows(self, p, prev, m):
        if not self.nested:
            return self.order[p][:m]
        self(p, prev)
        self.choose(m)
        return self._last[:m]


class _NestedColumns:
    """Column p of the search when rankings differ by position: cumulative values of the rows that drafted
    at p - 1 (the best m of the previous call), in column p's ranking."""

    def __init__(self, S, order):
        self.S, self.order = S, order
        self._chosen = None

    def _cand(self, p, prev):
        o = self.order[:, p]
        if p == 0:
            self._chosen = np.ones(o.size, bool)
        return o[self._chosen[o]][:prev]

    def __call__(self, p, prev):
        cand = self._cand(p, prev)
        c = np.zeros(cand.size + 1)
        np.cumsum(self.S[cand, p], out=c[1:])
        self._last = cand
        return c

    def choose(self, m):
        chosen = np.zeros_like(self._chosen)
        chosen[self._last[:m]] = True
        self._chosen = chosen

    def rows(self, p, prev, m):
        self(p, prev)
        self.choose(m)
        return self._last[:m]


def _by_position(column, K, G, costs, n, base):
    """Position by position, the number of rows m_p that maximises value - G x (draft forward + verify
    growth); stops at the first position where none pays. Returns ([m_p], expected value, seconds)."""
    ms, x, e, tdraft, prev = [], 0, base, 0.0, n
    ver, dr, pad = costs.verify, costs.draft, costs.pad
    nested = isinstance(column, _NestedColumns)
    if COMPILED and _compiled_tables(column.S if nested else column.C, costs, n, K):
        args = (K, float(G), ver, dr, _NO_PAD if pad is None else pad, pad is not None, n, float(base))
        if nested:
            got, m, e, t = kernels.nested_by_position(column.S, column.order, *args)
        else:
            got, m, e, t = kernels.by_position(column.C, *args)
        return got[:m].tolist(), (np.float64(e) if m else base), np.float64(t)   # the same loop, compiled
    for p in range(K):
        c = column(p, prev)
        dp = dr[:prev + 1]
        if pad is not None:   # a padded verify: opening position p (any m > 0 rows) adds pad[p]
            dp = dp.copy()
            dp[1:] += pad[p]
        gain = c - G * (dp + ver[x:x + prev + 1] - ver[x])
        m = int(np.argmax(gain))
        if m == 0 or gain[m] <= 0:
            break
        if nested:
            column.choose(m)
        ms.append(m)
        e += c[m]
        tdraft += dp[m]
        x += m
        prev = m
    return ms, e, ver[x] + tdraft


def _compiled_tables(S, costs, n: int, K: int) -> bool:
    """Whether `_by_position`'s compiled loop applies: tables long enough and float64 values throughout."""
    ver, dr, pad = costs.verify, costs.draft, costs.pad
    return (ver.size > n * K and dr.size > n and (pad is None or pad.size >= K)
            and all(a is None or a.dtype == np.float64 for a in (S, ver, dr, pad)))


def _by_position_small(column, K, G, costs, n, base):
    """_by_position's loop in Python floats (_SmallColumns, batches up to _SMALL rows, batch 1 included): the
    same arithmetic, element by element."""
    ms, x, e, tdraft, prev = [], 0, base, 0.0, n
    v, d = costs.verify.tolist(), costs.draft.tolist()
    pad = costs.pad.tolist() if costs.pad is not None else None
    for p in range(K):
        c = column(p, prev)
        vx, pp = v[x], (pad[p] if pad is not None else None)
        m, best, dm = 0, None, d[0]
        for j in range(prev + 1):
            dj = d[j] + pp if pp is not None and j else d[j]
            g = c[j] - G * (dj + v[x + j] - vx)
            if best is None or g > best:   # the first of equal maxima, as np.argmax
                m, best, dm = j, g, dj
        if m == 0 or best <= 0:
            break
        if column.nested:
            column.choose(m)
        ms.append(m)
        e += c[m]
        tdraft += dm
        x += m
        prev = m
    return ms, e, v[x] + tdraft


def uniform_depth(acceptance: np.ndarray, costs, kmax: int, remaining: np.ndarray | None = None,
                  rates: np.ndarray | None = None, factors: np.ndarray | None = None,
                  trials: float | None = None, ends: np.ndarray | None = None,
                  spread: bool = False) -> tuple[int, float]:
    """The one depth k in 0..kmax for every row that maximises expected emitted tokens / step time:
    E_k = sum_i (1 - a_i^(k+1)) / (1 - a_i) (Leviathan et al.), T_k = verify[n k] + k x draft[n] (StepCost-like
    tables): no position is drafted whose expected gain at the acceptance estimate is below its cost.
    `remaining` (each row's tokens left; given when no request will join again): the run ends with its slowest
    row, so k minimises the time to finish them all, max_i remaining_i / e_i(k) steps of T_k, e_i(k) the batch's
    mean tokens a step times row i's share at the per-row `rates` (e.g. `shrunk_rates`; default `acceptance`).
    `spread` (with `remaining`): the run takes the expected maximum of the rows' about normal finishing steps
    (`expected_max`; variance r_i v_i(k) / e_i(k)^3), not the slowest row's mean.
    `factors` (per draft position, `PositionFactors.factor`): position p is accepted with a_i x f_p. `trials` (the
    drafted tokens an estimate rests on): price by its posterior predictive (`expected_tokens`). `ends` (per row,
    e.g. `draft_caps`): row i drafts min(k, ends_i), and the step pays for those drafts and for as many draft
    forwards (and padded positions) as the deepest row gets. Returns (k, predicted goodput)."""
    n = len(acceptance)
    if ends is not None and np.shape(ends) != (n,):
        raise ValueError(f"uniform_depth: ends has shape {np.shape(ends)}, acceptance has {n} rows (one end per row)")
    best = _uniform_compiled(acceptance, costs, kmax, remaining, rates, factors, trials, ends, spread) \
        if COMPILED else None
    if best is not None:
        return best
    ks = np.arange(kmax + 1)
    got = None if ends is None else np.minimum(ks[:, None], np.asarray(ends, np.int64)[None, :])   # [k, row]
    e = _row_tokens(np.asarray(acceptance, float), ks, factors, trials, got)   # [k, row] expected tokens per step
    x, deep = (n * ks, ks) if got is None else (got.sum(axis=1), got.max(axis=1, initial=0))   # drafts at depth k
    T = _step_seconds(costs, x, deep, n)
    if remaining is None:
        g = e.sum(axis=1) / T
    else:
        if rates is not None:
            f = expected_tokens(rates, ks, factors)
            f = f if got is None else np.take_along_axis(f, got, axis=0)
            e = e.mean(axis=1, keepdims=True) * f / f.mean(axis=1, keepdims=True)
        rem = np.asarray(remaining, float)
        g = float(rem.sum()) / (_steps_to_finish(e, rem, spread and got is None) * T)
    k = int(np.argmax(g))
    return k, float(g[k])


def _uniform_compiled(a, costs, kmax, remaining, rates, factors, trials, ends, spread):
    """uniform_depth's answer from the compiled loops where every row has the level (`_level_column`) and the cost
    tables are float64: not draining (`kernels.uniform_best`), or draining at per-row `rates` without `ends`
    (`kernels.scaled_tokens`, `_steps_to_finish`, `kernels.ratio_best`); None elsewhere."""
    n = len(a)
    col = _level_column(a, kmax, factors, trials)
    if col is None or not _float_tables(costs, n) or (remaining is not None and (rates is None or ends is not None)):
        return None
    pad = _NO_PAD if costs.pad is None else np.asarray(costs.pad)
    if remaining is None:
        k, g = kernels.uniform_best(col, _NO_ENDS if ends is None else np.asarray(ends, np.int64), ends is not None,
                                    n, costs.verify, float(costs.draft[n]), pad)
        return k, float(g)
    ks = np.arange(kmax + 1)
    f = expected_tokens(rates, ks, factors)
    if f.dtype != np.float64 or not f.flags.c_contiguous:   # (np.mean's order is np.sum's on rows in memory order)
        return None
    rem = np.asarray(remaining, float)
    S = _steps_to_finish(kernels.scaled_tokens(col, f), rem, spread)
    T = kernels.step_seconds(n * ks, ks, costs.verify, float(costs.draft[n]), pad)
    k, g = kernels.ratio_best(float(rem.sum()), S, T)
    return k, float(g)


def _level_column(a, kmax: int, factors, trials) -> np.ndarray | None:
    """Where every row has the same estimate and `_row_tokens` computes one row: that row (expected tokens at
    depths 0..kmax), else None."""
    a = np.asarray(a, float)
    if a.size < 2 or (factors is None and trials is None):
        return None
    f = _NO_PAD if factors is None else np.asarray(factors)
    if f.dtype == np.float64 and f.size >= kmax:   # compiled (`kernels.level_column`: the same operations)
        col, same = kernels.level_column(a, kmax, f, factors is not None, 0.0 if trials is None else float(trials),
                                         trials is not None)
        return col if same else None
    return _one_row(float(a[0]), kmax, factors, trials) if bool((a == a[0]).all()) else None


def _float_tables(costs, n: int) -> bool:
    """Whether the compiled loops read these cost tables (float64 verify and draft, draft has row n)."""
    pad = costs.pad
    return (costs.verify.dtype == costs.draft.dtype == np.float64 and costs.draft.size > n and costs.verify.size > 0
            and (pad is None or np.asarray(pad).dtype == np.float64))


def _row_tokens(a: np.ndarray, ks: np.ndarray, factors, trials, got: np.ndarray | None) -> np.ndarray:
    """expected_tokens(a, ks, factors, trials) [k, row], read at depth got[k, i] for row i where `got` is given.
    Per position (factors or trials) expected_tokens computes each row on its own, so where every row has the same
    estimate (a policy's level) one row is computed and repeated: the same numbers."""
    if a.size > 1 and (factors is not None or trials is not None) and bool((a == a[0]).all()):
        col = _one_row(float(a[0]), int(ks[-1]), factors, trials)[ks]
        return col[got] if got is not None else np.repeat(col[:, None], a.size, axis=1)
    e = expected_tokens(a, ks, factors, trials)
    return e if got is None else np.take_along_axis(e, got, axis=0)


def _one_row(a: float, k: int, factors, trials) -> np.ndarray:
    """expected_tokens([a], arange(k + 1), factors, trials)[:, 0] in floats: the same operations in the same order
    (the clip, each position's survival, its product and its sum running down the positions)."""
    a = 0.999 if a > 0.999 else (a if a > 0.0 else 0.0)
    f = None if factors is None else np.asarray(factors, float)[:k].tolist()
    out, surv, total = [1.0], 1.0, 0.0
    for p in range(k):
        step = a if trials is None else (a * trials + float(p)) / (trials + float(p))
        if f is not None:
            step = step * f[p]
        step = min(step, 0.999)
        surv = step if p == 0 else surv * step
        total = surv if p == 0 else total + surv
        out.append(1.0 + total)
    return np.array(out)


def _step_seconds(costs, x: np.ndarray, deep: np.ndarray, n: int) -> np.ndarray:
    """Per depth, a step's seconds: the verify of x drafts, `deep` draft forwards of n rows, and what opening
    positions 0..deep-1 adds where the tables have `pad` (PolicyTime, a padded verify)."""
    T = costs.verify[np.minimum(x, costs.verify.size - 1)] + deep * costs.draft[n]
    pad = costs.pad
    if pad is not None and len(pad):
        opened = np.concatenate([[0.0], np.cumsum(pad)])
        T = T + opened[np.minimum(deep, opened.size - 1)]
    return T


def _steps_to_finish(e: np.ndarray, rem: np.ndarray, spread: bool) -> np.ndarray:
    """Per depth k, the steps until the last row finishes: the slowest row's mean, max_i rem_i / e[k, i], or
    (`spread`, more than one row) the expected maximum of the rows' about normal finishing steps."""
    if not spread or rem.size == 1:   # (one row: its mean, exactly)
        return (rem[None, :] / e).max(axis=1)
    if COMPILED and e.dtype == rem.dtype == np.float64 and e.ndim == 2 and rem.shape == (e.shape[1],):
        return finish_maxes(e, rem)   # (kernels.finish_moments, then expected_maxes' compiled form)
    surv = np.diff(e, axis=0)   # [p, row]: P(drafts 0..p survive)
    L2 = np.concatenate([np.zeros((1, e.shape[1])),
                         np.cumsum((2.0 * np.arange(e.shape[0] - 1) + 1.0)[:, None] * surv, axis=0)])
    sd = np.sqrt(rem[None, :] * np.maximum(L2 - (e - 1.0) ** 2, 0.0) / e ** 3)
    return expected_maxes(rem[None, :] / e, sd)


def best_prefix(n_rows: int, rows: np.ndarray, pos: np.ndarray, value: np.ndarray, costs: StepCost,
                base_value: float):
    """Goodput of every prefix of a ranked slot list; returns (best prefix length, its goodput).

    Slot s drafts row rows[s] at position pos[s] (0-based) and is worth value[s] expected tokens. Prefix M
    predicts (base_value + sum of its values) / (verify[M] + sum over positions p of draft[m_p]), m_p the
    prefix's slots at position p: each slot adds one verify token and one row to its position's forward.
    """
    L = value.size
    if L == 0:
        return 0, base_value / costs.verify[0]
    # occurrence index of each slot within its position, in ranked order
    by_pos = np.argsort(pos, kind="stable")
    sp = pos[by_pos]
    starts = np.searchsorted(sp, sp, side="left")
    k = np.empty(L, np.int64)
    k[by_pos] = np.arange(L) - starts
    d_draft = costs.draft[k + 1] - costs.draft[k]
    t = costs.verify[:L + 1] + np.concatenate([[0.0], np.cumsum(d_draft)])
    e = base_value + np.concatenate([[0.0], np.cumsum(value)])
    g = e / t
    m = int(np.argmax(g))
    return m, float(g[m])


def keep_by_margin(view, position: int, idx: np.ndarray, v, costs, G: float, ratio=None) -> np.ndarray:
    """keep_drafting's rule for `goodput` and `oracle_causal`: rows idx may draft position + 1, the next slot of
    each worth v (expected emitted tokens: a float where idx holds one row, else an array); the best-valued m
    of them draft it, m maximising the value minus G x (the draft forward over m rows + the verify's growth by
    m tokens, + a position's padding where the verify pads), and none where no m gains. Ties toward more tokens
    left. Returns the keep mask over the batch.
    `ratio`: a list [E, T], the step's expected tokens and seconds so far (G = E / T): then the m kept maximise
    (E + value) / (T + seconds) instead, the step's goodput with the positions added (the Dinkelbach ratio the
    plan maximises), and E, T are updated in place with what is kept."""
    keep = np.zeros(view.batch_size, bool)
    x = int(view.drafted.sum())
    last = costs.verify.size - 1
    pad = costs.pad
    if idx.size == 1:   # the same arithmetic, in floats
        dt = float(costs.draft[1]) + float(costs.verify[min(x + 1, last)]) - float(costs.verify[min(x, last)])
        if pad is not None and pad.size:
            dt = dt + float(pad[min(position + 1, pad.size - 1)])
        return _keep_one(keep, int(idx[0]), v, dt, G, ratio)
    padp = float(pad[min(position + 1, pad.size - 1)]) if pad is not None and pad.size else None
    if np.shape(v) != idx.shape:   # (the compiled loop would read past the values' end)
        raise ValueError(f"keep_by_margin: {np.size(v)} values for {idx.size} rows (one value per row of idx)")
    rem = view.remaining
    if (COMPILED and v.dtype == costs.draft.dtype == costs.verify.dtype == np.float64 and rem.dtype == np.int64
            and costs.draft.size > idx.size):
        return _keep_ranked(keep, rem, idx, v, costs, x, padp, G, ratio)   # the same, compiled
    order = np.lexsort((-rem[idx], -np.round(v, 6)))   # ties: more tokens left first
    best, gain, gain_v, dt = _best_count(v[order], costs, x, last, padp, G, ratio)
    if gain > 0:
        keep[idx[order[:best + 1]]] = True
        if ratio is not None:
            ratio[0] += float(gain_v)
            ratio[1] += float(dt)
    return keep


def _keep_ranked(keep, remaining, idx, v, costs, x: int, padp, G: float, ratio) -> np.ndarray:
    """keep_by_margin's ranking and count for two or more rows, compiled (`kernels.keep_margin`: np.lexsort's
    order, `kernels.margin_gains`' count), for float64 values and tables."""
    E, T = (0.0, 1.0) if ratio is None else ratio
    got, gain_v, dt = kernels.keep_margin(keep, idx, v, remaining, x, costs.draft, costs.verify,
                                          0.0 if padp is None else padp, padp is not None, float(G), float(E), float(T),
                                          ratio is not None)
    if got and ratio is not None:
        ratio[0] += float(gain_v)
        ratio[1] += float(dt)
    return keep


def _best_count(vs: np.ndarray, costs, x: int, last: int, padp, G: float, ratio):
    """keep_by_margin's choice over the ranked values vs: the m (best + 1) maximising the gain; returns (best, its
    gain, its value, its seconds). Compiled (`kernels.margin_gains`, the same operations) for float64 tables."""
    draft, verify = costs.draft, costs.verify
    if COMPILED and vs.dtype == draft.dtype == verify.dtype == np.float64 and draft.size > vs.size:
        E, T = (0.0, 1.0) if ratio is None else ratio
        return kernels.margin_gains(vs, draft, verify, x, last, 0.0 if padp is None else padp, padp is not None,
                                    float(G), float(E), float(T), ratio is not None)
    gain_v = np.cumsum(vs)
    mm = np.arange(1, vs.size + 1)
    dt = draft[mm] + verify[np.minimum(x + mm, last)] - verify[min(x, last)]
    if padp is not None:   # a padded verify grows by a position's worth for all rows
        dt = dt + padp
    if ratio is None:
        gain = gain_v - G * dt
    else:
        E, T = ratio
        gain = (E + gain_v) / (T + dt) - E / T
    best = int(np.argmax(gain))
    return best, gain[best], gain_v[best], dt[best]


def _keep_one(keep: np.ndarray, i: int, v: float, dt: float, G: float, ratio) -> np.ndarray:
    """keep_by_margin for one row i (floats): whether its value v beats G x dt, or raises E / T where `ratio`."""
    if ratio is not None:
        G = ratio[0] / ratio[1]
    keep[i] = ok = v - G * dt > 0
    if ok and ratio is not None:
        ratio[0] += v
        ratio[1] += dt
    return keep


def draft_caps(view, kmax: int) -> np.ndarray:
    """Per row, the most drafts worth making: its remaining tokens - 1 (a step emits at most what the request has
    left, so a draft past its last token is never emitted), in 0..kmax."""
    rem = view.remaining
    if COMPILED and rem.dtype == np.int64 and rem.ndim == 1:
        out = np.empty(rem.size, np.int64)
        kernels.caps(rem, int(kmax), out)   # the same integers, one loop
        return out
    return np.minimum(np.maximum(rem - 1, 0), kmax)   # np.clip's values (integers), a third of its time


def fit_token_cap(depths: np.ndarray, view) -> np.ndarray:
    """Clip depths at the largest c with batch + sum(min(depths, c)) <= view.max_num_batched_tokens (the
    engine's hard cap), so that a policy's plan is valid at any batch size."""
    room = view.max_num_batched_tokens - view.batch_size
    if int(depths.sum()) <= room:
        return depths
    if room <= 0:
        return np.zeros_like(depths)
    srt = np.sort(depths)
    # total(c) = sum(min(d, c)) is nondecreasing in c: largest c with total(c) <= room
    lo, hi = 0, int(srt[-1])
    while lo < hi:
        c = (lo + hi + 1) // 2
        if int(np.minimum(srt, c).sum()) <= room:
            lo = c
        else:
            hi = c - 1
    return np.minimum(depths, lo)
