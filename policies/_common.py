"""Helpers shared by the zoo's policies: per-request state that follows rows through admission and
retirement, step-time tables built from the view's cost model, their online calibration against the
measured step costs, and the position-by-position goodput search. Policy API and numpy only."""
from __future__ import annotations

import functools
import math

import numpy as np

from specdepth.errors import as_bool, as_float, as_int
from specdepth.policy import Policy


class PerRequest:
    """Per-request float columns that follow `view.request_ids` (rows come and go between steps).

        st = PerRequest(n=2, init=(4.0, 0.0)); cols = st.align(view.request_ids)  # [batch, n]
    Rows of requests never seen before start at `init`; requests that left the batch are dropped.
    """

    def __init__(self, n: int, init=0.0):
        self.init = np.broadcast_to(np.asarray(init, dtype=float), (n,)).copy()
        self.reset()

    def reset(self):
        self.ids = np.empty(0, np.int64)
        self.cols = np.empty((0, self.init.size))

    def align(self, ids: np.ndarray) -> np.ndarray:
        """The columns, row-aligned with `ids` (the same array object across calls until ids change)."""
        if ids.shape == self.ids.shape and np.array_equal(ids, self.ids):
            return self.cols
        new = np.tile(self.init, (ids.size, 1))
        if self.ids.size:
            order = np.argsort(self.ids, kind="stable")
            sorted_ids = self.ids[order]
            at = np.minimum(np.searchsorted(sorted_ids, ids), sorted_ids.size - 1)
            found = sorted_ids[at] == ids
            new[found] = self.cols[order[at[found]]]
        self.ids, self.cols = np.array(ids, np.int64), new
        return self.cols


@functools.lru_cache(maxsize=1024)
def _grid(n: int, dense: int = 32, points: int = 40) -> np.ndarray:
    """0..n exactly when small, else 0..dense plus a geometric grid up to n (for interpolation). Read-only,
    one array per argument (geomspace and unique cost ~0.1 ms, on the plan's critical path on backend=hf)."""
    if n <= dense + points:
        g = np.arange(n + 1, dtype=float)
    else:
        g = np.concatenate([np.arange(dense, dtype=float), np.unique(np.rint(np.geomspace(dense, n, points)))])
    g.flags.writeable = False
    return g


class StepCost:
    """Predicted step time pieces for the current batch, from `view.cost`, as lookup tables:

      verify[x]  seconds of the verify forward carrying x draft tokens in total (plus one token per row)
      draft[m]   seconds of one draft forward over m rows
    Built at the batch's mean context (KV reads and attention are sums over the batch, so the mean is
    nearly exact) on a grid of x and m, interpolated in between (a roofline is piecewise linear). Tables
    are cached per (batch size, depth cap, mean context in 2% buckets), `cache` of them at most.
    A cost that pads every forward to its deepest row (`cost.pad_ragged`: the simulator's true cost with
    backend.pad_ragged) pays for the positions opened, not for the drafts: then verify[x] is the verify without
    drafts for any x, and pad[p] what opening position p adds (every row one token deeper), as
    CostCalibration.correct prices a padded engine. (Spreading x drafts evenly over the rows, as above, would
    price x < n drafts at no verify cost at all: the padded query is the deepest row's, a whole token.)
    `pad_context` (goodput's): also vpad[p], the verify with every row p deep at the batch's longest context, which
    an engine that pads a ragged batch pays (its KV padded to the longest row too), for `CostCalibration.correct`
    to price a padded engine with (`pad_extra` with a view measures the same padding).
    """

    pad = None   # None: no padded-verify term (CostCalibration.correct may add one)
    vpad = None   # the padded-context verify per depth (`_vpad`), or None

    def __init__(self, cache: int = 512, pad_context: bool = False):
        self.key = None
        self.cache = cache
        self.pad_context = pad_context
        self._tables = {}
        self._vkey = self._vval = None   # `_vpad`'s last key and table

    def update(self, view, kmax: int, cost=None) -> "StepCost":
        """Tables for this step's batch from `cost` (default view.cost)."""
        cost = view.cost if cost is None else cost
        ctx = view.context_lens
        n = ctx.size
        cbar = float(ctx.sum()) / n if n else 0.0
        self.vpad = self._vpad(cost, ctx, kmax) if self.pad_context else None
        key = (n, kmax, int(math.log1p(cbar) * 50.0), id(cost))
        if key == self.key:
            return self
        self.key = key
        hit = self._tables.get(key)
        if hit is not None:
            self.verify, self.draft, self.pad = hit
            return self
        if len(self._tables) >= self.cache:
            self._tables.clear()
        X = n * kmax
        ms = _grid(n)
        self.pad = None
        if getattr(cost, "pad_ragged", False):   # padded: the deepest row's depth p sets the verify
            V = np.array([cost.verify_time(ctx, np.full(n, p, np.int64)) for p in range(kmax + 1)])
            self.verify, self.pad = np.full(X + 1, V[0]), np.diff(V)
        else:
            xs = _grid(X)
            if hasattr(cost, "verify_times"):   # a CostModel: the whole table in one call
                vt = cost.verify_times(ctx, xs)
            else:
                vt = np.array([cost.verify_time(ctx, np.full(n, x / n)) for x in xs])
            self.verify = np.interp(np.arange(X + 1), xs, vt) if xs.size != X + 1 else vt
        if hasattr(cost, "draft_times"):
            dt = cost.draft_times(cbar, ms)
        else:
            dt = np.array([cost.draft_time(np.full(int(m), cbar)) if m else 0.0 for m in ms])
        self.draft = np.interp(np.arange(n + 1), ms, dt) if ms.size != n + 1 else dt
        self._tables[key] = (self.verify, self.draft, self.pad)
        return self

    def _vpad(self, cost, ctx: np.ndarray, kmax: int):
        """vpad[p]: the verify with every row p deep at the batch's longest context, as an engine that pads ragged
        forwards runs it (the query and the KV to the longest row); None for a cost that pads already."""
        if getattr(cost, "pad_ragged", False) or ctx.size == 0:
            return None
        n, cmax = ctx.size, int(ctx.max())
        key = (n, kmax, int(math.log1p(cmax) * 50.0), id(cost))
        if self._vkey == key:
            return self._vval
        full = np.full(n, cmax, np.int64)
        if hasattr(cost, "verify_times"):
            v = cost.verify_times(full, n * np.arange(kmax + 1, dtype=float))
        else:
            v = np.array([cost.verify_time(full, np.full(n, p, np.int64)) for p in range(kmax + 1)])
        self._vkey, self._vval = key, v
        return v


def row_cost(cost, ctx: np.ndarray) -> float:
    """Seconds one more row at the batch's mean context adds to a verify without drafts (`cost`: a cost model
    such as view.cost; 0 for an empty batch)."""
    n = ctx.size
    if n == 0:
        return 0.0
    c = np.full(n, float(ctx.mean()))
    one_less = float(cost.verify_time(c[1:], np.zeros(n - 1))) if n > 1 else 0.0
    return max(float(cost.verify_time(c, np.zeros(n))) - one_less, 0.0)


