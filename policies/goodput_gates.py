"""goodput's search and the gates on its plan: catch-up, the drain's makespan, the probe; and the extension while
drafting."""
from __future__ import annotations

import math
from sys import getrefcount
from typing import NamedTuple

import numpy as np

from .kit import kernels, search
from .kit.kernels import _F64, _I64
from .kit import (best_prefix, catch_up_rows, expected_max, keep_by_margin, may_probe, plan_by_position,
                  plan_pays_catch_up, thin_evidence)

MAY_END = 0.1   # the makespan gate judges a batch only where every row's chance to end the run is this or more


def plan_positions(S, costs, G0, remaining, w):
    """`kit.plan_by_position` on slot survivals S, weighted by `w` where given; ties toward the rows with more
    tokens left, so no row falls behind the batch. Returns (depths, goodput)."""
    if w is None:
        return plan_by_position(S, costs, G0, tie=remaining)
    if search.COMPILED and _weighted_compiled(S, costs, remaining, w):   # the same search, one compiled call
        depths, G, ok = kernels.weighted_plan(S, w, remaining, float(G0), costs.verify, costs.draft,
                                              search._NO_PAD if costs.pad is None else costs.pad, costs.pad is not None)
        if ok:
            return depths, G
    return plan_by_position(S * w[:, None], costs, G0, tie=remaining, nested=True, base=float(w.sum()))


class Extension(NamedTuple):
    """What `plan_extend`'s one call reads of the search's plan (`planned`) and of its extension (`depths`)."""
    planned: np.ndarray   # the plan's depths
    late: bool            # a row the plan drafts lags (view.draft_lag > 2)
    drafts: bool          # the plan drafts
    value: float          # the plan's value (`plan_value`)
    depths: np.ndarray    # extended(planned, extend, rowcap)
    late_out: bool        # a row the extension drafts lags
    drafts_out: bool      # the extension drafts
    full: bool            # every row's plan drafts (planned.all())


def plan_extend(S, costs, G0, remaining, w, lag, extend: int, rowcap, kept=None):
    """`plan_positions` (w given) and what the gates and `ratio_extended` read of the plan, in one compiled call
    (`kernels.plan_extend`: the same operations). Returns (depths, G, `Extension`), or (depths, G, None) from
    `plan_positions` where the compiled call does not run. `kept`: an object whose `two` keeps the depths' buffers
    (`_depths_buffer`). One row and no weights: weighted by 1, the same plan (`_ONE`)."""
    n, K = S.shape
    ver, dr, pad = costs.verify, costs.draft, costs.pad
    f, i, w1 = _F64, _I64, _ONE if w is None and n == 1 else w
    if not (search.COMPILED and w1 is not None and w1.shape == remaining.shape == lag.shape == rowcap.shape == (n,)
            and ver.size > n * K and dr.size > n and (pad is None or pad.size >= K)
            and ((S.dtype is f and w1.dtype is f and ver.dtype is f and dr.dtype is f and remaining.dtype is i
                  and lag.dtype is i and rowcap.dtype is i and (pad is None or pad.dtype is f))   # (native: `_typed`)
                 or _typed((S, w1, ver, dr) if pad is None else (S, w1, ver, dr, pad), (remaining, lag, rowcap)))):
        return (*plan_positions(S, costs, G0, remaining, w), None)   # (`_weighted_compiled`'s conditions)
    two = np.empty((2, n), np.int64) if kept is None else _depths_buffer(kept, n)   # (the plan's, the extension's)
    G, ok, late, any_, E, late_out, any_out, full = kernels.plan_extend(
        S, w1, remaining, float(G0), ver, dr, search._NO_PAD if pad is None else pad, pad is not None, lag,
        int(extend), rowcap, two)
    if not ok:
        return (*plan_positions(S, costs, G0, remaining, w), None)
    planned = two[0]
    return planned, G, Extension(planned, late, any_, E, two[1], late_out, any_out, full)


