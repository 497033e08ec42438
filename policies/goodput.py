from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from specdepth.errors import ConfigError, as_bool, as_choice, as_float, as_int
from specdepth.policy import Policy

from . import goodput_gates as gates
from .goodput_evidence import Evidence, Kept, estimate
from .goodput_weights import RowCost, Stream, drain_weights, timed
from .kit import CatchUpPadding, CostCalibration, IdleReplan, PerRequest, PolicyTime, StepCost, pad_extra
from .kit.options import node

ESTIMATE = {"prior_strength": 8.0, "pool_memory": 20000.0, "calibration_prior": 8.0, "row_calibration": 5.0,
            "tie_tolerance": 0.01, "position_prior": 20.0, "position_optimism": 2.0}
CALIBRATION = {"memory": 200.0, "draft_clip": 3.0, "draft_fixed": False}
DRAINING = {"tail": "balanced", "after": 0}


@dataclass(init=False)
class Step:
    """One plan's record; each field is written by one phase of `Goodput.plan` (till then, its default: the
    class's)."""
    G0: float                    # the Dinkelbach start: the last plan's goodput
    kept: bool = False           # an idle plan kept (`idle_replan`): no phase ran
    est: SimpleNamespace = None  # estimate: a, cal (per row), S0, S (slot survivals), rowcap, rows, rem, f, lag
    #                              (lag: view.draft_lag, read once for the catch-up gate and CatchUpPadding.planned),
    #                              slot and spread (the weights' blocks, computed with the estimates, else None);
    #                              compiled, its arrays are kept across steps (`goodput_evidence.Kept`)
    costs: object = None         # price: the step-time tables
    weights: SimpleNamespace = None   # weigh: w, drained, p_min, fixed
    planned: np.ndarray = None   # search: the plan's depths
    G_plan: float = 0.0          # search: its goodput
    depths: np.ndarray = None    # gate: the depths after the gates
    G: float = 0.0               # gate: their goodput
    probed: bool = False         # gate: a probe's depths (not extended)
    drafting: gates.Drafting = None   # extend
    ext: gates.Extension = None  # search: what the gates and the extension read of the plan (`gates.plan_extend`)

    def __init__(self, G0: float, kept: bool = False, G: float = 0.0):
        self.G0, self.kept, self.G = G0, kept, G