class PositionFactors:
    """Per draft position p, the accepted tokens and the sum of the rows' estimates over the tokens verified
    there (decayed with `forget`); their ratio, the position factor f_p, corrects an estimate a at position p
    (a x f_p: a draft whose later guesses are accepted less often than its first), shrunk toward 1 with
    `prior` pseudo-tokens. A factor below 1 is raised by `optimism` standard errors (at most to 1; bound
    0.5 sqrt(E_p) / (E_p + prior), E_p the expected tokens verified there): without it, a position judged bad
    on a few dozen early tokens is never drafted again and the judgement never corrected. `factor(k)` is
    cached until the sums change (each element depends only on its own position's sums).
    `paired` (add's `drafted` given): a later position p is judged against position 0's outcomes on the same
    row-steps (those drafted at least p + 1 deep), f_p = ratio_p / ratio_0(those row-steps) x f_0, the middle
    ratio shrunk toward f_0 (no selection) with `prior` pseudo-tokens. A policy drafts deep where its estimate
    came out high, so measured against the estimate alone the later positions look worse than they are (the
    winner's curse): experiments/pareto's a100_80g, iid a = 0.5 (every position accepted alike), settled the
    second position's factor at 0.88-0.92, and goodput drafted one token where two paid (batch 8: 0.985 of fixed
    depth 2 end to end). Paired, the selection inflates both ratios alike, and they cancel."""

    def __init__(self, prior: float = 20.0, optimism: float = 2.0, paired: bool = False):
        self.prior, self.optimism, self.paired = prior, optimism, paired
        self.accepted = np.zeros(0)
        self.expected = np.zeros(0)
        self.first_acc = np.zeros(0)   # paired: position 0's accepted tokens over the row-steps drafted past p
        self.first_exp = np.zeros(0)   # ... and their estimates
        self._cache = None   # (the two sums' arrays, the factors); reset where the sums change in place

    def factor(self, k: int) -> np.ndarray:
        """f_p for positions 0..k-1 (1 where nothing was verified yet)."""
        c = self._cache
        if c is None or c[0] is not self.accepted or c[1] is not self.expected or c[2].size < k:
            self._cache = c = (self.accepted, self.expected, self._factor(max(k, 32)))
        return c[2][:k]

    def _factor(self, k: int) -> np.ndarray:
        f = np.ones(k)
        m = min(k, self.accepted.size)
        e, P = self.expected[:m], self.prior
        mean = (self.accepted[:m] + P) / (e + P)
        if self.paired and m > 1:
            sel = (self.first_acc[1:m] + P * mean[0]) / (self.first_exp[1:m] + P)   # prior: no selection
            mean[1:] = mean[1:] / sel * mean[0]
        if self.optimism:
            mean = np.minimum(mean + self.optimism * 0.5 * np.sqrt(e) / (e + P), np.maximum(mean, 1.0))
        f[:m] = mean
        return f

    def add(self, verified: np.ndarray, accepted: np.ndarray, estimate: np.ndarray,
            drafted: np.ndarray | None = None) -> None:
        """Tokens verified at each position (bool [rows, k]), which of them were accepted, the rows' estimates
        (and, paired, each row's drafted tokens)."""
        self._cache = None
        k = verified.shape[1]
        if self.accepted.size < k:
            grow = k - self.accepted.size
            self.accepted = np.concatenate([self.accepted, np.zeros(grow)])
            self.expected = np.concatenate([self.expected, np.zeros(grow)])
            self.first_acc = np.concatenate([self.first_acc, np.zeros(grow)])
            self.first_exp = np.concatenate([self.first_exp, np.zeros(grow)])
        self.accepted[:k] += (verified & accepted).sum(axis=0)
        self.expected[:k] += (verified * estimate[:, None]).sum(axis=0)
        if self.paired and drafted is not None and k:
            past = np.arange(k)[None, :] < drafted[:, None]   # row-steps drafted at least p + 1 deep
            self.first_acc[:k] += (past & (verified[:, :1] & accepted[:, :1])).sum(axis=0)
            self.first_exp[:k] += (past * estimate[:, None]).sum(axis=0)

    def forget(self, keep: float) -> None:
        self.accepted *= keep
        self.expected *= keep
        self.first_acc *= keep
        self.first_exp *= keep
        self._cache = None


def normal_cdf(x: np.ndarray) -> np.ndarray:
    """The standard normal CDF to ~2e-4 (tanh form; numpy has no erf)."""
    return 0.5 * (1.0 + np.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))


def expected_max(mu: np.ndarray, sd: np.ndarray, points: int = 256, grouped: bool = False) -> float:
    """E[max_i X_i] of independent X_i ~ normal(mu_i, sd_i^2) (sd_i = 0: the constant mu_i): lo + the integral
    of 1 - F from lo to hi, F the maximum's CDF (the product of the rows'), on `points` points; below lo =
    max(mu - 6 sd) F is 0, above hi = max(mu + 6 sd) it is 1. `grouped`: rows that cannot reach lo + 6 sd are
    left out and equal (mu, sd) pairs enter once, raised to their count (the same to rounding; for large
    batches, `uniform_depth`)."""
    mu = np.asarray(mu, np.float64)
    sd = np.asarray(sd, np.float64)
    lo, hi = float((mu - 6.0 * sd).max()), float((mu + 6.0 * sd).max())
    if hi - lo <= 0.0:
        return float(mu.max())
    x = np.linspace(lo, hi, points)
    spread = sd > 0.0
    if grouped:
        near = spread & (mu + 6.0 * sd > lo)
        (m, s), count = np.unique(np.stack([mu[near], sd[near]]), axis=1, return_counts=True)
        F = np.prod(normal_cdf((x[None, :] - m[:, None]) / s[:, None]) ** count[:, None], axis=0)
    else:
        F = np.prod(normal_cdf((x[None, :] - mu[spread, None]) / sd[spread, None]), axis=0)
    if not spread.all():
        F = F * (x >= float(mu[~spread].max()))
    return lo + float(np.trapezoid(1.0 - F, x))


def pad_extra(costs, drafted: np.ndarray, view=None) -> float:
    """What a verify would cost more than the ragged prediction if every row were padded to the deepest
    row's drafts (StepCost tables, uncorrected; 0 when the rows drafted alike). `view` given (in observe, after
    verification; `StepCost.pad_context`): padded as an engine that pads a ragged batch runs it, every row's query
    to the deepest row's and its context (KV) to the longest row's, against view.predicted_verify_s (the view's
    cost at the rows' own contexts and drafts); a step that drafted nothing pads its contexts too."""
    n = drafted.size
    k = int(drafted.max(initial=0))
    predicted = None if view is None else view.predicted_verify_s   # None before verification
    if predicted is not None and n:
        ctx = view.context_lens
        top = int(ctx.max())
        if n == 1 or (int(ctx.min()) == top and int(drafted.min()) == k):   # nothing to pad: the same shapes
            return 0.0                                                      # as predicted (one cost-model call less)
        return float(view.cost.verify_time(np.full(n, top, np.int64), np.full(n, k, np.int64)) - predicted)
    if n == 0 or k == 0:   # nothing drafted: nothing to pad (and a plan that drafts nothing may build no tables)
        return 0.0
    v = costs.verify
    return float(v[min(n * k, v.size - 1)] - v[min(int(drafted.sum()), v.size - 1)])


_UPPER3 = ((0, 0), (0, 1), (0, 2), (1, 1), (1, 2), (2, 2))   # a symmetric 3 x 3 matrix's upper triangle
_AT3 = ((0, 1, 2), (1, 3, 4), (2, 4, 5))                      # where entry (a, b) of it lies in that list