# one row's weight where it has none (read, never written): `plan_positions`' plan of one row (`plan_by_position`
# in `_SmallColumns`' floats, nested or not: one row's column is alike) and its value are the same weighted by 1.0
_ONE = np.ones(1)


def _depths_buffer(kept, n: int) -> np.ndarray:
    """A [2, n] int64 buffer for `plan_extend`'s depths: of the two `kept.two` holds (the last call's, the one
    before), the one before where nobody else holds it or a view of it (the engine and the view hold the last
    step's depths), else a new one; it becomes the last."""
    h = kept.two
    if h is None:
        h = kept.two = [None, None]
    b = h[1]
    if b is None or getrefcount(b) > 3 or b.shape != (2, n):   # (3: the list's, this name's and the call's)
        b = np.empty((2, n), np.int64)
    h[0], h[1] = b, h[0]
    return b


def flags(depths, ext: Extension | None) -> tuple[bool, bool]:
    """(whether `depths` draft, whether a row they draft may lag): the search's call's answers where `depths` is its
    plan or its extension (`ext`), else `drafts(depths)` and True (the caller's gate tests the lag)."""
    if ext is not None:
        if depths is ext.planned:
            return ext.drafts, ext.late
        if depths is ext.depths:
            return ext.drafts_out, ext.late_out
    return drafts(depths), True


def _typed(floats: tuple, ints: tuple) -> bool:
    """Whether the arrays `floats` are float64 and `ints` int64 (the native dtypes' objects compared first)."""
    for a in floats:
        if a.dtype is not _F64 and a.dtype != _F64:
            return False
    for a in ints:
        if a.dtype is not _I64 and a.dtype != _I64:
            return False
    return True


def _weighted_compiled(S, costs, remaining, w) -> bool:
    """Whether `kernels.weighted_plan` runs `plan_positions`' search: float64 values and tables long enough
    (`search._compiled_tables`), one weight and one int64 tie per row. (A batch of up to `search._SMALL` rows gets
    the same plan from `search._SmallColumns`' floats: the same sums in the same order.)"""
    n, K = S.shape
    ver, dr, pad = costs.verify, costs.draft, costs.pad
    return (w.shape == remaining.shape == (n,) and ver.size > n * K and dr.size > n
            and S.dtype == w.dtype == ver.dtype == dr.dtype == np.float64 and remaining.dtype == np.int64
            and (pad is None or (pad.size >= K and pad.dtype == np.float64)))


def plan_global(S, costs, w):
    """ranking=global (vLLM DSpark / SmartSpec as described): every slot ranked by survival, the best prefix by
    goodput."""
    base = float(S.shape[0]) if w is None else float(w.sum())
    S = S if w is None else S * w[:, None]
    n = S.shape[0]
    rows, cols = np.nonzero(S > 0)
    surv = S[rows, cols]
    order = np.lexsort((cols, -surv))
    m, g = best_prefix(n, rows[order], cols[order], surv[order], costs, base)
    return np.bincount(rows[order[:m]], minlength=n).astype(np.int64), g


def plan_value(S, depths, w) -> float:
    """The plan's expected tokens as its goodput G counts them: one a row (`w`'s where given) plus the planned
    slots' survivals, weighted alike; E / G is the plan's predicted seconds."""
    if search.COMPILED and S.dtype == np.float64 and (w is None or w.dtype == np.float64):
        return kernels.plan_value(S, S[:, 0] if w is None else w, w is not None, depths)   # compiled
    Sw = S if w is None else S * w[:, None]
    return (float(S.shape[0]) if w is None else float(w.sum())) + float(
        (Sw * (np.arange(S.shape[1])[None, :] < depths[:, None])).sum())


def extended(depths, extend: int, rowcap) -> np.ndarray:
    """The depths past the plan: min(depth + extend, the row's cap) where the plan drafts, else 0."""
    if search.COMPILED:
        return kernels.extend_depths(depths, extend, rowcap)   # the same, compiled
    return np.where(depths > 0, np.minimum(depths + extend, rowcap), 0)


