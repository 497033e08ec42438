"""The step cost: lookup tables of the verify and draft forwards' seconds for the current batch, built from the
view's cost model, and the policy's own time priced into them."""
from __future__ import annotations

import functools
import math

import numpy as np

from . import kernels
from .kernels import _I64

COMPILED = True   # the small loops of as_padded, pad_extra and StepCost compiled (kernels); False: numpy form


@functools.lru_cache(maxsize=1024)
def _grid(n: int, dense: int = 32, points: int = 40) -> np.ndarray:
    """0..n exactly when small, else 0..dense plus a geometric grid up to n (for interpolation). Read-only,
    one array per argument (geomspace and unique cost ~0.1 ms, on the plan's critical path on backend=hf)."""
    if n <= dense + points:
        g = np.arange(n + 1, dtype=float)
    elif COMPILED:
        g = np.concatenate([np.arange(dense, dtype=float), _geometric(dense, n, points)])
    else:
        g = np.concatenate([np.arange(dense, dtype=float), np.unique(np.rint(np.geomspace(dense, n, points)))])
    g.flags.writeable = False
    return g


def _geometric(start: int, stop: int, num: int) -> np.ndarray:
    """np.unique(np.rint(np.geomspace(start, stop, num))) for 0 < start < stop, geomspace's operations spelled out
    (log10 of both ends, linspace's arange x step + start with its last point the stop, power of 10, the ends
    reset to start and stop), without its Python overhead; the distinct values in one loop where ascending."""
    ends = np.log10(np.array([float(start), float(stop)]))
    y = np.arange(0, num, dtype=float)
    y *= (ends[1] - ends[0]) / (num - 1)
    y += ends[0]
    y[-1] = ends[1]
    r = np.power(10.0, y)
    r[0], r[-1] = start, stop
    np.rint(r, out=r)
    out, ok = kernels.ascending_distinct(r)
    return out if ok else np.unique(r)


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
    model = ctx = mean = None   # the last update's cost model, contexts and float(ctx.mean()) (None: not computed)

    def __init__(self, cache: int = 512, pad_context: bool = False):
        self.key = None
        self.cache = cache
        self.pad_context = pad_context
        self._tables = {}
        self._von = False   # whether this step has a vpad (`_vpad`)
        self._vkey = self._vat = self._vval = None   # `_vpad`'s last key, its arguments and table (None: not built)
        self._depths = (None, None)   # `_vtable`'s drafts per depth: ((rows, kmax), n x arange(kmax + 1))

    def update(self, view, kmax: int, cost=None) -> "StepCost":
        """Tables for this step's batch from `cost` (default view.cost)."""
        cost = view.cost if cost is None else cost
        ctx = view.context_lens
        n = ctx.size
        ok = COMPILED and n and (ctx.dtype is _I64 or ctx.dtype == _I64) and ctx.ndim == 1
        if ok:   # `_mean_context` and both keys' buckets in one pass (the same values)
            ok, cbar, exact, top, vb, b = kernels.context_keys(ctx, _EXACT)
        if not ok:
            (cbar, top, exact), vb = _mean_context(ctx), None
            b = int(math.log1p(cbar) * 50.0)
        self.model, self.ctx, self.mean = cost, ctx, cbar if exact else None
        if self.pad_context:   # (`_vpad`'s key unchanged: its table holds, no call)
            same = vb is not None and self._vkey == (n, kmax, vb, id(cost))
            self._von = same or self._vpad(cost, ctx, kmax, top)
        key = (n, kmax, b, id(cost))
        if key == self.key:
            return self
        self.key = key
        hit = self._tables.get(key)
        if hit is None:
            if len(self._tables) >= self.cache:
                self._tables.clear()
            hit = self._tables[key] = self._build(cost, ctx, kmax, cbar)
        self.verify, self.draft, self.pad = hit
        return self

    @staticmethod
    def _build(cost, ctx: np.ndarray, kmax: int, cbar: float) -> tuple:
        """(verify, draft, pad) for contexts ctx (mean cbar) and drafts up to kmax a row (see the class)."""
        n = ctx.size
        X = n * kmax
        ms = _grid(n)
        pad = dt = None
        if getattr(cost, "pad_ragged", False):   # padded: the deepest row's depth p sets the verify
            V = np.array([cost.verify_time(ctx, np.full(n, p, np.int64)) for p in range(kmax + 1)])
            verify, pad = np.full(X + 1, V[0]), np.diff(V)
        else:
            xs = _grid(X)
            if hasattr(cost, "step_tables"):   # a CostModel: both tables in one call
                vt, dt = cost.step_tables(ctx, xs, cbar, ms)
            elif hasattr(cost, "verify_times"):   # the whole verify table in one call
                vt = cost.verify_times(ctx, xs)
            else:
                vt = np.array([cost.verify_time(ctx, np.full(n, x / n)) for x in xs])
            verify = _interp(X + 1, xs, vt) if xs.size != X + 1 else vt
        if dt is None:
            dt = (cost.draft_times(cbar, ms) if hasattr(cost, "draft_times") else
                  np.array([cost.draft_time(np.full(int(m), cbar)) if m else 0.0 for m in ms]))
        return verify, (_interp(n + 1, ms, dt) if ms.size != n + 1 else dt), pad

    @property
    def vpad(self):
        """vpad[p] (see the class), or None: built at its first read after the key of `_vpad` changed, from the
        arguments of the step that changed it (the same table as built then)."""
        if not self._von:
            return None
        if self._vval is None:
            self._vval = self._vtable(*self._vat)
        return self._vval

    def _vpad(self, cost, ctx: np.ndarray, kmax: int, top=None) -> bool:
        """Whether this step has a vpad: the verify with every row p deep at the batch's longest context, as an engine
        that pads ragged forwards runs it (the query and the KV to the longest row); not for a cost that pads
        already. Kept per (rows, kmax, 2 % of the longest context, cost model) while that holds. `top`: ctx.max()
        where the caller has it."""
        if getattr(cost, "pad_ragged", False) or ctx.size == 0:
            return False
        n, cmax = ctx.size, int(ctx.max() if top is None else top)
        key = (n, kmax, int(math.log1p(cmax) * 50.0), id(cost))
        if self._vkey != key:
            self._vkey, self._vat, self._vval = key, (cost, n, cmax, kmax), None
        return True

    def _vtable(self, cost, n: int, cmax: int, kmax: int) -> np.ndarray:
        """`vpad`'s table: n rows at context cmax, every row p deep for p = 0..kmax."""
        full = np.full(n, cmax, np.int64)
        if not hasattr(cost, "verify_times"):
            return np.array([cost.verify_time(full, np.full(n, p, np.int64)) for p in range(kmax + 1)])
        shape, totals = self._depths
        if shape != (n, kmax):   # (kept: the same drafts per depth while the batch's shape holds)
            totals = n * np.arange(kmax + 1, dtype=float)
            totals.flags.writeable = False
            self._depths = (n, kmax), totals
        return cost.verify_times(full, totals)