class CostCalibration:
    """Online correction of the cost model from what the steps really cost (the view's measured_* and
    predicted_* fields, read in observe). Per phase, measured = scale x predicted + fixed x count, with
    count = draft forwards (draft phase: a fixed cost per draft position) or 1 (verify phase: a fixed cost
    per step), fitted by least squares with exponential forgetting (`memory` steps) and shrunk toward
    (scale 1, fixed 0) with `prior` pseudo-steps, so a run starts from the cost model and short runs do not
    pay a learning transient. Any policy can use it:

        cal = CostCalibration(); cal.observe(view)   # in observe()
        tables = cal.correct(costs)                   # corrected StepCost tables (.verify, .draft)

    `sticky` (default on): a padding term found earlier is kept while the recent steps cannot tell (`_keep_pad`).
    `cautious` (default on): where no term was found and the steps cannot rule one out, the padding is assumed
    (`_doubt`).
    `draft_clip` (> 0; default 0, off): a step's measured draft seconds enter the draft fit at most draft_clip x the
    fit's price for the step (scale x predicted + fixed x forwards), so one outlier (a draft that also caught up
    skipped tokens) moves the fit at most that factor, and a cost the model misses is learnt at most that factor a
    step (goodput sets 3).
    `draft_fixed` (default off): where the draft's steps do not identify a scale apart from a fixed part (the cost
    model's seconds per forward vary by less than UNIDENTIFIED, about 10 %: memory-bound forwards whose rows barely
    change their price), the excess over the model is read as a fixed cost per forward (scale 1, the fixed part
    fitted alone; where the model overprices, a scale alone): the scale would multiply the model's price of each
    further row, which such data cannot tell. A small draft's forward at a small batch costs a nearly constant time
    the roofline can miss (launches, an engine's own fixed costs), not a multiple of its rows' price (c64 of
    robustness draw 2058: 1.33 ms per forward fitted as scale 3.8 and 0.56 ms; goodput drafted 2-3 rows a step
    where every row paid, 0.962 of fixed depth 1 against 1.005 with the true cost). goodput's `draft_fixed`, off by
    default (it moved the development draws' other cells within chance, slightly down in expectation).
    """

    PHASES = ("draft", "verify")
    UNIDENTIFIED = 0.01   # 1 - (the cosine of predicted and forwards)^2: ~ the squared CV of the price per forward

    def __init__(self, memory: float = 200.0, prior: float = 2.0, sticky: bool = True, cautious: bool = True,
                 draft_clip: float = 0.0, draft_fixed: bool = False):
        self.memory, self.prior = float(memory), float(prior)
        self.draft_fixed = bool(draft_fixed)
        self.draft_clip = float(draft_clip)   # > 0: a step's measured draft counts at most this x the fit's price
        self.sticky = bool(sticky)   # keep a padding term the recent steps cannot tell about (`_keep_pad`)
        self.cautious = bool(cautious)   # assume padding the steps cannot rule out (`_doubt`)
        self.reset()

    def reset(self):
        # per phase: decayed sums of [x1 x1, x1 x2, x2 x2, x1 y, x2 y, weight], x = (predicted, count); plain floats
        # (every step, six numbers: numpy's per-call cost was most of it; the same arithmetic, the same bits)
        self._sums = {ph: [0.0] * 6 for ph in self.PHASES}
        self._fit = {ph: (1.0, 0.0) for ph in self.PHASES}
        # verify with the padding feature (observe's `pad`): decayed X'X (its upper triangle, row by row), X'y,
        # y'y and weight for x = (predicted, 1, pad); plain floats: the fit runs every step, on 3 features
        self._pad_xx, self._pad_xy, self._pad_yy, self._pad_w = [0.0] * 6, [0.0] * 3, 0.0, 0.0
        self.pad = 0.0   # seconds per second of padded verify growth (0: the engine packs ragged forwards)
        self._pad_fit = None   # (scale, fixed) of the verify fit with the padding term, where it is taken
        self._drafted_last = True   # whether the last step observed drafted (a run's first draft resumes nothing)

    def update(self, phase: str, predicted: float, count: float, measured: float) -> None:
        keep = math.exp(-1.0 / self.memory)
        x = (predicted * predicted, predicted * count, count * count, predicted * measured, count * measured, 1.0)
        s = self._sums[phase] = [v * keep + d for v, d in zip(self._sums[phase], x)]
        self._fit[phase] = self._solve_fixed(s) if self.draft_fixed and phase == "draft" else self._solve(s)

    def _solve_fixed(self, s):
        """`draft_fixed`: _solve, unless the data do not identify the scale apart from the fixed part (1 - cos^2 of
        the two features below UNIDENTIFIED); then scale 1 and the fixed part alone (ridge toward 0 as _solve's),
        or, where the model overprices (a negative fixed part), a scale alone."""
        if s[5] <= 0.0 or s[0] <= 0.0 or s[2] <= 0.0 or 1.0 - s[1] * s[1] / (s[0] * s[2]) >= self.UNIDENTIFIED:
            return self._solve(s)
        k = self.prior / s[5]
        fixed = (s[4] - s[1]) / (s[2] * (1 + k))   # y - predicted = fixed x forwards
        if fixed >= 0.0:
            return (1.0, fixed)
        return (max((s[3] + k * s[0]) / (s[0] * (1 + k)), 0.0), 0.0)

    def _solve(self, s):
        w = s[5]
        if w <= 0.0 or s[0] <= 0.0:
            return (1.0, 0.0)
        # ridge toward (1, 0): `prior` pseudo-steps at the data's mean squares of each feature
        k = self.prior / w
        a11, a12, a22 = s[0] * (1 + k), s[1], s[2] * (1 + k) if s[2] > 0 else 1.0
        b1, b2 = s[3] + k * s[0], s[4]
        det = a11 * a22 - a12 * a12
        if det <= 0.0:
            return (1.0, 0.0)
        scale, fixed = (b1 * a22 - b2 * a12) / det, (a11 * b2 - a12 * b1) / det
        if scale < 0.0 or fixed < 0.0:   # keep the physical sign: refit with the other part at zero
            return (max(b1 / a11, 0.0), 0.0) if fixed < 0.0 else (0.0, max(b2 / a22, 0.0))
        return (scale, fixed)

    def observe(self, view, pad: float | None = None, caught_up: bool = False) -> None:
        """Add this step's measured vs predicted costs (call from observe; a no-op where none). `pad`: what
        the verify would cost more than predicted if the engine padded every row to the step's deepest one
        (`_common.pad_extra`); given, the fit also learns how much of that the engine pays (`self.pad`).
        A step that drafts after a step that drafted nothing is left out of the draft fit: there the draft also
        catches up the tokens it skipped (backend=hf; `backend.draft_catch_up`), a cost of the idle steps, not
        of the positions drafted, and one such step could set the fit for good, since a fit that says drafts
        are dear is not corrected while no draft is made (c12 of robustness draw 2036: a probe after 166 idle
        steps measured 0.32 s against 2.3 ms predicted; the draft's scale of 21 stopped drafting for the run).
        `caught_up` (a policy that knows, from view.draft_lag at plan: `CatchUpPadding.caught_up`): whether a row
        whose draft lagged drafted this step; such a step is left out too, though the step before drafted. For
        a policy that drafts every row or none (CostAwareDepth) a row lags only where `catch_up` held it back, for
        many steps: one step that drafted rows just caught up next to held ones set the draft's scale as above
        and stopped drafting for the run (c103 of robustness draw 2041, batch_scaled 0.985 of the baseline
        against 1.016 without `catch_up`). Not for goodput, whose per-row plans leave rows a few tokens behind
        on most drafting steps of a stream: left out, those steps starve the fit (c44 of 2041, 0.997 -> 0.972)."""
        mv = view.measured_verify_s
        if mv is None:
            return
        self.update("verify", view.predicted_verify_s, 1.0, mv)
        if pad is not None:
            self._update_pad(view.predicted_verify_s, pad, mv)
        forwards = view.draft_forwards
        if forwards and self._drafted_last and not caught_up:
            md = view.measured_draft_s
            if self.draft_clip > 0.0:
                sd, cd = self._fit["draft"]
                md = min(md, self.draft_clip * (sd * view.predicted_draft_s + cd * forwards))
            self.update("draft", view.predicted_draft_s, float(forwards), md)
        self._drafted_last = bool(forwards)

    def _update_pad(self, predicted: float, pad: float, measured: float) -> None:
        """measured = scale x predicted + fixed + pad x (padded - predicted), least squares with the same
        forgetting. The padding term is taken (`self.pad`, with its own scale and fixed part) only where the
        data identify it: its coefficient at least three standard errors above 0 and 2 % of the scale, and the
        fit better than without it by 1 % of a step's cost (RMS). A ragged engine's constant per-step cost
        cannot pass for padding even when the padding feature barely varies (the prior's pull on the fixed
        part once did, on a cell with no padding). Where the fixed part comes out negative (a cost model that
        charges a fixed part the engine does not pay) the fit is taken again without it: refusing the padding
        there let a padded 70B verify at batch 200 pass for a 30 ms fixed cost in the verify-only fit, which
        then priced drafts as nearly free (c83 of robustness draw 2035, 0.950 of `none`)."""
        keep = math.exp(-1.0 / self.memory)
        x = (predicted, 1.0, pad)
        self._pad_xx = [v * keep + x[a] * x[b] for v, (a, b) in zip(self._pad_xx, _UPPER3)]
        self._pad_xy = [v * keep + x[a] * measured for a, v in enumerate(self._pad_xy)]
        self._pad_yy = self._pad_yy * keep + measured * measured
        self._pad_w = self._pad_w * keep + 1.0
        prev, self.pad, self._pad_fit = self.pad, 0.0, None
        xx = self._pad_xx
        if self._pad_w < 4.0 or xx[5] <= 0.0:
            return
        A = list(xx)
        for d in (0, 3, 5):   # a hair of ridge on the diagonal
            A[d] = A[d] + A[d] * 1e-9
        fit = self._pad_solve(A, (0, 1, 2))
        if fit is not None and fit[0][1] < 0.0:   # keep the physical sign: refit with no fixed part
            fit = self._pad_solve(A, (0, 2))
        if fit is None:
            self._hold(A, prev, None)
            return
        coef, se = fit
        plain = self._pad_solve(A, (0, 1))   # without the padding term: what it must improve on, by at least
        if plain is None:                    # 1 % of a step's cost (RMS)
            self._hold(A, prev, None)
            return
        gain = (self._rss(plain[0]) - self._rss(coef)) / self._pad_w >= (0.01 * self._pad_xy[1] / self._pad_w) ** 2
        if gain and coef[0] > 0.0 and coef[2] > 3.0 * se and coef[2] > 0.02 * coef[0]:
            self.pad = float(min(coef[2], coef[0]))
            self._pad_fit = (float(coef[0]), float(coef[1]))
        elif not coef[2] + 3.0 * se < prev:   # the data do not say the padding went away
            self._hold(A, prev, coef[2] + 3.0 * se)
        else:
            self._hold(A, 0.0, coef[2] + 3.0 * se)

    def _hold(self, A: list, prev: float, upper: float | None) -> None:
        """Where the padding is not identified: plan with the term found earlier (`sticky`), else with what the
        data cannot rule out (`cautious`, `_doubt`), the scale and fixed part refitted (`_keep_pad`)."""
        self._keep_pad(A, prev if self.sticky and prev > 0.0 else self._doubt(upper))

    def _doubt(self, upper: float | None) -> float:
        """`cautious`: the padding to plan with where the fit cannot rule it out (1: a padded verify at the cost
        model's price), 0 where it can (upper: the padding coefficient's upper bound, three standard errors
        above the fit; None where the fit is singular). Only steps that drafted rows unevenly show padding at
        all; where the plan drafts the same rows alike every step the padding feature is constant and so is
        confounded with a fixed cost per step. Taking the ragged reading there is a trap: it prices the uneven
        plan as cheap, the plan stays uneven, and the data never tell (c233 of robustness draw 2044: one row
        drafted two deep for 340 steps while all 96 paid the padded positions; goodput 0.859 of goodput with
        the true cost). Assumed, padding makes the plan even, which varies the feature and settles the question."""
        if not self.cautious or (upper is not None and upper < 0.5):
            return 0.0
        return 1.0 if upper is None else min(upper, 1.0)

    def _keep_pad(self, A: list, prev: float) -> None:
        """Hold the padding term at prev (> 0: one found earlier, `sticky`, or one the data cannot rule out,
        `cautious`), the scale and fixed part refitted. Why `sticky`: where the recent steps cannot tell whether the
        engine pads, a plan that drafts every row alike pads nothing, so the padding feature stops varying and,
        with forgetting, its coefficient's error grows until the test above fails. Dropping it then priced
        partial drafting as cheap on a padded engine, and goodput drafted 60-80 of 109 rows while every row paid
        the padded position (c69 of robustness draw 2042: 0.944 of fixed depth 1, against 1.003 with the true
        cost). The scale and fixed part are refitted with the padding held at prev; the term goes only where
        the data put it more than three standard errors below prev (above), or the refit has no positive scale."""
        if prev <= 0.0:
            return
        y0, y1 = self._pad_xy[0] - prev * A[2], self._pad_xy[1] - prev * A[4]
        det = A[0] * A[3] - A[1] * A[1]
        if det <= 0.0:
            return
        scale, fixed = (A[3] * y0 - A[1] * y1) / det, (A[0] * y1 - A[1] * y0) / det
        if fixed < 0.0:
            scale, fixed = y0 / A[0], 0.0
        if scale > 0.0:
            self.pad, self._pad_fit = float(min(prev, scale)), (float(scale), float(fixed))

    def _pad_solve(self, A: list, idx: tuple) -> tuple[list, float] | None:
        """Least squares of the padding fit on the features idx (the others at 0), A the (ridged) upper triangle
        of X'X: the three coefficients and the last feature's standard error; None where singular."""
        coef = [0.0, 0.0, 0.0]
        y = self._pad_xy
        if len(idx) == 3:
            a00, a01, a02, a11, a12, a22 = A
            c00, c01, c02 = a11 * a22 - a12 * a12, a02 * a12 - a01 * a22, a01 * a12 - a02 * a11
            c11, c12, c22 = a00 * a22 - a02 * a02, a01 * a02 - a00 * a12, a00 * a11 - a01 * a01
            det = a00 * c00 + a01 * c01 + a02 * c02
            if det == 0.0:
                return None
            coef = [(c00 * y[0] + c01 * y[1] + c02 * y[2]) / det, (c01 * y[0] + c11 * y[1] + c12 * y[2]) / det,
                    (c02 * y[0] + c12 * y[1] + c22 * y[2]) / det]
            last = c22 / det
        else:
            i, j = idx
            aii, aij, ajj = A[_AT3[i][i]], A[_AT3[i][j]], A[_AT3[j][j]]
            det = aii * ajj - aij * aij
            if det == 0.0:
                return None
            coef[i], coef[j] = (ajj * y[i] - aij * y[j]) / det, (aii * y[j] - aij * y[i]) / det
            last = aii / det
        dof = self._pad_w - len(idx)
        return coef, math.sqrt(self._rss(coef) / dof * max(last, 0.0))

    def _rss(self, coef: list) -> float:
        """Residual sum of squares of the padding fit at coefficients coef (a feature left out has 0)."""
        xx, xy = self._pad_xx, self._pad_xy
        quad = sum(coef[a] * coef[b] * xx[k] * (1.0 if a == b else 2.0) for k, (a, b) in enumerate(_UPPER3))
        return max(self._pad_yy - 2.0 * (coef[0] * xy[0] + coef[1] * xy[1] + coef[2] * xy[2]) + quad, 0.0)

    def verify_scale(self) -> float:
        """The verify's scale: how many seconds one predicted second of verify really costs (the padded fit's
        where it is taken)."""
        return self._pad_fit[0] if self.pad else self._fit["verify"][0]

    def params(self, phase: str) -> tuple[float, float]:
        """(scale, fixed seconds per step or per draft position) of a phase."""
        return self._fit[phase]

    def correct(self, costs) -> "Tables":
        """Corrected StepCost tables: verify[x] (x drafts, one forward) and draft[m] (one forward of m rows)."""
        sv, cv = self._fit["verify"]
        sd, cd = self._fit["draft"]
        d = sd * costs.draft + cd
        d[0] = 0.0
        if not self.pad:
            return Tables(sv * costs.verify + cv, d)
        sv, cv = self._pad_fit
        # padded: a plan with x drafts over P positions pays verify'[x] + pad[0] + ... + pad[P-1]
        v, n = costs.verify, costs.draft.size - 1
        pv = self.pad
        vp = getattr(costs, "vpad", None)
        if vp is None:   # the padded verify at the batch's mean context (without StepCost.pad_context)
            vp = every_row_deep(v, n)
        return Tables((sv - pv) * v + cv + pv * vp[0], d, pv * np.diff(vp))