def ratio(S, depths, w, G) -> list:
    """[E, T]: the plan's value (`plan_value`) and predicted seconds (E / G), for the extension's bar."""
    E = plan_value(S, depths, w)
    return [E, E / G]


def ratio_extended(S, depths, w, G, extend: int, rowcap) -> tuple[list, np.ndarray]:
    """(`ratio`, `extended`): the extension's bar and depths, in one compiled call where `plan_value` compiles."""
    n = S.shape[0]
    if search.COMPILED and S.dtype == np.float64 and (w is None or (w.dtype == np.float64 and w.shape == (n,))) \
            and depths.shape == rowcap.shape == (n,):
        E, out = kernels.extension(S, S[:, 0] if w is None else w, w is not None, depths, extend, rowcap)
        return [E, E / G], out
    return ratio(S, depths, w, G), extended(depths, extend, rowcap)


def drafts(depths) -> bool:
    """Whether any row drafts: bool(depths.any()) (compiled for int64 depths)."""
    if search.COMPILED and depths.dtype == np.int64 and depths.ndim == 1:
        return kernels.any_nonzero(depths)
    return bool(depths.any())


def catch_up_pricing(view, cost: str, pad, calib):
    """(cost, padded) that a catch-up is priced with: the clock's true cost (cost=clock), else view.cost, padded as
    an earlier catch-up showed (`kit.CatchUpPadding`), else where the calibration found a padded verify."""
    if cost == "clock":
        return view.true_cost, False
    return view.cost, pad.verdict(cost == "calibrated" and bool(calib.pad))


def catch_up(view, depths, S, costs, G, weights, evidence, calibration_prior, pricing, lag=None):
    """Rows whose draft lags (view.draft_lag > 2) resume only where the plan's gain over the steps it is expected
    to go on pays for their catch-up (`kit.plan_pays_catch_up`; draining, till the run ends); else no lagging row
    drafts and the others are planned again without them. On thin evidence only the rows whose catch-up costs at
    most one idle step resume (`kit.catch_up_rows`). `pricing()`: (cost, padded) to price it; `lag`: view.draft_lag
    where read already. Returns (depths, G)."""
    lag = view.draft_lag if lag is None else lag
    if search.COMPILED and depths.dtype == lag.dtype == np.int64 and not kernels.any_late(depths, lag):
        return depths, G   # (compiled: no row that drafts lags)
    late = (depths > 0) & (lag > 2)
    if not late.any():
        return depths, G
    w, args = weights.w, pricing()
    base = float(view.batch_size) if w is None else float(w.sum())
    if not plan_pays_catch_up(view, depths, late, S, G, base, costs, weights.drained, *args):
        drop = lag > 2   # every lagging row, not only the plan's: the replan would pick others
    elif thin_evidence(evidence.verified, calibration_prior, view.batch_size):
        drop = (lag > 2) & ~catch_up_rows(view, late, float(costs.verify[0]), *args)
    else:
        return depths, G
    S = S.copy()
    S[drop] = 0.0
    return plan_positions(S, costs, G, view.remaining, w)