def _interp(m: int, xp: np.ndarray, fp) -> np.ndarray:
    """np.interp(np.arange(m), xp, fp) (compiled for float64 values: `kernels.interp_into`)."""
    if COMPILED and kernels.floats(xp, fp, nonempty=True) and xp.size == fp.size:
        out = np.empty(int(m))
        if kernels.interp_into(xp, fp, out):
            return out
    return np.interp(np.arange(m), xp, fp)


def _mean_context(ctx: np.ndarray) -> tuple[float, int | None, bool]:
    """The contexts' mean (0 for none), their max where computed with it (one compiled loop: the same integer sum),
    else None, and whether the mean is float(ctx.mean()) to the bit (at most 4096 values below 2^40: numpy's float
    sum of them is the exact integer sum; False in the numpy form)."""
    n = ctx.size
    if COMPILED and n and ctx.dtype == np.int64 and ctx.ndim == 1:
        lo, top, total = kernels.int_stats(ctx)
        return float(total) / n, top, n <= 4096 and -_EXACT < lo and top < _EXACT
    return (float(ctx.sum()) / n if n else 0.0), None, False


_EXACT = 2 ** 40   # (`_mean_context`: integers whose float sums are exact)


def row_cost(cost, ctx: np.ndarray, mean: float | None = None) -> float:
    """Seconds one more row at the batch's mean context adds to a verify without drafts (`cost`: a cost model
    such as view.cost; 0 for an empty batch): max(verify of n rows - verify of n - 1 rows, 0), both at the mean
    (`cost.row_verify_times` where it has it). `mean`: float(ctx.mean()) where the caller has it."""
    n = ctx.size
    if n == 0:
        return 0.0
    mean = float(ctx.mean()) if mean is None else mean
    rows = getattr(cost, "row_verify_times", None)
    if rows is not None:
        full, one_less = rows(mean, n)
        return max(float(full) - float(one_less), 0.0)
    c = np.full(n, mean)
    one_less = float(cost.verify_time(c[1:], np.zeros(n - 1))) if n > 1 else 0.0
    return max(float(cost.verify_time(c, np.zeros(n))) - one_less, 0.0)


class Tables:
    """Step-time tables in StepCost's layout: `verify`, `draft`, and `pad` (None, or pad[p]: the seconds that
    opening draft position p adds to a padded verify, whatever the number of rows drafting there)."""

    def __init__(self, verify: np.ndarray, draft: np.ndarray, pad: np.ndarray | None = None):
        self.verify, self.draft, self.pad = verify, draft, pad