class Goodput(Policy):
    """Goodput maximiser: per step, the (sequence, position) draft slots that maximise expected emitted tokens /
    predicted step time; while drafting, a row goes on only while its next token is worth its marginal time.

    `plan`'s phases: estimate (each row's acceptance from its drafts' calibrated confidences or its counts, shrunk
    toward the batch's; slot j survives with a^j x the position's factor) -> price (step-time tables from the cost
    model, calibrated online: `cost`) -> weigh (a row's token is worth the seconds it saves while draining, the slot
    time it frees while requests may join) -> search (position by position, the rows whose value beats G x the
    draft forward and verify growth, G by Dinkelbach; `ranking=global`: one ranking of all slots) -> gate (catch-up,
    a closed batch's makespan, a probe on thin evidence) -> extend (up to `extend` positions past the plan while
    each raises the step's goodput). Budget: the calibrated cost model prices every slot.
    Parameters: `max_depth`, `estimator`, `ranking`, `cost` (calibrated / model / clock: the simulator's true cost),
    `drain`, `use_confidence`, `extend`, `probe`, `idle_replan`, `policy_time`, `catch_up`; nodes `estimate`,
    `calibration` and `draining` (ESTIMATE, CALIBRATION, DRAINING; conf/policy/goodput.yaml says each key)."""

    name = "goodput"
    depth_param = "max_depth"

    def __init__(self, max_depth: int = 16, estimator: str = "confidence", ranking: str = "position",
                 cost: str = "calibrated", drain: bool = True, use_confidence: bool = True, extend: int = 16,
                 probe: float = 2.0, idle_replan: int = 64, policy_time: bool = True, catch_up: bool = True,
                 estimate=None, calibration=None, draining=None):
        vars(self).update(_options(**{k: v for k, v in locals().items() if k != "self"}))
        self.reset()

    @property
    def requires_true_cost(self):
        return self.cost == "clock"

    def reset(self):
        e, c = self.est, self.cal
        self._seq = _per_request()
        self._pool = Evidence(e.position_prior, e.position_optimism, True, None, None, None, 10.0, 0.0, 0.0,
                              e.calibration_prior, mixture=True)   # the rate from view.acceptance_prior (`start`)
        self._costs = StepCost(pad_context=True)
        self._calib = CostCalibration(memory=c.memory, draft_clip=c.draft_clip, draft_fixed=c.draft_fixed)
        self._stream, self._row_cost = Stream(), RowCost()
        self._idle, self._ptime, self._pad = IdleReplan(self.idle_replan), PolicyTime(), CatchUpPadding()
        self._step, self._kept = Step(G0=0.0), None

    def plan(self, view):
        n = view.batch_size
        K = min(self.max_depth, view.max_depth, (view.max_num_batched_tokens - n) // n)
        if K <= 0:
            self._step = Step(G0=0.0)
            return np.zeros(n, np.int64)
        rows = self._seq.align(view.request_ids)   # (its largest id: the stream's admissions)
        self._stream.update(view, None, n, self._seq.top)
        if self._idle.left and self._idle.skip(view):   # (no window left: no look at the ids)
            self._step = Step(G0=self._step.G, kept=True, G=self._step.G)   # the last plan's G carries over
            return np.zeros(n, np.int64)
        r = self._step = Step(G0=self._step.G)
        r.est = self._estimate(view, K, rows)
        r.costs = self._price(view, K)
        r.weights = self._weigh(view, r)
        r.planned, r.G_plan = self._search(view, r)
        r.depths, r.G, r.probed = self._gate(view, r)
        r.drafting, depths = self._extend(view, r)
        drafts, late = gates.flags(depths, r.ext)
        self._idle.record(view, drafts)
        if self.catch_up and self.cost != "clock" and (late or self._pad.caught_up):   # (else nothing to clear)
            self._pad.planned(view, depths > 0, lag=r.est.lag) if late else self._pad.planned_none()
        return depths

    def keep_drafting(self, view, position, confidence):
        if not self.use_confidence:
            return ~np.isnan(confidence)
        return self._step.drafting.keep(view, position, confidence, self._pool.positions)

    def observe(self, view, accepted):
        drafted, step = view.drafted, self._step   # (read once)
        if self.policy_time:
            self._ptime.observe(view)
        if self.catch_up and self.cost != "clock":
            self._pad.observe(view, self._calib)
        if self.cost == "calibrated" and not step.kept:
            self._calib.observe(view, pad_extra(self._costs, drafted, view))
        est = step.est   # the plan's rows (the same batch); None: an idle or empty plan, which drafts nothing
        if est is not None:   # (nothing drafted, nothing learned of the draft: `only_drafted`, True)
            self._pool.observe(view, accepted, est.rows, est.a, self.est.pool_memory, drafted, True)

    def _estimate(self, view, K, rows=None) -> SimpleNamespace:
        """Each row's estimates (`goodput_evidence.estimate`; an instance's `_alpha(rows, cal)` replaces its rule),
        rows, the weights' mode and view.draft_lag (read once: the catch-up gate, `_pad.planned`); rows: aligned."""
        rows = self._seq.align(view.request_ids) if rows is None else rows
        d = self.draining
        mode = timed(view, self._stream, d.tail, d.after, self.drain)   # (drained, weighed by time_weights)
        if self._kept is None or self._kept.n != len(rows.array) or self._kept.K != K:   # (kept while the shape holds)
            self._kept = Kept(len(rows.array), K)
        est = estimate(view, self._pool, rows, K, self.est, self.estimator, self._kept, mode[1],
                       vars(self).get("_alpha"))
        est.rows, est.mode, est.lag = rows, mode, view.draft_lag
        return est

    def _price(self, view, K):
        """The step-time tables: the view's cost model, calibrated (cost=calibrated), as is, or the clock's."""
        costs = self._costs.update(view, K, view.true_cost if self.cost == "clock" else None)
        if self.cost == "calibrated":
            return self._calib.correct(costs, self._ptime if self.policy_time else None, keep=True)
        return self._ptime.apply(costs) if self.policy_time else costs

    def _weigh(self, view, r) -> SimpleNamespace:
        """What each row's token is worth this step (`goodput_weights.drain_weights`, into `Kept.weights`); past S,
        time_weights' arguments where it needs them: c1, one more row's verify seconds as priced, calibrated."""
        d, e, c, scaled = self.draining, r.est, self._costs, self.cost == "calibrated"
        args = lambda: (e.a, self._pool.dbar, None if e.spread else e.rows.drafted,   # noqa: E731 (spread: unread)
                        self.est.prior_strength, e.rem, self._row_cost(c.model, c.ctx, c.mean, c.key[2])
                        * (self._calib.verify_scale() if scaled else 1.0), float(r.costs.verify[0]))
        return drain_weights(view, self._stream, d.tail, d.after, self.drain, e.S, e.S0, self._pool.dbar, args,
                             e.slot, e.spread, e.mode, self._kept.weights)

    def _search(self, view, r):
        """The plan and its goodput, from the last plan's (Dinkelbach)."""
        if self.ranking == "global":
            return gates.plan_global(r.est.S, r.costs, r.weights.w)
        e, k = r.est, self._kept   # (k: the depths' buffer)
        depths, G, r.ext = gates.plan_extend(e.S, r.costs, r.G0, e.rem, r.weights.w, e.lag, self.extend, e.rowcap, k)
        return depths, G

    def _gate(self, view, r):
        """Catch-up, then the drain's makespan, then (where nothing drafts) the probe."""
        n, S, costs, w, depths, G = view.batch_size, r.est.S, r.costs, r.weights.w, r.planned, r.G_plan
        price = lambda: gates.catch_up_pricing(view, self.cost, self._pad, self._calib)   # noqa: E731
        drafts, late = gates.flags(depths, r.ext)
        if self.catch_up and drafts and late:
            depths, G = gates.catch_up(view, depths, S, costs, G, r.weights, self._pool, self.est.calibration_prior,
                                       price, r.est.lag)
        if self._stream.closed and gates.ends_later(depths, S, costs, G, r.weights, r.est.rem, True,   # (open: no)
                                                    self._pool.verified >= self.est.calibration_prior + n, r.ext):
            return np.zeros(n, np.int64), float(n if w is None else w.sum()) / float(costs.verify[0]), False
        if self.probe and not (drafts if depths is r.planned else gates.flags(depths, r.ext)[0]):
            probed = gates.probe_step(view, r.est, costs, G, w, self._pool, self.est.calibration_prior, self.probe,
                                      price if self.catch_up else None)
            if probed is not None:
                return probed, G, True
        return depths, G, False

    def _extend(self, view, r):
        """The drafting rule (`gates.Drafting`) and the depths to draft: up to `extend` past the plan."""
        if not self.use_confidence:
            return None, r.depths
        w, depths, G, cap = r.weights.w, r.depths, r.G, r.est.rowcap
        if r.ext is not None and depths is r.ext.planned:   # the gates kept the plan: the search's extension
            ratio, out = ([r.ext.value, r.ext.value / G] if self.extend and G > 0 else None), r.ext.depths
        elif r.probed or not self.extend or G <= 0:
            ratio, out = None, depths if r.probed else gates.extended(depths, self.extend, cap)
        else:
            ratio, out = gates.ratio_extended(r.est.S, depths, w, G, self.extend, cap)
        return gates.Drafting(view.batch_size, r.est.a, r.est.cal, w, r.costs, G, depths, ratio, r.est.rem,
                              r.est.f), out


def _per_request() -> PerRequest:
    """goodput's per-request sums (`Evidence.observe`'s), in tables that take turns (`PerRequest.reuse`: a plan's
    rows live until the next plan)."""
    st = PerRequest(accepted=0.0, rejected=0.0, conf_sum=0.0, drafted=0.0, verified_conf=0.0, verified=0.0)
    st.reuse = True
    return st


def _options(max_depth, estimator, ranking, cost, drain, use_confidence, extend, probe, idle_replan, policy_time,
             catch_up, estimate, calibration, draining) -> dict:
    """Goodput's parameters, validated: the top-level ones and the `estimate`, `calibration`, `draining` nodes."""
    top = dict(max_depth=as_int(max_depth, "policy.max_depth", min=0),
               estimator=as_choice(estimator, "policy.estimator", {"counts", "confidence"}),
               ranking=as_choice(ranking, "policy.ranking", {"position", "global"}),
               cost=as_choice(cost, "policy.cost", {"model", "calibrated", "clock"}),
               drain=as_bool(drain, "policy.drain"), use_confidence=bool(use_confidence),
               extend=as_int(extend, "policy.extend", min=0), probe=as_float(probe, "policy.probe", min=0),
               idle_replan=as_int(idle_replan, "policy.idle_replan", min=0),
               policy_time=as_bool(policy_time, "policy.policy_time"), catch_up=as_bool(catch_up, "policy.catch_up"))
    top["est"], top["cal"], top["draining"] = _nodes(estimate, calibration, draining)
    return top


def _nodes(estimate, calibration, draining):
    """The validated `estimate`, `calibration` and `draining` nodes."""
    e = node(estimate, "policy.estimate", ESTIMATE)
    k = "policy.estimate."
    est = SimpleNamespace(prior_strength=as_float(e.prior_strength, k + "prior_strength", min=0, min_open=True),
                          pool_memory=as_float(e.pool_memory, k + "pool_memory", min=0, min_open=True),
                          calibration_prior=as_float(e.calibration_prior, k + "calibration_prior", min=0,
                                                     min_open=True),
                          row_calibration=as_float(e.row_calibration, k + "row_calibration", min=0),
                          tie_tolerance=as_float(e.tie_tolerance, k + "tie_tolerance", min=0, max=0.5),
                          position_prior=as_float(e.position_prior, k + "position_prior", min=0, min_open=True),
                          position_optimism=as_float(e.position_optimism, k + "position_optimism", min=0))
    c = node(calibration, "policy.calibration", CALIBRATION)
    cal = SimpleNamespace(memory=as_float(c.memory, "policy.calibration.memory", min=1),
                          draft_clip=as_float(c.draft_clip, "policy.calibration.draft_clip", min=0),
                          draft_fixed=as_bool(c.draft_fixed, "policy.calibration.draft_fixed"))
    if 0.0 < cal.draft_clip < 1.0:
        raise ConfigError(f"policy.calibration.draft_clip must be 0 (off) or >= 1, got {cal.draft_clip}")
    d = node(draining, "policy.draining", DRAINING)
    dr = SimpleNamespace(tail=as_choice(d.tail, "policy.draining.tail", {"always", "balanced", "never"}),
                         after=as_int(d.after, "policy.draining.after", min=0))
    return est, cal, dr
