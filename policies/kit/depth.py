"""One depth for the whole batch, priced with the calibrated cost model (`CostAwareDepth`), and the base of the
policies that use it (`CostAwarePolicy`)."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np

from specdepth.errors import as_bool, as_float, as_int
from specdepth.policy import Policy

from . import kernels, search
from .acceptance import PositionFactors, expected_tokens, shrunk_rates
from .calibration import CostCalibration
from .cost import PolicyTime, StepCost, Tables
from .drain import FinishWork, finish_best
from .idle import CatchUpPadding, IdleReplan, catch_up_pays, catch_up_rows, may_probe, thin_evidence
from .options import node
from .search import draft_caps, fit_token_cap, uniform_depth
from .state import PerRequest

COMPILED = True   # CostAwareDepth's per-step chains in one compiled call each (`_fused_depth`, `_fused_counts`) and
#                   CostAwarePolicy.finish in one loop, where search.COMPILED too; False: the blocks one by one (equal)


class CostAwareDepth:
    """One depth for the whole batch: `uniform_depth` at the batch's acceptance level, priced with the view's cost
    model corrected online (`CostCalibration`). `depth(view, kmax)` in plan, `observe(view, accepted)` in observe.

    Level: the running requests' accepted drafts per verified draft token, shrunk toward all requests' rate with
    `prior_tokens` pseudo-tokens (that rate starts at `prior`, default view.acceptance_prior, and forgets with a
    memory of `memory` drafted tokens). `positions`: the level corrected per draft position (`PositionFactors`,
    `position_prior` pseudo-tokens, raised by `position_optimism` standard errors).
    `drain`: once no request is left to join, the depth that finishes the batch soonest, each row at its own rate
    shrunk toward the level (`shrunk_rates`), the run ending with the expected last row (`uniform_depth` spread).
    `probe` (standard errors, 0 = off): on thin evidence (`may_probe`), where the level says no draft pays but the
    level raised by `probe` standard errors says one would, one token per row.
    `catch_up`: rows whose draft lags draft only where the depth's gain pays for their catch-up (`catch_up_pays`;
    on thin evidence, one idle step's worth, `catch_up_rows`); the others are `held` this step.
    `idle_replan` (`IdleReplan`) and `policy_time` (`PolicyTime`) as their blocks say."""

    def __init__(self, drain: bool = True, probe: float = 2.0, positions: bool = True, position_prior: float = 20.0,
                 position_optimism: float = 2.0, idle_replan: int = 0, policy_time: bool = False,
                 catch_up: bool = False, prior: float | None = None, prior_tokens: float = 10.0,
                 memory: float = 2000.0):
        self.drain, self.probe, self.catch_up = drain, probe, catch_up
        self.positions, self.position_prior, self.position_optimism = positions, position_prior, position_optimism
        self.idle_replan, self.policy_time = idle_replan, policy_time
        self.prior, self.prior_tokens, self.memory = prior, prior_tokens, memory
        self.reset()

    def reset(self):
        self._costs = StepCost()
        self._calib = CostCalibration()
        self._seq = PerRequest(accepted=0.0, rejected=0.0)   # verified drafts: trials = their sum
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
        self._top = None   # the largest draft lag, where the compiled plan read it (`depth`)
        self._finish = FinishWork()   # the drain's buffers (`_fused_depth`)

    def _start(self, view) -> None:
        if self._pool is None:
            p = view.acceptance_prior if self.prior is None else self.prior
            self._pool = np.array([p, 1.0 - p]) * self.prior_tokens

    def level(self, view) -> tuple[float, float]:
        """The batch's acceptance level (see the class) and the trials it rests on (pseudo-tokens included)."""
        self._start(view)
        st = self._seq.align(view.request_ids)
        P = self.prior_tokens
        if search.COMPILED and st.array.dtype == np.float64:   # (sums of counts: exact in any order)
            total, acc = kernels.count_sums(st.array, 0)   # (accepted is the first field)
        else:
            total, acc = float(st.array.sum()), float(st.accepted.sum())
        trials = total + P
        pool = self._pool.tolist()
        return min((acc + P * pool[0] / (pool[0] + pool[1])) / trials, 0.999), trials

    def depth(self, view, kmax: int) -> int:
        self.held = None
        self.margin = None
        if kmax <= 0:
            return 0
        if self._idle.skip(view):
            return 0
        self._top = None
        k = self._best_depth(view, kmax)
        self._idle.record(view, k > 0)
        if self.catch_up:
            if k == 0 or (self.held is None and self._top is not None and self._top <= 2):
                self._pad.planned_none()   # no drafting row lags (`planned`'s verdict without its reads)
            else:
                self._pad.planned(view, np.full(view.batch_size, True) if self.held is None else ~self.held)
        return k

    def _best_depth(self, view, kmax: int) -> int:
        k = _fused_depth(self, view, kmax) if COMPILED and search.COMPILED else None
        if k is not None:
            return k
        costs = self._calib.correct(self._costs.update(view, kmax))
        if self.policy_time:
            costs = self._ptime.apply(costs)
        level, trials = self.level(view)
        self._level = level
        a = np.full(view.batch_size, level)
        f = self._pos.factor(kmax) if self.positions else None
        if self.drain and view.requests_left == 0:
            st = self._seq.align(view.request_ids)
            rest = (view.remaining, shrunk_rates(st.accepted, st.rejected, a), f)
        else:
            rest = (None, None, f)
        # rows near their end draft less (the policies clip at `draft_caps`): priced so, but not while draining,
        # where the fluid max_i remaining_i / e_i of a batch that ends within a step or two is far too hopeful
        ends = draft_caps(view, kmax) if rest[0] is None else None
        k, g = uniform_depth(a, costs, kmax, *rest, ends=ends, spread=rest[0] is not None)
        if k and self.catch_up:
            k = self._catch_up(view, k, g, a, costs, rest, level)
        if k:   # what keep_drafting needs to price positions past k (`confidence`'s `extend`)
            self.margin = (costs, g, np.minimum(level * (np.ones(kmax) if f is None else np.asarray(f)), 0.999))
        if k == 0 and self.probe and may_probe(self._probes, self._pool.sum(), self.prior_tokens, view.batch_size):
            k = self._probe(view, costs, kmax, level, trials, f, ends)
        return k

    def _probe(self, view, costs, kmax, level, trials, f, ends) -> int:
        """Thin evidence: 1 where a draft would pay at a level `probe` standard errors higher, else 0; a probe
        catches up at most one idle step's worth of lagging rows (the others `held`)."""
        hi = min(level + self.probe * math.sqrt(level * (1.0 - level) / trials), 0.999)
        k = int(uniform_depth(np.full(view.batch_size, hi), costs, kmax, factors=f, ends=ends)[0] > 0)
        late = view.draft_lag > 2
        if k and self.catch_up and late.any():
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
        k (0 where all are held). `rest`: uniform_depth's (remaining, rates, factors) of the plan."""
        n = view.batch_size
        late = view.draft_lag > 2
        if not late.any():
            return k
        g0 = uniform_depth(a, costs, 0, *rest)[1]
        t0 = float(costs.verify[0])
        rem = view.remaining
        e = float(expected_tokens(np.array([level]), np.array([k]), rest[2])[0, 0])
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
        if COMPILED and search.COMPILED and _fused_counts(self, view, accepted, drafted, st):
            return
        total, acc, rej, deep = self._tally(accepted, drafted, st)
        if total:
            keep = math.exp(-float(total) / self.memory)
            self._start(view)
            p0, p1 = self._pool.tolist()
            self._pool = np.array([p0 * keep + acc, p1 * keep + rej])
            if self.positions and self._level is not None:
                self._pos.forget(keep)
                self._pos.add_counts(deep, np.minimum(drafted, accepted + 1), accepted,
                                     np.full(drafted.size, self._level))

    @staticmethod
    def _tally(accepted, drafted, st):
        """st.accepted += accepted, st.rejected += (accepted < drafted); the step's drafted, accepted and rejected
        totals and its deepest draft (compiled for integer counts: `kernels.tally`)."""
        if search.COMPILED and accepted.dtype.kind == drafted.dtype.kind == "i":
            return kernels.tally(accepted, drafted, st.accepted, st.rejected)
        rejected = accepted < drafted
        st.accepted += accepted
        st.rejected += rejected
        return int(drafted.sum()), accepted.sum(), rejected.sum(), int(drafted.max(initial=0))


