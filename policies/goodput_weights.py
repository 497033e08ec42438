"""goodput's weights: what a row's token is worth this step, beyond one token (None: every token alike)."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np

from .kit import kernels, row_cost, search
from .kit.kernels import _I64



class Stream:
    """What the run's admissions say: whether it was a closed batch at its first plan (`closed`), the steps since a
    request last joined (`quiet`), the largest batch so far (`max_n`), and a stream's saturation at its last
    admission (`saturated`: the batch full on 90 % of the steps until then)."""

    def __init__(self):
        self.closed = self.saturated = None
        self.max_id, self.quiet, self.max_n = -1, 0, 0
        self._open_steps = self._full_steps = 0

    def update(self, view, ids=None, n=None, top=None) -> None:
        """One step's admissions (`ids`, `n`: view.request_ids and batch_size, where the caller read them; `top`:
        int(ids.max(initial=-1)), where the caller has it, e.g. `PerRequest.top`)."""
        left, n = view.requests_left, view.batch_size if n is None else n
        if self.closed is None:
            self.closed = left == 0
        if top is None:
            ids = view.request_ids if ids is None else ids
            d = ids.dtype
            compiled = search.COMPILED and (d is _I64 or d == np.int64)
            top = kernels.max_id(ids) if compiled else int(ids.max(initial=-1))
        if top > self.max_id:
            self.max_id, self.quiet = top, 0
        else:
            self.quiet += 1
        if n > self.max_n:
            self.max_n = n
        if left:   # a stream before its last admission: steps it ran, steps at its largest batch
            self._open_steps += 1
            self._full_steps += n >= self.max_n
        elif self.saturated is None and not self.closed:
            self.saturated = self._full_steps >= 0.9 * self._open_steps


def tokens_per_step(S: np.ndarray, dbar: float | None) -> np.ndarray:
    """Each row's expected tokens per step at the depth the drafted rows got last step (`dbar`; all of K before)."""
    n, K = S.shape
    d = K if dbar is None else min(dbar, K)
    lo = int(d)
    if search.COMPILED and S.dtype == np.float64:
        return kernels.tokens_per_step(S, lo, float(d - lo))   # the same operations, compiled
    c = np.concatenate([np.zeros((n, 1)), np.cumsum(S, axis=1)], axis=1)
    return 1.0 + c[:, lo] + (d - lo) * (c[:, min(lo + 1, K)] - c[:, lo])


def slot_weights(S0: np.ndarray, dbar: float | None) -> np.ndarray:
    """While requests may still join: a token of row i frees its slot 1 / e_i steps sooner (e_i its expected
    tokens per step, from S0: not cut where the request ends), and a freed slot is worth what the batch's average
    row makes in it, so a row's tokens are worth mean(e) / e_i (scaled to at most 1): a sure row is not drafted
    deep beside slow ones whose steps that lengthens. Minimising a stream's time per request gives the same."""
    if search.COMPILED and S0.dtype == np.float64:
        d = S0.shape[1] if dbar is None else min(dbar, S0.shape[1])
        return kernels.slot_weights(S0, int(d), float(d - int(d)))   # the same operations, compiled
    w = 1.0 / tokens_per_step(S0, dbar)
    return w / float(w.max())


class RowCost:
    """`kit.row_cost` cached per (batch, 2 % of mean context, cost model), as StepCost's tables are."""

    def __init__(self, size: int = 512):
        self.size, self._cache = size, {}

    def __call__(self, cost, ctx: np.ndarray, mean: float | None = None, bucket: int | None = None) -> float:
        """`mean`: float(ctx.mean()) where the caller has it (StepCost.mean), `bucket`: int(math.log1p(mean) x 50)
        where it has that too (StepCost.key[2]; read only with `mean`)."""
        if mean is None:
            mean, ok = kernels.int_mean(ctx) if search.COMPILED and ctx.dtype == np.int64 else (0.0, False)
            mean, bucket = mean if ok else float(ctx.mean()), None   # (the same value, compiled)
        key = (ctx.size, int(math.log1p(mean) * 50.0) if bucket is None else bucket, id(cost))
        c1 = self._cache.get(key)
        if c1 is None:
            if len(self._cache) >= self.size:
                self._cache.clear()
            c1 = self._cache[key] = row_cost(cost, ctx, mean)
        return c1