def every_row_deep(verify: np.ndarray, n: int) -> np.ndarray:
    """A StepCost verify table (x drafts over n rows) read at x = n p, every row p deep, for p = 0, 1, ... (the
    last point repeated where the table ends): what a verify that pads every row to the deepest costs per depth."""
    return verify[np.minimum(np.arange(verify.size // max(n, 1) + 1) * n, verify.size - 1)]


class Tables:
    """Step-time tables in StepCost's layout: `verify`, `draft`, and `pad` (None, or pad[p]: the seconds that
    opening draft position p adds to a padded verify, whatever the number of rows drafting there)."""

    def __init__(self, verify: np.ndarray, draft: np.ndarray, pad: np.ndarray | None = None):
        self.verify, self.draft, self.pad = verify, draft, pad


def as_padded(costs, n: int) -> Tables:
    """`costs` (StepCost-like tables for a batch of n rows) priced as if the verify pads every row to the deepest
    one: pad[p] = what a whole position p adds to the verify (n more tokens), the verify without drafts otherwise.
    Tables that already pad are returned as they are. A row drafting past its batch's depth then pays for the
    batch's position it opens, which an engine that pads ragged forwards charges and one that does not charges
    less: a price that never falls short of the engine's."""
    if costs.pad is not None and len(costs.pad):
        return costs
    return Tables(np.full_like(costs.verify, costs.verify[0]), costs.draft, np.diff(every_row_deep(costs.verify, n)))


def tie_bands(a: np.ndarray, tol: float) -> np.ndarray:
    """Estimates that differ by less than a fraction `tol` count as one: from the highest down, a band holds the
    values within tol (relative) of its highest, and every row of it gets the band's mean. A ranking by the
    estimate then ties rows whose estimates differ by less than they can tell apart, and its tie-break (more
    tokens left first) spreads the drafts over them. Without it, a systematic offset of a few 1e-4 (rows with
    evidence vs rows still at the batch's prior, whose prior pseudo-tokens the batch's rate never quite forgets)
    drafted the same rows every step of a stream: they finished in 46-50 steps, the rest in 88, and the staggered
    admissions left the stream a tail of 50 rows for 30 steps (c191 of robustness draw 2052: 0.949 of fixed
    depth 1). tol <= 0: `a` unchanged."""
    if tol <= 0.0 or a.size < 2:
        return a
    u, inv, cnt = np.unique(a, return_inverse=True, return_counts=True)
    if u.size == 1:
        return a
    vals = u.tolist()   # a plain loop over floats: a few microseconds per hundred values
    band = [0] * len(vals)
    b, floor = -1, math.inf
    for j in range(len(vals) - 1, -1, -1):   # from the highest value down
        v = vals[j]
        if v < floor:
            b, floor = b + 1, v * (1.0 - tol)
        band[j] = b
    band = np.array(band, np.int64)
    mean = np.bincount(band, weights=u * cnt) / np.bincount(band, weights=cnt)
    return mean[band][inv]


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
    order = np.lexsort((np.broadcast_to(key[:, None], S.shape), -S), axis=0)   # rows ranked per position
    if n <= _SMALL:
        column = _SmallColumns(S, order, nested)
    elif nested:
        column = _NestedColumns(S, order)
    else:
        C = np.zeros((n + 1, K))
        np.cumsum(np.take_along_axis(S, order, 0), axis=0, out=C[1:])
        column = lambda p, prev: C[:prev + 1, p]   # noqa: E731
    base = float(n) if base is None else base
    g_none = base / costs.verify[0]
    G = max(g_none, G0)
    best_g, ms = g_none, []
    search = _by_position_small if n <= _SMALL else _by_position
    for _ in range(5):
        cand, e, t = search(column, K, G, costs, n, base)
        if not cand:
            if G <= g_none:
                break
            G = g_none
            continue
        g = e / t
        if g > best_g:
            best_g, ms = g, cand
        if abs(g - G) <= 1e-3 * G:
            break
        G = g
    depths = np.zeros(n, np.int64)
    rows = np.arange(n)
    for p, m in enumerate(ms):
        rows = column.rows(p, len(rows), m) if nested or n <= _SMALL else order[:m, p]
        depths[rows] += 1
    return depths, best_g


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
    tables). Adding position k is worth it exactly when its expected tokens beat the goodput times its cost,
    so no position is drafted whose expected gain at the acceptance estimate is below its cost.
    `remaining` (tokens each row has left; given when no request will join the batch again): the run ends
    with its slowest row, so k minimises the predicted time to finish them all, max_i remaining_i / e_i(k)
    steps of T_k each, instead. e_i(k) is the batch's mean expected tokens per step times row i's share at
    the per-row `rates` (rows that really differ, e.g. `shrunk_rates`; default `acceptance`): with rows alike
    that is the plain k, whatever the remaining lengths. `factors` (per draft position, e.g.
    `PositionFactors.factor`): position p's draft is accepted with probability a_i x f_p, not a_i. `trials`
    (the evidence an estimate a rests on, in drafted tokens): price the draft by the estimate's posterior
    predictive (`_expected_tokens`) instead of the estimate alone. `ends` (per row, e.g. `draft_caps`: its
    remaining tokens - 1): a row drafts at most that deep whatever k (a draft past a request's last token is never
    emitted), so depth k gives row i min(k, ends_i) drafts, and the step pays for those: its verify carries their
    sum, and the draft runs (and a padded verify opens) as many positions as the deepest row gets.
    `spread` (with `remaining`): the batch ends with the last of its rows, not the slowest row's mean: row i's steps
    are about normal, mean r_i / e_i(k) and variance r_i v_i(k) / e_i(k)^3 (v: the variance of its tokens a step,
    from the survivals), and the run takes their expected maximum (`expected_max`), as goodput's `drain_makespan`.
    Returns (k, predicted goodput)."""
    ks = np.arange(kmax + 1)
    e = _expected_tokens(acceptance, ks, factors, trials)   # [k, row] expected tokens per step
    n = e.shape[1]
    got = None if ends is None else np.minimum(ks[:, None], np.asarray(ends, np.int64)[None, :])   # [k, row]
    if got is None:
        x, deep = n * ks, ks
    else:   # drafts row i gets at depth k
        e = np.take_along_axis(e, got, axis=0)
        x, deep = got.sum(axis=1), got.max(axis=1, initial=0)
    T = costs.verify[np.minimum(x, costs.verify.size - 1)] + deep * costs.draft[n]
    pad = costs.pad
    if pad is not None and len(pad):   # what opening positions 0..k-1 adds (PolicyTime, a padded verify)
        opened = np.concatenate([[0.0], np.cumsum(pad)])
        T = T + opened[np.minimum(deep, opened.size - 1)]
    if remaining is None:
        g = e.sum(axis=1) / T
    else:
        if rates is not None:
            f = _expected_tokens(rates, ks, factors)
            f = f if got is None else np.take_along_axis(f, got, axis=0)
            e = e.mean(axis=1, keepdims=True) * f / f.mean(axis=1, keepdims=True)
        rem = np.asarray(remaining, float)
        if spread and got is None and rem.size > 1:   # (one row: its mean, exactly)
            surv = np.diff(e, axis=0)   # [p, row]: P(drafts 0..p survive)
            L2 = np.concatenate([np.zeros((1, e.shape[1])),
                                 np.cumsum((2.0 * np.arange(kmax) + 1.0)[:, None] * surv, axis=0)])
            sd = np.sqrt(rem[None, :] * np.maximum(L2 - (e - 1.0) ** 2, 0.0) / e ** 3)
            steps = np.array([expected_max(rem / e[k], sd[k], grouped=True) for k in ks])
        else:
            steps = (rem[None, :] / e).max(axis=1)
        g = float(rem.sum()) / (steps * T)
    k = int(np.argmax(g))
    return k, float(g[k])


def draft_caps(view, kmax: int) -> np.ndarray:
    """Per row, the most drafts worth making: its remaining tokens - 1 (a step emits at most what the request has
    left, so a draft past its last token is never emitted), in 0..kmax."""
    return np.clip(view.remaining - 1, 0, kmax)


def _expected_tokens(acceptance, ks: np.ndarray, factors: np.ndarray | None = None,
                     trials: float | None = None) -> np.ndarray:
    """[len(ks), rows] expected tokens a step emits per row at depth k: 1 + sum over positions p < k of the
    probability that drafts 0..p all survive. `trials`: the acceptance a is an estimate worth that many drafted
    tokens (a Beta(a t, (1 - a) t) belief), and the draft at position p survives, given the p before it did,
    with the posterior predictive probability (a t + p) / (t + p) (the chain gives E[a^(p+1)], not a^(p+1): a
    draft whose first guesses were accepted is likelier to be a good one). Equal to the plain a as t grows."""
    a = np.clip(np.asarray(acceptance, float), 0.0, 0.999)
    if factors is None and trials is None:
        return (1.0 - a[None, :] ** (ks[:, None] + 1)) / (1.0 - a[None, :])
    k = int(ks[-1])
    step = np.broadcast_to(a[None, :], (k, a.size))
    if trials is not None:
        p = np.arange(k, dtype=float)[:, None]
        step = (a[None, :] * trials + p) / (trials + p)
    if factors is not None:
        step = step * np.asarray(factors, float)[:k, None]
    survive = np.cumprod(np.minimum(step, 0.999), axis=0)
    return 1.0 + np.concatenate([np.zeros((1, a.size)), np.cumsum(survive, axis=0)])[ks]


PROBE_TOKENS = 64   # evidence is thin while it rests on fewer verified drafts than max(batch, this) ...
PROBE_ROUNDS = 4    # ... and a run probes at most this many steps


def thin_evidence(evidence: float, prior: float, batch: int) -> bool:
    """The evidence (verified drafts, `prior` pseudo-tokens included) below prior + max(batch, PROBE_TOKENS)."""
    return evidence < prior + max(batch, PROBE_TOKENS)


def may_probe(probes: int, evidence: float, prior: float, batch: int) -> bool:
    """The probe gate of goodput, batch_scaled and confidence: fewer than PROBE_ROUNDS probe steps so far, and
    thin evidence (`thin_evidence`)."""
    return probes < PROBE_ROUNDS and thin_evidence(evidence, prior, batch)


def catch_up_s(view, drafting: np.ndarray, cost=None, padded: bool = False) -> float:
    """Seconds the draft's catch-up tokens add to a step's first draft forward over the rows `drafting` (bool
    mask): each row feeds its view.draft_lag tokens there instead of the 1-2 of a row that drafted the step
    before (its last draft and the bonus token), as `cost.draft_forward` prices them (default view.cost; the
    simulator's true cost pads as its clock does). `padded`: the engine pads every row of a forward to the
    largest context and query, so one lagging row makes every drafting row feed that many tokens. 0 where no
    drafting row lags more than 2 tokens."""
    lag = view.draft_lag[drafting]
    if lag.size == 0 or int(lag.max()) <= 2:
        return 0.0
    cost = view.cost if cost is None else cost
    ctx = np.maximum(view.context_lens[drafting] - lag, 0)
    q0 = np.minimum(lag, 2)
    if padded:
        n = lag.size
        ctx, lag, q0 = np.full(n, ctx.max()), np.full(n, lag.max()), np.full(n, q0.max())
    return max(float(cost.draft_forward(ctx, lag)[0]) - float(cost.draft_forward(ctx, q0)[0]), 0.0)


def catch_up_pays(view, drafting: np.ndarray, gain_s: float, steps: float, cost=None, padded: bool = False,
                  free_s: float = 0.0) -> bool:
    """Whether drafting the rows `drafting` this step is worth the draft's catch-up (`catch_up_s`). A row that
    lags has not drafted for a while; its first draft forward feeds every token it skipped, once, and drafting
    then costs what it did before. A per-step plan cannot price that (it would charge a whole catch-up to one
    step's gain, and never resume) and one that ignores it resumed where a few steps' gain did not pay for it
    (c191 of robustness draw 2040: a batch of 349 at acceptance 0.3 whose tail resumed drafting, 2.6-3.5 % of
    the run's time spent catching up). So the catch-up is paid when what drafting saves per step (`gain_s`
    seconds, against not drafting) over the steps it is expected to go on (`steps`) covers it, or when it costs
    at most `free_s` (e.g. one idle step, what a probe may cost: a plan that drafts after a few idle steps
    resumes, instead of leaving its rows idle for good because their lag, and so the price of resuming, only
    grows while they wait; c75 of robustness draw 2038, a stream of batch 301 near the break-even: 1 % lost).
    True where no drafting row lags (the common case: one comparison)."""
    c = catch_up_s(view, drafting, cost, padded)
    return c <= free_s or gain_s * steps >= c


def plan_pays_catch_up(view, depths: np.ndarray, late: np.ndarray, S: np.ndarray, G: float, base: float, costs,
                       till_end: bool = False, cost=None, padded: bool = False) -> bool:
    """`catch_up_pays` for a plan of `plan_by_position` (goodput, oracle_expected): `depths`, its goodput G over
    `base` (the value of the step without drafts), S its slot survivals, `late` the drafting rows whose draft
    lags. The plan saves verify[0] x (G / G_none - 1) seconds a step against not drafting, G_none = base /
    verify[0], for the steps drafting is expected to go on: the lagging rows' mean remaining / expected tokens per
    step, or the longest row's (`till_end`: draining, the run ends with it). One idle step's catch-up is free."""
    t0 = float(costs.verify[0])
    e = 1.0 + (S * (np.arange(S.shape[1])[None, :] < depths[:, None])).sum(axis=1)
    rem = view.remaining
    steps = float((rem / e).max() if till_end else (rem[late] / e[late]).mean())
    return catch_up_pays(view, depths > 0, t0 * max(G * t0 / base - 1.0, 0.0), steps, cost, padded, free_s=t0)


def catch_up_rows(view, late: np.ndarray, budget_s: float, cost=None, padded: bool = False) -> np.ndarray:
    """The rows of `late` (bool mask) to catch up this step while the acceptance estimate rests on thin evidence:
    the ones with the most tokens left (view.remaining; ties by row) whose catch-up (`catch_up_s`) costs at most
    `budget_s` (e.g. one idle step, as a probe may cost), none where one row costs more. A resumption priced at an
    estimate that has seen no verified draft (a large batch that never drafted until its tail) is a guess: at
    that budget a few rows' drafts, once verified, tell whether resuming the others pays (c191 of robustness draw
    2040: resumed at the prior's 0.7, the rows accepted 0.3, and drafting stopped after one step that spent 1.9 %
    of the run catching up). Returns a bool mask."""
    order = np.argsort(-view.remaining, kind="stable")
    rows = order[late[order]]
    out = np.zeros(late.size, bool)
    lo, hi = 0, rows.size   # the largest prefix within budget (catch-up grows with the rows it feeds)
    while lo < hi:
        m = (lo + hi + 1) // 2
        mask = np.zeros(late.size, bool)
        mask[rows[:m]] = True
        if catch_up_s(view, mask, cost, padded) <= budget_s:
            lo = m
        else:
            hi = m - 1
    out[rows[:lo]] = True
    return out


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
        if ratio is not None:
            G = ratio[0] / ratio[1]
        keep[int(idx[0])] = ok = v - G * dt > 0
        if ok and ratio is not None:
            ratio[0] += v
            ratio[1] += dt
        return keep
    order = np.lexsort((-view.remaining[idx], -np.round(v, 6)))   # ties: more tokens left first
    gain_v = np.cumsum(v[order])
    mm = np.arange(1, idx.size + 1)
    xv = np.minimum(x + mm, last)
    dt = costs.draft[mm] + costs.verify[xv] - costs.verify[min(x, last)]
    if pad is not None and pad.size:   # a padded verify grows by a position's worth for all rows
        dt = dt + pad[min(position + 1, pad.size - 1)]
    if ratio is None:
        gain = gain_v - G * dt
    else:
        E, T = ratio
        gain = (E + gain_v) / (T + dt) - E / T
    best = int(np.argmax(gain))
    if gain[best] > 0:
        keep[idx[order[:best + 1]]] = True
        if ratio is not None:
            ratio[0] += float(gain_v[best])
            ratio[1] += float(dt[best])
    return keep


class CatchUpPadding:
    """Whether the engine pads the draft's catch-up, learnt from the steps that paid one: a padded engine feeds every
    row of the draft's first forward the largest lag among them (backend=hf right-pads its draft input; the
    simulator with backend.pad_ragged), a ragged one each row its own. A policy whose verify fit cannot tell
    (batch_scaled and confidence plan one depth for every row, so padding never shows in their verify) priced the
    catch-up of rows with mixed lags ragged, and on a padded engine paid up to 4 x more than it planned (c191 of
    robustness draw 2040). `planned(view, drafting)` in plan records both prices of the step's catch-up;
    `observe(view, calibration)` compares what the draft forwards cost beyond the calibrated price of the step's
    positions with them, where they differ (by more than 25 %). `padded`: the verdict, None until then.

        pad = CatchUpPadding(); pad.planned(view, depths > 0)   # in plan, the final depths
        pad.observe(view, calib)                                # in observe
        padded = pad.verdict(default)                           # to price a catch-up
    """

    def __init__(self):
        self.padded = None
        self.caught_up = False   # the last plan drafted a row whose draft lagged (CostCalibration.observe)
        self._est = None

    def planned(self, view, drafting: np.ndarray, cost=None) -> None:
        self._est = None
        self.caught_up = bool(drafting.any()) and int(view.draft_lag[drafting].max()) > 2
        if self.caught_up:
            self._est = (catch_up_s(view, drafting, cost, False), catch_up_s(view, drafting, cost, True))

    def verdict(self, default: bool) -> bool:
        """Whether to price a catch-up padded: as learnt, else `default` (e.g. where the verify fit found padding)."""
        return default if self.padded is None else self.padded

    def observe(self, view, calib) -> None:
        est, self._est = self._est, None
        if est is None or not view.draft_forwards:
            return
        ragged, padded = est
        if padded <= 1.25 * ragged:   # the two prices agree (rows that lag alike): nothing to learn
            return
        sd, cd = calib.params("draft")
        extra = view.measured_draft_s - (sd * view.predicted_draft_s + cd * view.draft_forwards)
        self.padded = extra > math.sqrt(ragged * padded)   # nearer the padded price (geometric midpoint)


class IdleReplan:
    """Plans that draft nothing, kept without replanning (`idle_replan` of goodput, batch_scaled, confidence): after
    a plan that drafts nothing, the next 1, then 2, 4, ... (at most `most`) steps draft nothing too without a new
    plan, while the batch holds the same requests; a plan that drafts, or a change of rows, ends it at once.

        if self._idle.skip(view): return zeros     # in plan, first
        ...; self._idle.record(view, bool(depths.any()))

    A plan is Python on the engine's critical path, ~0.2-0.6 ms a step: on the real backend with the shipped pair on
    this CPU, where no draft pays past batch 4, that was most of what these policies lost to `none`
    (experiments/real_pareto). The simulator does not charge a policy's time, so there it can only cost: up to
    `most` steps late to resume drafting while no request joins or leaves (0 = plan every step)."""

    def __init__(self, most: int):
        self.most = most
        self._ids, self._run, self._left = None, 0, 0   # the idle batch's requests, the window, steps left in it

    def skip(self, view) -> bool:
        if self._left and np.array_equal(view.request_ids, self._ids):
            self._left -= 1
            return True
        return False

    def record(self, view, drafts: bool) -> None:
        if not self.most or drafts:
            self._run = self._left = 0
            return
        self._run = min(max(2 * self._run, 1), self.most)
        self._left, self._ids = self._run, np.array(view.request_ids)


class PolicyTime:
    """A policy's own seconds per step, where a step pays them (view.measured_policy_s: the plan and keep_drafting
    hooks' wall time on backend=hf; 0 on the simulator unless engine.charge_policy_time), averaged with forgetting
    (`memory` steps) separately over steps that drafted and steps that did not. `apply(tables)` prices them: the
    idle steps' seconds are added to every plan's verify, and what a drafting step costs more (its plan, which
    `IdleReplan` cannot skip, and keep_drafting) to opening draft position 0 (`pad[0]`), so drafts must also pay
    for the policy's own Python. Where nothing was measured (the simulator) the tables are returned as they are.

        pt = PolicyTime(); pt.observe(view)   # in observe
        tables = pt.apply(tables)              # before planning
    """

    def __init__(self, memory: float = 50.0):
        self.memory = float(memory)
        self.drafting = self.idle = None   # averaged seconds per step; None before the first such step

    def observe(self, view) -> None:
        t = view.measured_policy_s
        if not t:   # not paid (0.0), or before verification (None)
            return
        if view.draft_forwards:
            self.drafting = t if self.drafting is None else self.drafting + (t - self.drafting) / self.memory
        else:
            self.idle = t if self.idle is None else self.idle + (t - self.idle) / self.memory

    def apply(self, costs):
        if self.drafting is None and self.idle is None:
            return costs
        idle = self.idle or 0.0
        extra = max((idle if self.drafting is None else self.drafting) - idle, 0.0)
        if costs.pad is None:   # one more (zero) position than the tables hold: keep_drafting's clamp lands on 0
            k = (costs.verify.size - 1) // max(costs.draft.size - 1, 1)
            pad = np.zeros(k + 1)
        else:
            pad = np.array(costs.pad, float)
        pad[0] += extra
        return Tables(costs.verify + idle, costs.draft, pad)


class CostAwareDepth:
    """`uniform_depth` with the view's cost model corrected online: `depth(view, kmax)` in plan,
    `observe(view, accepted)` in observe (batch_scaled and confidence use it).

    Acceptance: one level for the batch, the running requests' accepted drafts per verified draft token
    (accepted + rejections), shrunk toward all requests' rate (`prior_tokens` pseudo-tokens; that rate starts at
    `prior`, by default view.acceptance_prior (engine.acceptance_prior, 0.7: a warm start where the pair's rate
    is known), and forgets with a memory of `memory` drafted tokens). (A level raised by one standard error, to
    keep exploring, lost up to 7 % on short runs, which it starts deeper, on the development draws.)
    The engine's per-row estimate (view.acceptance) forgets by 0.8 a step: at batch 1, three rejections in a
    row put it below what a draft costs, no draft is made after that, and it never recovers (measured: 0.77 of
    fixed depth 2 on a held-out cell, c208 of seed 2029). This level rests on the requests' whole histories.
    Probing (`probe`, standard errors): while all requests' rate rests on fewer verified drafts than max(batch,
    PROBE_TOKENS = 64) beyond its pseudo-tokens (it forgets only as drafts are made), for at most PROBE_ROUNDS (4)
    steps a run, where the level says no draft pays but the level raised by `probe` standard errors (sqrt(level
    (1-level) / trials), trials = the running requests' verified drafts + `prior_tokens`) says one would, the
    batch drafts one token per row this step. Without it a batch whose prior level says no draft pays never
    drafts, so never learns a higher one (c125 of seed 2030: a = 0.92 at batch 159, 0.80 of fixed depth 2). A
    probe gives every row a verified draft: at most a few probes per run, at its start. (One batch's worth was the
    limit until 2026-12-01: a first step with 1 of 14 drafts accepted at a = 0.39 then stopped drafting for the
    whole run, c152 of seed 2035, 0.914 of fixed depth 1. Four batches' worth, tried next, probed 5 steps of a
    16-step closed batch of 300 near the break-even: 0.987 of `none`. Gated on the running requests' evidence
    instead, a level near the break-even probed every other step, c157 of seed 2031: 0.961 of `none`; and a stream
    re-probed at each turnover, where the draft's catch-up after many idle steps made each probe cost ~1 % of the
    run, c34.)
    `drain`: once no request is left to join (view.requests_left == 0), the depth that finishes the batch
    soonest, at per-request rates shrunk toward the level by how much the rows really differ (`shrunk_rates`),
    so that one row unlucky by chance does not set the depth of a batch whose rows are alike.
    `positions` (default on): the level is corrected per draft position by `PositionFactors` (accepted /
    expected tokens at each position, over all requests, forgetting like the level's pool): a draft whose
    later guesses fail more often than its first is not priced at its average rate (the `decay` cells of
    experiments/robustness).
    `catch_up`: rows whose draft lags (view.draft_lag: they did not draft for a while) draft at a depth > 0 only
    if its gain over the steps it is expected to go on pays for the draft's catch-up, or that costs at most one
    idle step (`_catch_up`); on thin evidence, and in a probe, only as many of them as one idle step's time
    catches up. Whether the engine pads the catch-up is learnt from the catch-ups paid (`CatchUpPadding`)."""

    def __init__(self, drain: bool = True, prior: float | None = None, prior_tokens: float = 10.0,
                 memory: float = 2000.0, probe: float = 2.0, positions: bool = True, idle_replan: int = 0,
                 policy_time: bool = False, catch_up: bool = False, predictive: bool = False,
                 position_prior: float = 20.0, position_optimism: float = 2.0, makespan: bool = False):
        self.drain = drain
        self.makespan = makespan
        self.position_prior, self.position_optimism = position_prior, position_optimism
        self.predictive = predictive
        self.catch_up = catch_up
        self.prior, self.prior_tokens, self.memory, self.probe = prior, prior_tokens, memory, probe
        self.positions = positions
        self.idle_replan = idle_replan
        self.policy_time = policy_time
        self.reset()

    def reset(self):
        self._costs = StepCost()
        self._calib = CostCalibration()
        self._seq = PerRequest(2)   # accepted drafts, rejections (trials = their sum)
        self._pool = None   # all requests' [accepted, rejected], forgetting; from the prior at the first step
        self._pos = PositionFactors(self.position_prior, self.position_optimism)
        self._level = None   # the level the last depth was priced at
        self._probes = 0   # probe steps so far
        self._idle = IdleReplan(self.idle_replan)
        self._ptime = PolicyTime()
        self.held = None   # rows not to draft this step (`_catch_up`), or None
        self.margin = None   # where the last depth drafts: (its cost tables, its predicted goodput in tokens / s,
        #                      the acceptance of each draft position at the level)
        self._pad = CatchUpPadding()

    def _start(self, view) -> None:
        if self._pool is None:
            p = view.acceptance_prior if self.prior is None else self.prior
            self._pool = np.array([p, 1.0 - p]) * self.prior_tokens

    def level(self, view) -> tuple[float, float]:
        """The batch's acceptance level (see the class) and the trials it rests on (pseudo-tokens included)."""
        self._start(view)
        st = self._seq.align(view.request_ids)
        P = self.prior_tokens
        trials = float(st.sum()) + P
        return min((float(st[:, 0].sum()) + P * self._pool[0] / self._pool.sum()) / trials, 0.999), trials

    def depth(self, view, kmax: int) -> int:
        self.held = None
        self.margin = None
        if kmax <= 0:
            return 0
        if self._idle.skip(view):
            return 0
        k = self._best_depth(view, kmax)
        self._idle.record(view, k > 0)
        if self.catch_up:
            self._pad.planned(view, np.full(view.batch_size, k > 0) if self.held is None else ~self.held & (k > 0))
        return k

    def _best_depth(self, view, kmax: int) -> int:
        costs = self._calib.correct(self._costs.update(view, kmax))
        if self.policy_time:
            costs = self._ptime.apply(costs)
        level, trials = self.level(view)
        self._level = level
        a = np.full(view.batch_size, level)
        f = self._pos.factor(kmax) if self.positions else None
        t = trials if self.predictive else None
        if self.drain and view.requests_left == 0:
            st = self._seq.align(view.request_ids)
            rest = (view.remaining, shrunk_rates(st[:, 0], st[:, 1], a), f, t)
        else:
            rest = (None, None, f, t)
        # rows near their end draft less (the policies clip at `draft_caps`): priced so, but not while draining,
        # where the fluid max_i remaining_i / e_i of a batch that ends within a step or two is far too hopeful
        # (300 rows with ~6 tokens left at a = 0.95 drafted 5 deep to end in one step, and took 4)
        ends = draft_caps(view, kmax) if rest[0] is None else None
        k, g = uniform_depth(a, costs, kmax, *rest, ends=ends, spread=self.makespan and rest[0] is not None)
        if k and self.catch_up:
            k = self._catch_up(view, k, g, a, costs, rest, level)
        if k:   # what keep_drafting needs to price positions past k (`confidence`'s `extend`)
            self.margin = (costs, g, np.minimum(level * (np.ones(kmax) if f is None else np.asarray(f)), 0.999))
        if k == 0 and self.probe and may_probe(self._probes, self._pool.sum(), self.prior_tokens, view.batch_size):
            # thin evidence: would a draft pay at a level `probe` standard errors higher? then try one
            hi = min(level + self.probe * math.sqrt(level * (1.0 - level) / trials), 0.999)
            k = int(uniform_depth(np.full(view.batch_size, hi), costs, kmax, factors=f, ends=ends)[0] > 0)
            late = view.draft_lag > 2
            if k and self.catch_up and late.any():   # a probe catches up at most one idle step's worth of rows
                ok = catch_up_rows(view, late, float(costs.verify[0]), padded=self._padded())
                self.held = late & ~ok
                k = int(not self.held.all())
            self._probes += k
        return k

    def _catch_up(self, view, k, g, a, costs, rest, level) -> int:
        """`catch_up`: where rows' draft lags, they draft at depth k > 0 if its gain per step (verify[0] x (g_k /
        g_0 - 1) seconds) over the steps it is expected to go on (draining: till the batch ends, its longest row's
        remaining steps; else the lagging rows' mean) pays for their catch-up (`catch_up_pays`); on thin
        evidence (`thin_evidence`) only those with the most tokens left whose catch-up costs at most one idle
        step (`catch_up_rows`). The lagging rows that do not are `held` (a bool mask, else None); the others draft
        k (0 where all are held). `rest`: uniform_depth's (remaining, rates, factors, trials) of the plan."""
        n = view.batch_size
        late = view.draft_lag > 2
        if not late.any():
            return k
        g0 = uniform_depth(a, costs, 0, *rest)[1]
        t0 = float(costs.verify[0])
        rem = view.remaining
        e = float(_expected_tokens(np.array([level]), np.array([k]), *rest[2:])[0, 0])
        steps = float(rem.max() if rest[0] is not None else rem[late].mean()) / e   # draining: till the batch ends
        args = (None, self._padded())
        if not catch_up_pays(view, np.ones(n, bool), t0 * max(g / g0 - 1.0, 0.0), steps, *args, free_s=t0):
            ok = np.zeros(n, bool)
        elif thin_evidence(float(self._pool.sum()), self.prior_tokens, n):
            ok = catch_up_rows(view, late, t0, *args)
        else:
            return k
        self.held = late & ~ok
        return k if not self.held.all() else 0

    def _padded(self) -> bool:
        """Price the catch-up padded: as learnt from earlier catch-ups (`CatchUpPadding`), else as the verify fit
        says."""
        return self._pad.verdict(bool(self._calib.pad))

    def hold(self, depths: np.ndarray, floor: int = 0) -> np.ndarray:
        """depths with the rows `held` this step (`_catch_up`) at `floor` (e.g. a policy's min_depth)."""
        if self.held is not None and self.held.any():
            depths = np.where(self.held, np.minimum(depths, floor), depths)
        return depths

    def observe(self, view, accepted=None) -> None:
        if self.catch_up:
            self._pad.observe(view, self._calib)
        self._calib.observe(view, caught_up=self.catch_up and self._pad.caught_up)
        if self.policy_time:
            self._ptime.observe(view)
        if accepted is None:
            return
        drafted = view.drafted
        st = self._seq.align(view.request_ids)
        rejected = accepted < drafted
        st[:, 0] += accepted
        st[:, 1] += rejected
        if drafted.any():
            keep = math.exp(-float(drafted.sum()) / self.memory)
            self._start(view)
            self._pool = self._pool * keep + [accepted.sum(), rejected.sum()]
            if self.positions and self._level is not None:
                cols = np.arange(int(drafted.max()))[None, :]
                self._pos.forget(keep)
                self._pos.add(cols < np.minimum(drafted, accepted + 1)[:, None], cols < accepted[:, None],
                              np.full(drafted.size, self._level))


class ConfidenceCalibration:
    """What the draft's confidence c says about a token's acceptance, learnt online: Platt scaling,
    P(accepted | c) = sigmoid(a + b logit(c)), fitted to the verified drafts (accepted, and the rejection that
    ends a step; drafts after it were never verified) and shrunk toward the identity (a = 0, b = 1: a calibrated
    draft) by a ridge worth `prior` tokens. A draft may be under-confident (the shipped real pair: accepted 4.5-7
    times as often as its confidence says) or over-confident; a threshold on the raw confidence means a
    different acceptance for each. The tokens are kept as counts in `BINS` bins of logit(c) on [-LIM, LIM]
    (their centres stand for them) that forget with a memory of `memory` verified tokens; the fit is a few
    Newton steps from the last one, after each step that verified a draft.

        cal = ConfidenceCalibration(); cal.add(view.confidences, view.drafted, accepted); p = cal(c)
    """

    BINS, LIM = 28, 7.0

    def __init__(self, prior: float = 20.0, memory: float = 2000.0):
        self.prior = float(prior)
        self.memory = float(memory)
        w = 2.0 * self.LIM / self.BINS
        self.x = -self.LIM + w * (np.arange(self.BINS) + 0.5)
        self.n = np.zeros(self.BINS)   # verified tokens per bin (forgetting)
        self.acc = np.zeros(self.BINS)   # ... accepted
        self.a, self.b = 0.0, 1.0

    @classmethod
    def logit(cls, c: np.ndarray) -> np.ndarray:
        c = np.clip(c, 1e-6, 1.0 - 1e-6)
        return np.clip(np.log(c) - np.log1p(-c), -cls.LIM, cls.LIM)

    def __call__(self, c: np.ndarray) -> np.ndarray:
        """The acceptance probability of tokens drafted with confidence c (NaN stays NaN)."""
        return _sigmoid(self.a + self.b * self.logit(c))

    def add(self, confidences: np.ndarray | None, drafted: np.ndarray, accepted: np.ndarray) -> None:
        """A step's verified drafts: row i's positions below min(drafted, accepted + 1), accepted below
        `accepted`. confidences: [rows, max depth] (view.confidences)."""
        if confidences is None or not drafted.any():
            return
        cols = np.arange(confidences.shape[1])[None, :]
        seen = cols < np.minimum(drafted, accepted + 1)[:, None]
        c = confidences[seen]
        ok = ~np.isnan(c)
        if not ok.any():
            return
        at = np.minimum(((self.logit(c[ok]) + self.LIM) * (self.BINS / (2.0 * self.LIM))).astype(np.int64),
                        self.BINS - 1)
        keep = math.exp(-float(ok.sum()) / self.memory)
        self.n = self.n * keep + np.bincount(at, minlength=self.BINS)
        self.acc = self.acc * keep + np.bincount(at, (cols < accepted[:, None])[seen][ok], self.BINS)
        self._fit()

    def _fit(self, steps: int = 4) -> None:
        """Newton on the ridge-penalised log-likelihood (penalty prior/8 x ((a)^2 + (b - 1)^2): Fisher
        information of `prior` tokens at p = 1/2 spread over the scale's both parameters), each step halved
        until the objective does not fall. A full step from a fit of nearly separated tokens (all rejected below
        some confidence, all accepted above) can overshoot to where the sigmoid saturates, and plain Newton then
        runs away, settling at a = 52, b = 120 on c146 of robustness draw 2065: a step function of the confidence (an
        overflow in exp)."""
        lam = self.prior / 8.0
        a, b, x, n, acc = self.a, self.b, self.x, self.n, self.acc

        def objective(a, b):
            z = a + b * x
            return float(acc @ -np.logaddexp(0.0, -z) + (n - acc) @ -np.logaddexp(0.0, z)) \
                - 0.5 * lam * (a * a + (b - 1.0) ** 2)

        f = objective(a, b)
        for _ in range(steps):
            p = _sigmoid(a + b * x)
            r = acc - n * p
            w = n * p * (1.0 - p)
            g0, g1 = float(r.sum()) - lam * a, float(r @ x) - lam * (b - 1.0)
            h00, h01, h11 = float(w.sum()) + lam, float(w @ x), float(w @ (x * x)) + lam
            det = h00 * h11 - h01 * h01
            da, db = (h11 * g0 - h01 * g1) / det, (h00 * g1 - h01 * g0) / det
            for _ in range(30):   # concave objective: a short enough step along the Newton direction gains
                f_new = objective(a + da, b + db)
                if f_new >= f - 1e-12 * abs(f):
                    break
                da, db = 0.5 * da, 0.5 * db
            a, b, f = a + da, b + db, f_new
            if abs(da) + abs(db) < 1e-6:
                break
        self.a, self.b = a, b


def _sigmoid(z: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-z)); exp's overflow for z below about -709 is the exact limit 0, not a warning."""
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-z))