def ends_later(depths, S, costs, G, weights, remaining, closed, judged, ext: Extension | None = None) -> bool:
    """The makespan gate: in a closed batch's drain, a plan that drafts every row, kept to the run's end, is
    expected to end the run later than no drafts. Judged only once `judged` (as many drafts as rows verified) and
    where every row may end the run (`weights.p_min` >= MAY_END). Row i's steps are about normal, mean r_i / e_i
    and variance r_i v_i / e_i^3 (e_i, v_i: its tokens a step's mean and variance), and the run ends at their
    expected maximum (`kit.expected_max`); a step's fixed share f of its time follows the run's end, the rest the
    rows' mean steps, for the plan (its predicted seconds: its value / G) and for no drafts alike. `ext`: the
    search's `Extension`, which says whether every row drafts where `depths` is its plan."""
    n = depths.size
    if not (closed and weights.drained and n > 1 and weights.p_min >= MAY_END and judged
            and (ext.full if ext is not None and depths is ext.planned else depths.all())):
        return False
    K = S.shape[1]
    j = np.arange(K)
    Sd = np.where(j[None, :] < depths[:, None], S, 0.0)
    L = Sd.sum(axis=1)                                   # accepted drafts a step: P(L > j) = S[:, j]
    e = 1.0 + L
    v = np.maximum((Sd * (2.0 * j + 1.0)[None, :]).sum(axis=1) - L * L, 0.0)
    r = remaining.astype(np.float64)
    mu = r / e
    f = weights.fixed
    steps = f * expected_max(mu, np.sqrt(r * v / e ** 3)) + (1.0 - f) * float(mu.mean())
    t_plan = plan_value(S, depths, weights.w) / G if G > 0 else math.inf
    return steps * t_plan > (f * float(r.max()) + (1.0 - f) * float(r.mean())) * float(costs.verify[0])


def probe_rows(view, rows, evidence, calibration_prior):
    """Which rows a probe may draft, or None: every row while the run has probed fewer than PROBE_ROUNDS steps
    (`kit.may_probe`); past that, on thin evidence, the rows no draft of which was verified yet, once they are at
    least a quarter of the batch (and two rows, unless the batch is one): a stream's later requests."""
    n = view.batch_size
    if may_probe(evidence.probes, evidence.verified, calibration_prior, n):
        return np.ones(n, bool)
    if not thin_evidence(evidence.verified, calibration_prior, n):
        return None
    fresh = rows.verified == 0
    k = int(fresh.sum())
    return fresh if k and k >= max(min(2, n), n / 4) else None


def probe_step(view, est, costs, G, w, evidence, calibration_prior, z, pricing):
    """The probe gate: `probe` on the rows `probe_rows` allows (est: the plan's estimates; `pricing`: a callable
    giving the catch-up's pricing, or None: no catch-up), the evidence told whether it drafted. Returns its depths,
    or None where no row may probe."""
    rows = probe_rows(view, est.rows, evidence, calibration_prior)
    if rows is None:
        return None
    depths = probe(view, est.S, costs, G, w, est.rowcap, rows, evidence, z, pricing() if pricing else None)
    evidence.probed(bool(depths.any()))
    return depths


def probe(view, S, costs, G, w, rowcap, rows, evidence, z, catch_up_args):
    """No row drafts on thin evidence: would a draft pay at a calibration `z` standard errors higher (binomial
    relative error sqrt((1 - A / V) / A), A of V verified drafts accepted, the prior's included)? Then every row of
    `rows` the optimistic plan (weighted by `w`) drafts gets one token (lagging rows: one idle step's worth;
    `catch_up_args` None: no catch-up)."""
    A, V = evidence.evidence()
    up = 1.0 + z * math.sqrt(max(1.0 - A / V, 0.0) / max(A, 1e-9))
    hi = np.minimum(S * up ** np.arange(1, S.shape[1] + 1), 0.999)   # slot j: j draft tokens' survival
    hi[np.arange(S.shape[1])[None, :] >= rowcap[:, None]] = 0.0
    depths, _ = plan_positions(hi, costs, G, view.remaining, w)
    depths[~rows] = 0   # whether it pays is the batch's question; the rows to learn from, `rows`
    late = (depths > 0) & (view.draft_lag > 2)
    if catch_up_args is not None and late.any():
        ok = catch_up_rows(view, late, float(costs.verify[0]), *catch_up_args)
        depths[late & ~ok] = 0
    return np.minimum(depths, 1)