def every_row_deep(verify: np.ndarray, n: int) -> np.ndarray:
    """A StepCost verify table (x drafts over n rows) read at x = n p, every row p deep, for p = 0, 1, ... (the
    last point repeated where the table ends): what a verify that pads every row to the deepest costs per depth."""
    return verify[np.minimum(np.arange(verify.size // max(n, 1) + 1) * n, verify.size - 1)]


def as_padded(costs, n: int) -> Tables:
    """`costs` (StepCost-like tables for a batch of n rows) priced as if the verify pads every row to the deepest
    one: pad[p] = what a whole position p adds to the verify (n more tokens), the verify without drafts otherwise.
    Tables that already pad are returned as they are. A row drafting past its batch's depth then pays for the
    batch's position it opens, which an engine that pads ragged forwards charges and one that does not charges
    less: a price that never falls short of the engine's."""
    if costs.pad is not None and len(costs.pad):
        return costs
    v = costs.verify
    if COMPILED and kernels.floats(v, nonempty=True) and n >= 0:
        flat, pad = np.empty(v.size), np.empty(v.size // max(int(n), 1))
        kernels.padded_tables(v, int(n), flat, pad)   # the same values, one loop
        return Tables(flat, costs.draft, pad)
    return Tables(np.full_like(costs.verify, costs.verify[0]), costs.draft, np.diff(every_row_deep(costs.verify, n)))


def pad_extra(costs, drafted: np.ndarray, view=None) -> float:
    """What a verify would cost more than the ragged prediction if every row were padded to the deepest
    row's drafts (StepCost tables, uncorrected; 0 when the rows drafted alike). `view` given (in observe, after
    verification; `StepCost.pad_context`): padded as an engine that pads a ragged batch runs it, every row's query
    to the deepest row's and its context (KV) to the longest row's, against view.predicted_verify_s (the view's
    cost at the rows' own contexts and drafts; both shapes and the padded price in one call where the cost model has
    `padded_verify_time`); a step that drafted nothing pads its contexts too."""
    n = drafted.size
    fast = COMPILED and n and (drafted.dtype is _I64 or drafted.dtype == np.int64) and drafted.ndim == 1
    predicted = None if view is None else view.predicted_verify_s   # None before verification
    if fast and predicted is not None:
        ctx, cost = view.context_lens, view.cost
        padded = getattr(cost, "padded_verify_time", None)   # (the shapes and the padded verify in one call)
        padded = None if padded is None else padded(ctx, drafted)
        if padded is not None:
            return float(padded[1] - predicted) if padded[0] else 0.0
        if (ctx.dtype is _I64 or ctx.dtype == np.int64) and ctx.shape == drafted.shape:   # (one compiled loop)
            flat, k, top = kernels.pad_shape(drafted, ctx)
            if flat:
                return 0.0
            return float(_padded_verify(cost, n, top, k) - predicted)
    if fast:   # min, max and sum in one loop (the same integers)
        dmin, k, dsum = kernels.int_stats(drafted)
        k = max(int(k), 0)
    else:
        k = int(drafted.max(initial=0))
    if predicted is not None and n:
        ctx = view.context_lens
        if fast and ctx.dtype == np.int64 and ctx.ndim == 1:
            cmin, top, _ = kernels.int_stats(ctx)
        else:
            cmin, top, dmin = ctx.min(), ctx.max(), drafted.min()
        top = int(top)
        if n == 1 or (int(cmin) == top and int(dmin) == k):   # nothing to pad: the same shapes as predicted
            return 0.0                                        # (one cost-model call less)
        return float(view.cost.verify_time(np.full(n, top, np.int64), np.full(n, k, np.int64)) - predicted)
    if n == 0 or k == 0:   # nothing drafted: nothing to pad (and a plan that drafts nothing may build no tables)
        return 0.0
    v = costs.verify
    return float(v[min(n * k, v.size - 1)] - v[min(int(dsum if fast else drafted.sum()), v.size - 1)])


_PADDED = {}   # `_padded_verify`'s seconds: (id(cost), rows, context, drafts) -> (the cost model, seconds)


def _padded_verify(cost, n: int, top: int, k: int) -> float:
    """float(cost.verify_time(np.full(n, top), np.full(n, k))) (int64), the verify of n rows each at context `top`
    with `k` drafts (`cost.uniform_verify_time`, the same value, where the cost model has it), kept per cost model
    and shape: a cost model is pure (docs/plugins.md), and a steady batch pads to the same shape step after step.
    (Each entry holds its cost model: an id is not reused while its entry lives.)"""
    key = (id(cost), n, top, k)
    hit = _PADDED.get(key)
    if hit is None or hit[0] is not cost:
        if len(_PADDED) >= 4096:
            _PADDED.clear()
        uniform = getattr(cost, "uniform_verify_time", None)
        hit = _PADDED[key] = (cost, float(uniform(n, top, k)) if uniform is not None else
                              float(cost.verify_time(np.full(n, top, np.int64), np.full(n, k, np.int64))))
    return hit[1]


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

    def terms(self) -> tuple[bool, float, float]:
        """(whether anything was measured, the seconds `apply` adds to every verify, those it adds to pad[0])."""
        if self.drafting is None and self.idle is None:
            return False, 0.0, 0.0
        idle = self.idle or 0.0
        return True, idle, max((idle if self.drafting is None else self.drafting) - idle, 0.0)

    def apply(self, costs):
        measured, idle, extra = self.terms()
        if not measured:
            return costs
        if costs.pad is None:   # one more (zero) position than the tables hold: keep_drafting's clamp lands on 0
            k = (costs.verify.size - 1) // max(costs.draft.size - 1, 1)
            pad = np.zeros(k + 1)
        else:
            pad = np.array(costs.pad, float)
        pad[0] += extra
        return Tables(costs.verify + idle, costs.draft, pad)