def time_weights(S, a, dbar, drafted, prior_strength, remaining, c1, verify0, spread=None, out=None):
    """Draining: a row's token is worth the seconds it saves. The batch's verify costs T(n) = c0 + c1 n (c1: one
    more row, `RowCost` x the calibration's scale; c0 = verify0 - n c1, fixed costs included). A row that finishes
    sooner leaves the batch 1 / e_i steps earlier per token (e_i its expected tokens per step), saving c1; the row
    that finishes last also ends the run, saving c0. Which row ends last is uncertain: P(last) ~ exp(-z^2 / 2), z
    the gap to the slowest row's expected steps in standard deviations (outcomes' variance e (e - 1), and the
    estimate's binomial error over the row's `drafted` tokens + `prior_strength`). Returns (weights, the least
    chance of a row to end the run, the fixed share c0 / verify0 of a step). `spread`: `kernels.time_spread`'s
    (e, exponent) of S, computed already (then a, drafted and prior_strength are not read). `out` (compiled): two
    float arrays of n, the chances and the weights (the weights returned are the second)."""
    n, K = S.shape
    c0 = max(verify0 - n * c1, 0.0)
    if search.COMPILED and (spread is not None or S.dtype == a.dtype == np.float64):   # the same operations,
        if spread is None:
            d = K if dbar is None else min(dbar, K)
            spread = kernels.time_spread(S, a, int(d), float(d - int(d)), drafted, prior_strength, remaining)
        e, u = spread
        if out is None or len(out[0]) != n or len(out[1]) != n:                       # compiled around np.exp
            w, p_min = kernels.time_scale(np.exp(u), e, c1, c0)
        else:
            w = out[1]
            p_min = kernels.time_scale_into(np.exp(u, out[0]), e, c1, c0, w)   # (out positional: the same call)
        return w, p_min, c0 / max(verify0, 1e-300)
    d = K if dbar is None else min(dbar, K)
    e = tokens_per_step(S, dbar)
    dS = ((np.arange(K) + 1.0) * S)[:, :max(int(math.ceil(d)), 1)].sum(axis=1) / a   # de / da
    var_a = a * (1.0 - a) / (drafted + prior_strength)
    steps = remaining / e
    sd2 = remaining * (e - 1.0) / (e * e) + (steps / e * dS) ** 2 * var_a + 1.0
    last = int(np.argmax(steps))
    z = (steps - steps[last]) / np.sqrt(sd2 + sd2[last])
    p = np.exp(-0.5 * z * z)
    w = (c1 + c0 * p / p.sum()) / e
    return w / max(float(w.max()), 1e-300), float(p.min()), c0 / max(verify0, 1e-300)


def timed(view, stream: Stream, tail: str, after: int, drain: bool) -> tuple[bool, bool]:
    """(drained, timed): whether `drain_weights` drains, and whether it weighs by `time_weights`."""
    drained = drain and view.requests_left == 0 and (stream.closed or tail != "never")
    n = view.batch_size
    return drained, n >= 2 and (drained or bool(after and stream.quiet >= after and n < stream.max_n))


def drain_weights(view, stream: Stream, tail: str, after: int, drain: bool, S, S0, dbar, time_args, slot=None,
                  spread=None, mode=None, out=None):
    """The step's weights: draining (`drain`, no request left to join; `after` > 0, also once the batch shrank below
    its largest size and no request joined for that many steps), `time_weights`; a stream's tail (`tail`) drained
    always, never, or (balanced) where the batch was full until its last admission, else each token at the mean of
    the drain's weight and 1; while requests may still join, `slot_weights` (`slot`, `spread`, `mode`: `timed`'s,
    computed already; `out`: `time_weights`'). One row: None. Returns a namespace: w, drained, p_min and fixed
    (`time_weights`', where drained)."""
    drained, by_time = mode or timed(view, stream, tail, after, drain)
    if len(S0) < 2 or not by_time:   # one row: None; while requests may join: the slots'
        w = None if len(S0) < 2 else (slot_weights(S0, dbar) if slot is None else slot)
        return SimpleNamespace(w=w, drained=False, p_min=0.0, fixed=1.0)
    w, p_min, fixed = time_weights(S, *time_args(), spread, out)
    if drained and not stream.closed and tail == "balanced" and not stream.saturated:
        w = 0.5 * (w + 1.0)   # a latency-bound stream's tail: as much its requests' latency as the run's end
    return SimpleNamespace(w=w, drained=True, p_min=p_min, fixed=fixed)