def shrunk_rates(accepted: np.ndarray, rejected: np.ndarray, level: np.ndarray) -> np.ndarray:
    """Per-row acceptance estimates for rows that may really differ: the batch's level (the mean of `level`,
    e.g. view.acceptance, the estimate the policy uses anyway) plus each row's own deviation from the pooled
    rate in its counts (accepted / (accepted + rejected)), shrunk by the empirical-Bayes factor
    tau^2 / (tau^2 + sigma_i^2): tau^2 the spread between rows beyond what the counts' binomial noise sigma_i^2
    explains (by two standard errors of the spread's estimate, which few rows make loose). Rows that differ
    only by chance (and a single row) all get the level."""
    level = float(np.mean(level))
    n = accepted + rejected
    seen = n > 0
    if seen.sum() < 2:
        return np.full(n.shape, level)
    pooled = float(accepted[seen].sum() / n[seen].sum())
    rate = np.where(seen, accepted / np.maximum(n, 1.0), pooled)
    noise = pooled * (1.0 - pooled) / np.maximum(n, 1.0)
    m = int(seen.sum())   # the spread must exceed the noise by two standard errors of a variance of m rows
    tau2 = max(float(np.var(rate[seen]) - noise[seen].mean() * (1.0 + 2.0 * math.sqrt(2.0 / (m - 1)))), 0.0)
    shrink = np.where(seen, tau2 / (tau2 + noise + 1e-12), 0.0)
    return np.clip(level + shrink * (rate - pooled), 0.0, 0.999)