def _fused_depth(d: CostAwareDepth, view, kmax: int) -> int | None:
    """`CostAwareDepth._best_depth` with its chain (StepCost.update, CostCalibration.correct, PolicyTime.apply,
    `level`, the position factors, draft_caps, uniform_depth, the catch-up's lag test and the margin) in one
    compiled call, the same operations: `kernels.uniform_plan` while rows may still join, else
    `kernels.drain_plan`, the drain's expected maxima (`search._steps_to_finish`) and `kernels.ratio_best`. The
    catch-up (where a row lags) and the probe as `_best_depth` runs them. None where the calls do not apply (a
    single row while rows may join, no position factors, a padded verify fit, other dtypes): `_best_depth` runs
    the blocks."""
    args = _fused_args(d, view, kmax)
    if args is None:
        return None
    rem, n = args[-2], args[-2].size
    if d.drain and view.requests_left == 0:
        got = _drain_depth(d, args, kmax, n)
        if got is None:
            return None
        k, g, level, trials, costs, rate, rates = got
    else:
        buf, _ = _plan_buffer(args, kmax, 0)
        k, g, level, trials, d._top, ok = kernels.uniform_plan(*args, buf)
        if not ok or level != level:
            return None
        costs, rate, _ = _plan_views(buf, args, kmax)
        rates = None
    d._level = level
    if k and d.catch_up and d._top > 2:
        f = d._pos.factor(kmax)
        k = d._catch_up(view, k, g, np.full(n, level), costs, (None, None, f) if rates is None else (rem, rates, f),
                        level)
    if k:
        d.margin = (costs, g, rate)
    if k == 0 and d.probe and may_probe(d._probes, d._pool.sum(), d.prior_tokens, n):
        ends = draft_caps(view, kmax) if rates is None else None
        k = d._probe(view, costs, kmax, level, trials, d._pos.factor(kmax), ends)
    return k