class Drafting:
    """While drafting (`keep_drafting`): each row's survival so far (its calibrated confidences' product, `s`); a
    row drafts its next planned position while that token, worth s x a x the position's factor (x its weight), beats
    G times its marginal time (`kit.keep_by_margin`). Past the plan (`extend`), each position must raise the step's
    goodput with the positions added so far (`ratio`: [E, T], the plan's value and seconds, grown in place)."""

    def __init__(self, n, a, cal, w, costs, G, planned=None, ratio=None, remaining=None, factors=None):
        self.s = np.empty(n)
        self.s.fill(1.0)   # (np.ones' values, without its Python wrapper)
        self.a, self.cal, self.w, self.costs, self.G = a, cal, w, costs, G
        self.planned, self.ratio, self.remaining = planned, ratio, remaining   # remaining: the step's, where given
        self.factors = factors   # the step's position factors (PositionFactors.factor at the plan), where given
        self._rows = None   # compiled: the keeps' per-step arguments (`_compiled_rows`), at the first keep; else False
        self._keep = self._nf = None   # compiled: the mask, reused while nobody holds it; the factors' count

    def keep(self, view, position, confidence, positions) -> np.ndarray:
        rows = self._rows
        if rows is None:
            rows = self._rows = self._compiled_rows(view)
        if rows:   # one compiled pass (`kernels.drafting_keep`: the same operations; s updated in place)
            r = self.ratio
            f = 0.0 if position + 1 < self._nf else float(positions.factor(position + 2)[-1])
            if getrefcount(self._keep) > 2:   # (the last mask is held past its keep: a new one)
                self._keep = np.empty(self.s.size, np.bool_)
            keep = self._keep
            E, T = (0.0, 1.0) if r is None else r
            grow, gv, dt = kernels.drafting_keep(keep, confidence, position, f, view.drafted, E, T, *rows)
            if grow > 0:
                r[0] += gv
                r[1] += dt
            if grow >= 0:
                return keep
            self._rows = False   # a row vector not the batch's length: the numpy form decides
        fs, j = self.factors, position + 1
        f = float(fs[j] if fs is not None and j < fs.size else positions.factor(j + 1)[-1])
        drafting = ~np.isnan(confidence)
        self.s = self.s * np.minimum(np.where(drafting, confidence, 0.0) * self.cal, 1.0)
        idx = np.flatnonzero(drafting & (view.depths > position + 1))
        if idx.size == 0:
            return np.zeros(view.batch_size, bool)
        if idx.size == 1:   # one row left to decide (batch 1, a drained tail): the same arithmetic, in floats
            i = int(idx[0])
            v = float(self.s[i]) * min(float(self.a[i]) * f, 0.999)
            if self.w is not None:
                v = v * float(self.w[i])
        else:
            v = self.s[idx] * np.minimum(self.a[idx] * f, 0.999)
            if self.w is not None:
                v = v * self.w[idx]
        past = self.ratio is not None and bool((self.planned[idx] <= position + 1).all())
        return keep_by_margin(view, position, idx, v, self.costs, self.G, self.ratio if past else None)

    def _compiled_rows(self, view):
        """`kernels.drafting_keep`'s arguments fixed through the step's drafting (the state s, the rows' values,
        view.depths, remaining and the tables), read at its first keep, where it runs this step's keeps (float64
        tables, the draft's past the rows, int64 remaining); else False."""
        c, w, r = self.costs, self.w, self.ratio
        dr, ver, rem = c.draft, c.verify, self.remaining
        if not (search.COMPILED and dr.size > self.s.size and (
                (dr.dtype is _F64 and ver.dtype is _F64 and (rem is None or rem.dtype is _I64))   # (native: `_typed`)
                or _typed((dr, ver), () if rem is None else (rem,)))):
            return False
        depths, self._nf = view.depths, 0 if self.factors is None else self.factors.size
        self._keep = np.empty(self.s.size, np.bool_)
        return (self.s, self.cal, depths, self.a, _NO_FACTORS if self.factors is None else self.factors,
                self.a if w is None else w, w is not None, depths if r is None else self.planned, r is not None,
                view.remaining if rem is None else rem, dr, ver,
                search._NO_PAD if c.pad is None else c.pad, float(self.G))


_NO_FACTORS = np.zeros(0)