class CostAwarePolicy(Policy):
    """Base of policies that price their depth with `CostAwareDepth` (`self._depth`): it is rebuilt on
    reset and fed the measured step costs in observe; `self.drain`, `self.probe` and `self.positions` pass
    on. The subclass sets its own parameters, then calls this __init__ with the shared ones (it validates
    them and resets)."""

    def __init__(self, max_depth: int, use_budget: bool, drain: bool, probe: float = 2.0, positions: bool = True,
                 idle_replan: int = 64, policy_time: bool = True, catch_up: bool = True, predictive: bool = False,
                 position_prior: float = 20.0, position_optimism: float = 2.0, drain_makespan: bool = False):
        self.max_depth = as_int(max_depth, "policy.max_depth", min=0)
        self.drain_makespan = as_bool(drain_makespan, "policy.drain_makespan")
        self.position_prior = as_float(position_prior, "policy.position_prior", min=0)
        self.position_optimism = as_float(position_optimism, "policy.position_optimism", min=0)
        self.predictive = as_bool(predictive, "policy.predictive")
        self.use_budget = bool(use_budget)
        self.drain = as_bool(drain, "policy.drain")
        self.probe = as_float(probe, "policy.probe", min=0)
        self.positions = as_bool(positions, "policy.positions")
        self.idle_replan = as_int(idle_replan, "policy.idle_replan", min=0)
        self.policy_time = as_bool(policy_time, "policy.policy_time")
        self.catch_up = as_bool(catch_up, "policy.catch_up")
        self.reset()

    def cap(self, view) -> int:
        """The deepest depth this step may plan: the policy's and the engine's max_depth."""
        return min(self.max_depth, view.max_depth)

    def finish(self, depths: np.ndarray, view) -> np.ndarray:
        """A plan's last step: no row past its request's end (`draft_caps`), then within the engine's token cap
        (`fit_token_cap`)."""
        return fit_token_cap(np.minimum(depths, draft_caps(view, self.cap(view))), view)

    def reset(self):
        self._depth = CostAwareDepth(self.drain, probe=self.probe, positions=self.positions,
                                     idle_replan=self.idle_replan, policy_time=self.policy_time,
                                     catch_up=self.catch_up, predictive=self.predictive,
                                     position_prior=self.position_prior, position_optimism=self.position_optimism,
                                     makespan=self.drain_makespan)

    def observe(self, view, accepted):
        self._depth.observe(view, accepted)


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