def _drain_depth(d: CostAwareDepth, args: tuple, kmax: int, n: int):
    """`_fused_depth` once no row is left to join: `kernels.drain_plan`, then the drain's expected maxima
    (`search._steps_to_finish`; more than one row: `drain.finish_best`, in d's kept buffers) and
    `kernels.ratio_best`. Returns (k, g, level, trials, the tables, the margin's acceptance, the rows' rates), or
    None where the blocks decide (numpy's factors, a NaN level)."""
    buf, _ = _plan_buffer(args, kmax, 2 * n + (kmax + 1) * (n + 1))
    level, trials, total, d._top, ok = kernels.drain_plan(*args, buf)
    if not ok or level != level:
        return None
    costs, rate, at = _plan_views(buf, args, kmax)
    rates, remf, T = buf[at:at + n], buf[at + n:at + 2 * n], buf[at + 2 * n:at + 2 * n + kmax + 1]
    e = buf[at + 2 * n + kmax + 1:].reshape(kmax + 1, n)
    if n > 1:
        k, g = finish_best(e, remf, total, T, d._finish)
    else:
        k, g = kernels.ratio_best(total, search._steps_to_finish(e, remf, True), T)
    return k, g, level, trials, costs, rate, rates


def _plan_buffer(args: tuple, kmax: int, more: int):
    """The plan kernels' buffer (the tables, the margin's acceptance and `more`) and where the tables end."""
    at = _tables_end(args)
    return np.empty(at + kmax + more), at


