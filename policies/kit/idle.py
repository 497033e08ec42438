"""Idle replanning and catch-up: plans that draft nothing kept for a while, probes on thin evidence, and the
price of resuming rows whose draft fell behind."""
from __future__ import annotations

import math

import numpy as np

from . import kernels
from .kernels import _I64

COMPILED = True   # the catch-up's lag test compiled (kernels.masked_max); False: its numpy form (equal)


class IdleReplan:
    """Plans that draft nothing, kept without replanning (`idle_replan` of goodput, batch_scaled, confidence): after
    a plan that drafts nothing, the next 1, then 2, 4, ... (at most `most`) steps draft nothing too without a new
    plan, while the batch holds the same requests; a plan that drafts, or a change of rows, ends it at once.
    `left`: the steps the window has left (0: `skip` is False without a look at the view).

        if self._idle.skip(view): return zeros     # in plan, first
        ...; self._idle.record(view, bool(depths.any()))

    A plan is Python on the engine's critical path, ~0.2-0.6 ms a step: on the real backend with the shipped pair on
    this CPU, where no draft pays past batch 4, that was most of what these policies lost to `none`
    (experiments/real_pareto). The simulator does not charge a policy's time, so there it can only cost: up to
    `most` steps late to resume drafting while no request joins or leaves (0 = plan every step)."""

    def __init__(self, most: int):
        self.most = most
        self._ids, self._run, self.left = None, 0, 0   # the idle batch's requests, the window, steps left in it

    def skip(self, view) -> bool:
        if self.left and _same_ids(view.request_ids, self._ids):
            self.left -= 1
            return True
        return False

    def record(self, view, drafts: bool) -> None:
        if not self.most or drafts:
            self._run = self.left = 0
            return
        self._run = min(max(2 * self._run, 1), self.most)
        self.left, self._ids = self._run, np.array(view.request_ids)


def _same_ids(a: np.ndarray, b: np.ndarray) -> bool:
    """np.array_equal(a, b); int64 vectors compared as bytes (the same answer, a fraction of its time)."""
    if a.dtype == b.dtype == np.int64 and a.ndim == b.ndim == 1:
        return a.shape == b.shape and a.tobytes() == b.tobytes()
    return bool(np.array_equal(a, b))


PROBE_TOKENS = 64   # evidence is thin while it rests on fewer verified drafts than max(batch, this) ...


PROBE_ROUNDS = 4    # ... and a run probes at most this many steps


def thin_evidence(evidence: float, prior: float, batch: int) -> bool:
    """The evidence (verified drafts, `prior` pseudo-tokens included) below prior + max(batch, PROBE_TOKENS)."""
    return evidence < prior + max(batch, PROBE_TOKENS)


def may_probe(probes: int, evidence: float, prior: float, batch: int) -> bool:
    """The probe gate of goodput, batch_scaled and confidence: fewer than PROBE_ROUNDS probe steps so far, and
    thin evidence (`thin_evidence`)."""
    return probes < PROBE_ROUNDS and thin_evidence(evidence, prior, batch)


_BOOL = np.dtype(np.bool_)


def _lag_at_most(lag: np.ndarray, drafting: np.ndarray, most: int) -> bool:
    """Whether no row of `drafting` (bool mask) lags more than `most` tokens (true where none drafts)."""
    if COMPILED and lag.dtype == _I64 and drafting.dtype == _BOOL and lag.ndim == 1 and lag.shape == drafting.shape:
        top, count = kernels.masked_max(lag, drafting)   # one loop, the same integers
        return count == 0 or int(top) <= most
    lag = lag[drafting]
    return lag.size == 0 or int(lag.max()) <= most


def catch_up_s(view, drafting: np.ndarray, cost=None, padded: bool = False) -> float:
    """Seconds the draft's catch-up tokens add to a step's first draft forward over the rows `drafting` (bool
    mask): each row feeds its view.draft_lag tokens there instead of the 1-2 of a row that drafted the step
    before (its last draft and the bonus token), as `cost.draft_forward` prices them (default view.cost; the
    simulator's true cost pads as its clock does). `padded`: the engine pads every row of a forward to the
    largest context and query, so one lagging row makes every drafting row feed that many tokens. 0 where no
    drafting row lags more than 2 tokens."""
    every = view.draft_lag
    if _lag_at_most(every, drafting, 2):
        return 0.0
    lag = every[drafting]
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
    step's gain, and never resume) and one that ignores it resumes where a few steps' gain does not pay for it.
    So the catch-up is paid when what drafting saves per step (`gain_s`
    seconds, against not drafting) over the steps it is expected to go on (`steps`) covers it, or when it costs
    at most `free_s` (e.g. one idle step, what a probe may cost: a plan that drafts after a few idle steps
    resumes, instead of leaving its rows idle for good because their lag, and so the price of resuming, only
    grows while they wait).
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
    that budget a few rows' drafts, once verified, tell whether resuming the others pays. Returns a bool mask."""
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


class CatchUpPadding:
    """Whether the engine pads the draft's catch-up, learnt from the steps that paid one: a padded engine feeds every
    row of the draft's first forward the largest lag among them (backend=hf right-pads its draft input; the
    simulator with backend.pad_ragged), a ragged one each row its own. A policy whose verify fit cannot tell
    (batch_scaled and confidence plan one depth for every row, so padding never shows in their verify) priced the
    catch-up of rows with mixed lags ragged, and on a padded engine paid several times more than it planned.
    `planned(view, drafting)` in plan records both prices of the step's catch-up;
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

    def planned(self, view, drafting: np.ndarray, cost=None, lag=None) -> None:
        self._est = None   # (lag: view.draft_lag, where the caller read it this step)
        self.caught_up = not _lag_at_most(view.draft_lag if lag is None else lag, drafting, 2)
        if self.caught_up:
            self._est = (catch_up_s(view, drafting, cost, False), catch_up_s(view, drafting, cost, True))

    def planned_none(self) -> None:
        """`planned` for a step where no drafting row lags more than 2 tokens (or none drafts): no catch-up."""
        self._est = None
        self.caught_up = False

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