def _tables_end(args: tuple) -> int:
    """Where the tables end in the plan kernels' buffer: verify, draft and, with the policy time, a pad one longer
    than the tables' positions (`kernels.plan_tables`)."""
    X1, n1 = args[0].size, args[1].size
    return X1 + n1 + ((X1 - 1) // max(n1 - 1, 1) + 1 if args[3] else 0)


def _plan_views(buf: np.ndarray, args: tuple, kmax: int):
    """The plan kernels' buffer read back: (the tables, the margin's acceptance, where the rest starts)."""
    X1, n1, at = args[0].size, args[1].size, _tables_end(args)
    costs = Tables(buf[:X1], buf[X1:X1 + n1], buf[X1 + n1:at] if args[3] else None)
    return costs, buf[at:at + kmax], at + kmax


def _fused_args(d: CostAwareDepth, view, kmax: int):
    """`_fused_depth`'s kernel arguments (the raw tables, the calibration's state, the policy time's terms, the
    counts, the pool, the position sums and options, kmax, remaining, draft_lag), or None where the kernels do not
    apply."""
    n = view.batch_size
    if n < (1 if d.drain and view.requests_left == 0 else 2) or not d.positions or d._calib.pad:
        return None   # (one row: the drain's kernel only)
    tables = d._costs.update(view, kmax)
    pos = d._pos
    rem, lag = view.remaining, view.draft_lag
    d._start(view)
    counts = d._seq.align(view.request_ids).array
    if not (kernels.floats(tables.verify, tables.draft, nonempty=True) and tables.draft.size > n and kmax >= 1
            and kernels.floats(d._pool, pos.accepted, pos.expected, pos.first_acc, pos.first_exp)
            and counts.dtype == np.float64 and rem.dtype == lag.dtype == np.int64 and rem.shape == lag.shape == (n,)
            and counts.shape[0] == n and d._pool.size == 2):
        return None
    timed, idle, extra = d._ptime.terms() if d.policy_time else (False, 0.0, 0.0)
    return (tables.verify, tables.draft, d._calib._state, timed, idle, extra, counts, float(d.prior_tokens), d._pool,
            pos.accepted, pos.expected, pos.first_acc, pos.first_exp, float(pos.prior), float(pos.optimism),
            bool(pos.paired), int(kmax), rem, lag)


def _fused_counts(d: CostAwareDepth, view, accepted, drafted, st) -> bool:
    """`CostAwareDepth.observe`'s counts (`_tally`, the forgetting pool, PositionFactors.forget and add_counts)
    in one compiled call (`kernels.observe_counts`, the same operations), for int64 counts; False where it does
    not apply (`observe` counts them block by block)."""
    pos = d._pos
    if not (accepted.dtype == drafted.dtype == np.int64 and accepted.shape == drafted.shape == (len(st),)
            and st.array.dtype == np.float64 and kernels.floats(pos.accepted, pos.expected, pos.first_acc,
                                                                 pos.first_exp)):
        return False
    d._start(view)
    if not kernels.floats(d._pool) or d._pool.size != 2:
        return False
    positions = d.positions and d._level is not None
    done, keep, deep = kernels.observe_counts(accepted, drafted, st.array, d._pool, float(d.memory), positions,
                                              0.0 if d._level is None else float(d._level), pos.accepted,
                                              pos.expected, pos.first_acc, pos.first_exp)
    if done == 3:
        pos.changed()
    elif done == 2:
        pos.forget(keep)
        pos.add_counts(deep, np.minimum(drafted, accepted + 1), accepted, np.full(drafted.size, d._level))
    return True


LEVEL = {"probe": 2.0, "positions": True, "position_prior": 20.0, "position_optimism": 2.0}   # the `level` node


class CostAwarePolicy(Policy):
    """Base of policies that price one depth for the batch with `CostAwareDepth` (`self._depth`, rebuilt on reset,
    fed the measured step costs in observe). Shared parameters: `max_depth`, `use_budget`, `drain`, `idle_replan`,
    `policy_time`, `catch_up`, and the `level` node (LEVEL: `probe`, `positions`, `position_prior`,
    `position_optimism`). The subclass sets its own parameters, then calls this __init__ (it validates and
    resets)."""

    def __init__(self, max_depth: int, use_budget: bool, drain: bool, idle_replan: int = 64, policy_time: bool = True,
                 catch_up: bool = True, level=None):
        self.max_depth = as_int(max_depth, "policy.max_depth", min=0)
        self.use_budget = bool(use_budget)
        self.drain = as_bool(drain, "policy.drain")
        self.idle_replan = as_int(idle_replan, "policy.idle_replan", min=0)
        self.policy_time = as_bool(policy_time, "policy.policy_time")
        self.catch_up = as_bool(catch_up, "policy.catch_up")
        lv = node(level, "policy.level", LEVEL)
        self.level = SimpleNamespace(probe=as_float(lv.probe, "policy.level.probe", min=0),
                                     positions=as_bool(lv.positions, "policy.level.positions"),
                                     position_prior=as_float(lv.position_prior, "policy.level.position_prior", min=0),
                                     position_optimism=as_float(lv.position_optimism,
                                                                "policy.level.position_optimism", min=0))
        self.reset()

    def cap(self, view) -> int:
        """The deepest depth this step may plan: the policy's and the engine's max_depth."""
        return min(self.max_depth, view.max_depth)

    def finish(self, depths: np.ndarray, view) -> np.ndarray:
        """A plan's last step: no row past its request's end (`draft_caps`), then within the engine's token cap
        (`fit_token_cap`)."""
        rem = view.remaining
        if COMPILED and search.COMPILED and depths.dtype == rem.dtype == np.int64 and depths.shape == rem.shape:
            out = np.empty(depths.size, np.int64)
            kernels.finished(depths, rem, self.cap(view), view.max_num_batched_tokens - view.batch_size, out)
            return out
        return fit_token_cap(np.minimum(depths, draft_caps(view, self.cap(view))), view)

    def uniform(self, view, k: int, floor: int = 0) -> np.ndarray:
        """The plan that drafts k for every row, the rows `held` this step at `floor` (`CostAwareDepth.hold`),
        finished (`finish`): one compiled loop where no row is held."""
        rem = view.remaining
        if COMPILED and search.COMPILED and self._depth.held is None and rem.dtype == np.int64 and rem.ndim == 1:
            out = np.empty(rem.size, np.int64)
            kernels.finished_full(int(k), rem, self.cap(view), view.max_num_batched_tokens - view.batch_size, out)
            return out
        return self.finish(self._depth.hold(np.full(view.batch_size, k, dtype=np.int64), floor), view)

    def reset(self):
        lv = self.level
        self._depth = CostAwareDepth(self.drain, lv.probe, lv.positions, lv.position_prior, lv.position_optimism,
                                     idle_replan=self.idle_replan, policy_time=self.policy_time,
                                     catch_up=self.catch_up)

    def observe(self, view, accepted):
        self._depth.observe(view, accepted)
