import math

import numpy as np

from specdepth.errors import ConfigError, as_bool, as_choice, as_float, as_int
from specdepth.policy import Policy

from .kit import (CatchUpPadding, CostCalibration, IdleReplan, PerRequest, PolicyTime, PositionFactors, StepCost,
                      best_prefix, catch_up_rows, draft_caps, expected_max, keep_by_margin, may_probe, pad_extra,
                      plan_by_position, plan_pays_catch_up, row_cost, thin_evidence, tie_bands)


MAY_END = 0.1   # `drain_makespan` judges a batch only where every row's chance to end the run (_time_weights) is this
#                 or more


class Goodput(Policy):
    """Goodput maximiser (SmartSpec / TurboSpec; vLLM adaptive verification): per step, rank every
    (sequence, position) draft slot by its survival probability and admit slots while the predicted
    goodput = expected emitted tokens / predicted step time still rises; then, while drafting, let a
    sequence draft one more token only while that token is worth its marginal time.

    Acceptance estimate per sequence (`estimator`):
      counts      accepted / (accepted + rejections), shrunk toward the batch-wide rate with
                  `prior_strength` pseudo-trials (empirical Bayes)
      confidence  the mean of the draft's confidences for that sequence, shrunk the same way, times a
                  batch-wide calibration (accepted / sum of confidences over verified tokens)
    Batch-wide sums forget with a memory of `pool_memory` drafted tokens.
    Plan: survival of slot j (1-based) of sequence i is a_i^j; slots past the request's remaining tokens
    are worth nothing. Draft forwards are paid per position (a fixed part: weights, launch; plus a part
    per row), verify per token, both from the view's cost model. Position by position, the best-ranked
    m_p rows (m_p <= m_(p-1)) that maximise value - G x (draft forward + verify growth) draft there; G,
    the step's goodput, is found by Dinkelbach iteration (G <- E/T of the plan made with G, from last
    step's G). Ranking slots globally by survival alone (vLLM's DSpark) mixes deep slots of good rows
    with shallow slots of others and pays a draft forward for a handful of rows: at large batch that
    loses to fixed depth; grouping by position is what makes it win. `ranking=global` keeps that
    global ranking (best prefix of all slots by survival) as the literal baseline.
    Drafting (`use_confidence`): each drafted token's calibrated confidence updates the sequence's
    survival s_i; the next position is drafted by the rows whose next token (worth s_i * a_i) beats G
    times its marginal cost: the best group of m rows maximises sum(value) - G * (draft[m] + verify
    growth). Rows may go `extend` positions past their planned depth when their confidences are high.
    `extend_bar` (default ratio): what such a position must beat: the step's goodput with the positions added past
    the plan so far (their values and seconds added to the plan's E and T; each position raises it, so the
    extension stops where E / T peaks, the ratio the plan maximises); `plan`, the rule before 2026-12-03: the plan's
    own G. At a run's first step the plan has only the prior level (0.7) and its G is low where the true level
    is high; the extension sees the confidences and cleared that low bar to 15 a row on c74 of robustness draw
    2057 (iid a = 0.94; `oracle_expected` 9; with `ratio` 10).
    Works on any backend: with uninformative confidences (constant) the drafting rule reproduces the plan.
    Issue 12 additions: a row's estimate is multiplied per draft position by a batch-wide factor (accepted
    / expected tokens verified at that position), so a draft whose later guesses fail more often than its
    first is priced right; estimates are rounded (1e-4) and ties between rows go to the rows with more
    tokens left, in the plan and while drafting (no row falls behind and finishes alone); the step times
    come from the cost model corrected online by the measured step costs (`cost`: calibrated, model, or
    the simulator's true clock cost; calibrated also learns whether the engine pads the verify to the
    deepest row, and then prices each opened position's padded growth); the per-position factor is
    optimistic where it rests on few tokens (`position_optimism`, `_common.PositionFactors`). Draining (`drain`,
    on by default: from the step no request is left to join the batch, `view.requests_left == 0`: a closed batch
    from its start, any workload after its last admission) the run ends when its slowest row does, and a token of
    a row that will finish long before it shortens nothing: each row's tokens are weighted by the seconds they
    save (`drain_value=time`, _time_weights: one row's share of the verify for any row, the rest of the step for
    the rows that may end the run), so rows far ahead stop lengthening every step with drafts the slowest row pays
    for; `drain_value=steps` (the rule before 2026-12-01) weights them by their expected remaining steps relative
    to the slowest row's, which still credits the fast rows below the ridge.
    `probe` (standard errors, 0 = off): where no row would draft and the draft's calibration rests on few
    verified tokens, a calibration that many standard errors higher is tried; if a draft pays there, one token
    per row (`_probe`): at most PROBE_ROUNDS steps a run, and past them only the rows never verified (requests that
    joined since), once they are a quarter of the batch (`_probe_rows`). `calibration_prior`: the pseudo verified
    tokens (accepted / confidence = 1) that calibration starts from; `calibration_prior_at=confidence` counts them
    at the verified drafts' mean confidence, so that they weigh as many tokens whatever the draft's confidence
    scale (the rule from 2026-12-02 to 2026-12-03); `one`, the rule before (with calibration_prior=1), at confidence
    1: worth 9 tokens of the shipped real pair (mean confidence 0.11) and about 1 of a calibrated draft at 0.85;
    `mixture` (default since 2026-12-03): the calibration is the posterior median under a prior on its log that is
    mostly a calibrated draft (within ~30 %) and partly one off by any factor (`_Pool._mixture`), so that little
    evidence leaves it near 1 whatever the confidences' scale and strong evidence wins; the pseudo-tokens then serve
    the probe's gates only (`evidence`, as `confidence` counts them).
    `row_calibration` (standard errors, 0 = off): where the rows' outcomes spread more than one calibration of
    the draft's confidence explains, each row is priced by its own calibration, shrunk toward the batch's
    (`_row_calibration`).
    `idle_replan` (steps, 0 = off): a plan that drafts nothing is kept without replanning for the next 1, 2, 4, ...
    (at most idle_replan) steps while the batch holds the same requests (`_common.IdleReplan`). `calibrate_idle`
    (default off): whether the cost calibration also learns from the steps of such a kept plan; off, those steps
    skip it (the same depth-0 shapes as the planned steps that it does see), which saves Python time per step on
    the real backend (experiments/real_pareto, 2026-12-04; in the simulator 10 of 480 runs moved, by at most 1.03 %).
    `policy_time` (default on): where a step pays the policy's own time (backend=hf's wall clock), that time is
    priced too (`_common.PolicyTime`): per step, and what a drafting step's plan and keep_drafting cost more
    than an idle step's, on opening the first draft position.
    `catch_up` (default on): a plan that drafts rows whose draft has fallen behind (view.draft_lag: rows that did
    not draft for a while; backend=hf, or the simulator with backend.draft_catch_up) drafts them only if its gain
    over their expected remaining steps pays for feeding the draft the tokens it skipped, or that costs at most one
    idle step (`_catch_up`); on thin evidence, and in a probe, only as many of them as one idle step's time catches
    up. Whether the engine pads the catch-up is learnt from the catch-ups paid (`_common.CatchUpPadding`).
    `sticky_pad` (default on): a padded verify the calibration found is kept while the recent steps cannot tell
    (every row drafted alike, so nothing was padded), until the data contradict it (`CostCalibration._keep_pad`).
    `cautious_pad` (default on): where the steps cannot rule out a padded verify (the same rows drafted alike every
    step, so padding and a fixed cost per step explain them equally well), plan as if the engine pads, until the
    data say it does not (`CostCalibration._doubt`).
    `drain_tail` (default balanced): a stream's tail, after its last admission, is drained where the batch was full
    until then (throughput-bound); where it never filled (latency-bound), each token is valued at the mean of the
    drain's weight and 1, so the last requests do not all wait for the slowest one (`_drain_weights`).
    `stream_value` (default slot_time): while requests may still join, a row's tokens are worth 1 / its expected
    tokens per step (scaled to at most 1): they free its slot sooner for the next request rather than add to every
    step alike, so a sure row is not drafted deep beside slow ones whose steps that lengthens (`_slot_weights`);
    `tokens`: every row's tokens alike, the rule before 2026-12-02.
    `position_paired` (default on): a later draft position's factor is measured against the first position's
    outcomes on the same row-steps, not against the estimate alone, which is high where the plan chose to draft
    deep (`_common.PositionFactors`, paired); off: the rule before 2026-12-02.
    `tie_tolerance` (default 0.01): rows whose estimates are within that fraction of each other are priced and
    ranked alike (`_common.tie_bands`: a band from the highest estimate down, each row at its band's mean), so the
    tie-break toward the rows with more tokens left spreads the drafts over rows the evidence cannot tell apart;
    0: the estimates as they are (rounded to 1e-4), the rule before 2026-12-02.
    `pad_context` (default on): the calibration's padded verify (`cost=calibrated`, CostCalibration's pad term) is
    the one an engine that pads a ragged batch runs: every row's query to the deepest row's and its context (KV)
    to the longest row's (`_common.pad_extra` with the view, `StepCost.vpad`). With the longest context well
    above the mean, such an engine's verify is memory-bound where the cost model at the rows' own contexts says it
    is near the ridge: on c178 of robustness draw 2054 the clock charged 11.42 ms with no drafts and 11.43 ms with
    one per row, where view.cost says 8.87 and 9.95, and a scale and fixed part fitted to steps at one depth cannot
    learn that slope (goodput 0.944 of fixed depth 1; with it 0.999). Off: padding of the queries only, at the mean
    context, the rule before 2026-12-02.
    `draft_fixed` (default off): where the draft's steps cannot tell the calibration's scale from its fixed part (the
    cost model's price per forward nearly constant), the draft's excess over the model is a fixed cost per forward,
    not a scale on each further row's price (`_common.CostCalibration`); on c64 of robustness draw 2058 it drafts
    every row instead of 2-3 (0.962 -> 1.001 of fixed depth 1); not on by default: on the development draws it moved
    the rest within chance, slightly down in expectation (robustness README, goodput (29)).
    `draft_clip` (default 3): a step's measured draft seconds enter the calibration's draft fit at most that many
    times the fit's own price for the step (`_common.CostCalibration`). A resumption after many idle steps also
    feeds the draft every token its rows skipped; the first such step is left out of the fit, but a second one
    that catches up other rows is not: on c225 of robustness draw 2055 (a closed batch of 197 on a padded engine)
    one step's 36 ms against ~1 ms priced set the draft's scale at 10.7 and goodput drafted nothing for the rest of
    the run (0.968 of fixed depth 1; with the clip 0.999, `goodput_true` 0.995). A draft truly dearer than priced is
    still learnt, at most that factor a step. 0: as measured, the rule before 2026-12-02.
    `drain_makespan` (default on since 2026-12-03): in a closed batch's drain, a plan that drafts every row is
    dropped (nothing drafts) where, kept to the run's end, it is expected to end the run later than no drafts
    (`_makespan_veto`, `_longer_than_none`). The drain's weights price a row's tokens by its chance to end the run,
    the slope of the run's expected end in the rows' means; drafting also spreads when each row finishes, and the
    run ends with the last of them: on 8 requests x 16 tokens at a = 0.3 with engine overheads, one draft a row
    gives 2.4 % more tokens a step's second, and 10 % more decode time (experiments/robustness/warm_start.py, where
    the bound `oracle_expected`, which plans each step alone, loses as goodput did). Judged only once as many drafts
    as rows were verified, so that a veto at the prior level does not keep the batch from learning a level that
    pays, and only where every row may end the run (`MAY_END`).
    `drain_after` > 0 also drains once the batch has shrunk below its largest size and no request joined
    for that many steps (a guess at the end of an online stream; off by default: on the development draw it
    raised the worst closed-batch cell but hurt TPOT on poisson cells).
    """

    name = "goodput"
    depth_param = "max_depth"

    def __init__(self, max_depth: int = 16, estimator: str = "confidence", prior_strength: float = 8.0,
                 pool_memory: float = 20000.0, use_confidence: bool = True, extend: int = 16,
                 ranking: str = "position", cost: str = "calibrated", cost_memory: float = 200.0,
                 drain: bool = True, drain_after: int = 0, position_prior: float = 20.0, position_optimism: float = 2.0,
                 drain_value: str = "time", calibration_prior: float = 8.0, probe: float = 2.0,
                 row_calibration: float = 5.0, idle_replan: int = 64, policy_time: bool = True,
                 catch_up: bool = True, sticky_pad: bool = True, cautious_pad: bool = True,
                 drain_tail: str = "balanced", calibration_prior_at: str = "mixture",
                 stream_value: str = "slot_time", position_paired: bool = True, tie_tolerance: float = 0.01,
                 pad_context: bool = True, draft_clip: float = 3.0, extend_bar: str = "ratio",
                 draft_fixed: bool = False, drain_makespan: bool = True, calibrate_idle: bool = False):
        self.max_depth = as_int(max_depth, "policy.max_depth", min=0)
        self.estimator = as_choice(estimator, "policy.estimator", {"counts", "confidence"})
        self.prior_strength = as_float(prior_strength, "policy.prior_strength", min=0)
        self.pool_memory = as_float(pool_memory, "policy.pool_memory", min=0, min_open=True)
        self.use_confidence = bool(use_confidence)
        self.extend = as_int(extend, "policy.extend", min=0)
        self.ranking = as_choice(ranking, "policy.ranking", {"position", "global"})
        self.cost = as_choice(cost, "policy.cost", {"model", "calibrated", "clock"})
        self.cost_memory = as_float(cost_memory, "policy.cost_memory", min=1)
        self.drain = as_bool(drain, "policy.drain")
        self.drain_after = as_int(drain_after, "policy.drain_after", min=0)
        self.drain_value = as_choice(drain_value, "policy.drain_value", {"steps", "time"})
        self.position_prior = as_float(position_prior, "policy.position_prior", min=0, min_open=True)
        self.position_optimism = as_float(position_optimism, "policy.position_optimism", min=0)
        self.calibration_prior = as_float(calibration_prior, "policy.calibration_prior", min=0, min_open=True)
        self.calibration_prior_at = as_choice(calibration_prior_at, "policy.calibration_prior_at",
                                              {"one", "confidence", "mixture"})
        self.probe = as_float(probe, "policy.probe", min=0)
        self.row_calibration = as_float(row_calibration, "policy.row_calibration", min=0)
        self.idle_replan = as_int(idle_replan, "policy.idle_replan", min=0)
        self.policy_time = as_bool(policy_time, "policy.policy_time")
        self.catch_up = as_bool(catch_up, "policy.catch_up")
        self.sticky_pad = as_bool(sticky_pad, "policy.sticky_pad")
        self.cautious_pad = as_bool(cautious_pad, "policy.cautious_pad")
        self.drain_tail = as_choice(drain_tail, "policy.drain_tail", {"always", "balanced", "never"})
        self.stream_value = as_choice(stream_value, "policy.stream_value", {"tokens", "slot_time"})
        self.position_paired = as_bool(position_paired, "policy.position_paired")
        self.tie_tolerance = as_float(tie_tolerance, "policy.tie_tolerance", min=0, max=0.5)
        self.pad_context = as_bool(pad_context, "policy.pad_context")
        self.draft_clip = as_float(draft_clip, "policy.draft_clip", min=0)
        if 0.0 < self.draft_clip < 1.0:
            raise ConfigError(f"policy.draft_clip must be 0 (off) or >= 1, got {self.draft_clip}")
        self.extend_bar = as_choice(extend_bar, "policy.extend_bar", {"plan", "ratio"})
        self.draft_fixed = as_bool(draft_fixed, "policy.draft_fixed")
        self.drain_makespan = as_bool(drain_makespan, "policy.drain_makespan")
        self.calibrate_idle = as_bool(calibrate_idle, "policy.calibrate_idle")
        self._seq = PerRequest(accepted=0.0, rejected=0.0, conf_sum=0.0, drafted=0.0, verified_conf=0.0, verified=0.0)
        self.reset()

    @property
    def requires_true_cost(self):
        return self.cost == "clock"

    def reset(self):
        self._seq.reset()
        self._costs = StepCost(pad_context=self.pad_context)
        self._calib = CostCalibration(memory=self.cost_memory, sticky=self.sticky_pad,
                                      cautious=self.cautious_pad, draft_clip=self.draft_clip,
                                      draft_fixed=self.draft_fixed)
        self._pool = None   # the batch-wide sums (_Pool), made at the first plan from view.acceptance_prior
        self._G = 0.0
        self._max_id, self._quiet, self._max_n = -1, 0, 0   # newest request, steps since one joined, largest batch
        self._closed = None   # whether no request was left to join at the first plan (a closed batch)
        self._saturated = None   # a stream's: whether its batch was full until its last admission (`drain_tail`)
        self._open_steps = self._full_steps = 0   # a stream's steps before its last admission; at its largest batch
        self._w = None
        self._ratio = None
        self._drained = False   # whether this step's weights are the drain's (not stream_value's)
        self._dbar = None   # mean drafts of the rows drafted last step
        self._probes = 0   # probe steps so far (_probe)
        self._row_cost = {}   # c1 of _time_weights per (batch, context bucket, cost model)
        self._fixed = 1.0   # the fixed share of a step's time (_time_weights' c0 / verify[0]; `drain_makespan`)
        self._p_min = 0.0   # the least chance of a row to end the run (_time_weights; `drain_makespan`)
        self._idle = IdleReplan(self.idle_replan)   # plans that draft nothing, kept (`idle_replan`)
        self._kept = False   # whether this step's plan was an idle one kept (`calibrate_idle`)
        self._ptime = PolicyTime()   # its own time per step, where a step pays it (`policy_time`)
        self._pad = CatchUpPadding()   # whether the engine pads the draft's catch-up (`catch_up`)

    # ---- estimates --------------------------------------------------------------------------------
    def _alpha(self, view) -> np.ndarray:
        st = self._seq.align(view.request_ids)
        pool = self._pool
        k = self.prior_strength
        self._cal = cal = self._row_calibration(st)
        if self.estimator == "counts":
            base = pool.accepted / (pool.accepted + pool.rejected)
            a = (st.accepted + k * base) / (st.accepted + st.rejected + k)
        else:
            base = pool.conf_sum / pool.drafted
            a = (st.conf_sum + k * base) / (st.drafted + k) * np.minimum(cal, 1 / max(base, 1e-6))
        # rounded: rows with the same evidence tie exactly (float noise in the sums would otherwise rank
        # them, the same rows losing every step), and ties go to the rows with more tokens left; estimates
        # within `tie_tolerance` of each other tie too (_common.tie_bands)
        return tie_bands(np.round(np.clip(a, 1e-3, 0.999), 4), self.tie_tolerance)

    def _row_calibration(self, st):
        """The draft's calibration (accepted / confidence over verified tokens) per row. The batch-wide one,
        unless the rows' outcomes spread more than one calibration explains (`row_calibration` standard
        errors; 0 = never): then each row's own, shrunk toward the batch-wide one by its precision (method of
        moments: the between-row variance is the spread of accepted - expected beyond its binomial variance).
        A draft can be confident and wrong on one prompt and right on another (the shipped tiny pair at batch
        2: one row accepted 38 of 38 drafts, the other 11 of 51, at the same confidences); the batch-wide
        calibration prices both alike, and the drain kept drafting the bad row, the slowest."""
        cal = self._pool.calibration
        out = np.full(len(st), cal)
        z = self.row_calibration
        if not z or len(st) < 2:
            return out
        acc, vc, ver = st.accepted, st.verified_conf, st.verified
        rows = np.flatnonzero((ver > 0) & (vc > 0))
        if rows.size < 2:
            return out
        acc, vc, ver = acc[rows], vc[rows], ver[rows]
        e = cal * vc
        var = np.maximum(e * (1.0 - np.minimum(e / ver, 1.0)), 0.25)   # binomial, at least a quarter token
        excess = float(((acc - e) ** 2).sum() - var.sum())
        if excess <= z * math.sqrt(2.0 * float((var * var).sum())):
            return out
        tau2 = excess / float((vc * vc).sum())
        w = tau2 * vc * vc / (tau2 * vc * vc + var)
        out[rows] = np.maximum(cal + w * (acc / vc - cal), 0.0)
        return out

    def _tables(self, view, K):
        """This step's step-time tables: the view's cost model, corrected by the online calibration
        (cost=calibrated), as is (cost=model), or the clock's own (cost=clock, simulator)."""
        costs = self._costs.update(view, K, view.true_cost if self.cost == "clock" else None)
        if self.cost == "calibrated":
            costs = self._calib.correct(costs)
        return self._ptime.apply(costs) if self.policy_time else costs

    # ---- hooks ------------------------------------------------------------------------------------
    def plan(self, view):
        if self._pool is None:   # the prior rate: engine.acceptance_prior (0.7 by default; a warm start)
            r = view.acceptance_prior
            k = self.calibration_prior
            at_one = self.calibration_prior_at == "one"
            self._pool = _Pool(self.position_prior, self.position_optimism, self.position_paired, accepted=10.0 * r,
                               rejected=10.0 - 10.0 * r, conf_sum=10.0 * r, cal_accepted=k if at_one else 0.0,
                               cal_conf=k if at_one else 0.0, cal_tokens=0.0 if at_one else k,
                               mixture=self.calibration_prior_at == "mixture")
        n = view.batch_size
        K = min(self.max_depth, view.max_depth, (view.max_num_batched_tokens - n) // n)
        if K <= 0:
            self._G, self._kept = 0.0, False
            return np.zeros(n, np.int64)
        self._track_joins(view)
        self._kept = self._idle.skip(view)
        if self._kept:
            return np.zeros(n, np.int64)
        depths = self._plan(view, n, K)
        self._idle.record(view, bool(depths.any()))
        if self.catch_up and self.cost != "clock":
            self._pad.planned(view, depths > 0)
        return depths

    def _plan(self, view, n, K):
        self._ratio = None   # `extend_bar=ratio`: the step's expected tokens and seconds so far
        self._a = a = self._alpha(view)
        remaining = view.remaining
        rowcap = draft_caps(view, K)
        self._tab = costs = self._tables(view, K)
        S0 = np.cumprod(np.minimum(a[:, None] * self._pool.positions.factor(K), 0.999), axis=1)   # slot survival
        S = np.where(np.arange(K)[None, :] >= rowcap[:, None], 0.0, S0)   # past the request's end: worth nothing
        self._w = w = self._drain_weights(view, S, S0)
        if self.ranking == "global":   # draining: the same weights as the position ranking (and keep_drafting)
            depths, G = self._plan_global(S, costs, n) if w is None else self._plan_global(S * w[:, None], costs,
                                                                                            float(w.sum()))
        else:
            depths, G = self._plan_positions(S, costs, remaining)
        self._G = G
        if self.catch_up and depths.any():
            depths = self._catch_up(view, depths, S, costs, remaining)
        if self._makespan_veto(depths, S, costs, remaining, n):
            self._G = float(n if w is None else w.sum()) / float(costs.verify[0])
            return np.zeros(n, np.int64)
        if not depths.any() and self.probe:
            rows = self._probe_rows(view, n)
            if rows is not None:
                return self._probe(view, S, costs, rowcap, rows)
        if self.use_confidence:
            self._s = np.ones(n)
            if self.extend_bar == "ratio" and self.extend and self._G > 0:
                self._planned = depths
                E = self._plan_value(S, depths)
                self._ratio = [E, E / self._G]
            depths = np.where(depths > 0, np.minimum(depths + self.extend, rowcap), 0)
        return depths

    def _makespan_veto(self, depths, S, costs, remaining, n) -> bool:
        """`drain_makespan`'s gate: in a closed batch's drain, on a plan that drafts every row, once as many drafts
        as rows were verified (a veto at the prior level would keep the batch from ever learning a level that
        pays: c167 of robustness draw 2063, beta acceptance with mean 0.85, vetoed at the prior 0.7 on its first
        steps, went 1.043 -> 0.990 of the best fixed depth), whether the plan kept to the end ends the run later
        than none (`_longer_than_none`).
        A plan that leaves rows out is not judged: which rows it drafts changes from step to step, so a row left
        out now does not set the run's end (c85 of robustness draw 2063, 94 rows of `confidence` acceptance). Nor
        is a batch some of whose rows cannot end the run (`_time_weights`' chance below MAY_END: rows of other
        lengths): the drain then drafts the rows that may, more than the plan kept to the end would (c109 of draw
        2062, 102 rows of 42-127 tokens, went 0.995 -> 0.990 with every batch judged)."""
        return bool(self.drain_makespan and self._closed and self._drained and n > 1 and depths.all()
                    and self.drain_value == "time" and self._p_min >= MAY_END
                    and self._pool.verified >= self.calibration_prior + n
                    and self._longer_than_none(depths, S, costs, remaining))

    def _longer_than_none(self, depths, S, costs, remaining) -> bool:
        """`drain_makespan`: whether this plan, kept to the run's end, is expected to end the run later than
        drafting nothing. The run ends with its slowest row. Without drafts row i takes exactly remaining_i steps;
        drafting d_i tokens a step it emits e_i = 1 + sum of its slot survivals a step, with variance v_i, so its
        steps are about normal, mean r_i / e_i and variance r_i v_i / e_i^3, and the last of the rows ends at the
        expectation of their maximum (`_common.expected_max`), later than the slowest row's mean where several
        rows may be last. The step's goodput G prices each row's tokens by its chance to end the run, which is the
        maximum's slope in the rows' means, but not its growth with their spread: on 8 requests x 16 tokens at
        a = 0.3 (b200, llama3_8b, a step 27 % dearer with one draft a row) it drafts every row for 2.4 % more
        tokens a second, and fixed depth 1's runs take 13 steps of 4.38 ms where none's take 15 of 3.45 ms, 10 %
        more decode time (experiments/robustness/warm_start.py). Time: the expected steps times the plan's
        predicted seconds (the plan's expected tokens / G), against remaining.max() x verify[0]. Past the ridge a
        step's time grows with its rows, and rows that finish early make the later steps cheaper: the steps are the
        fixed share f of a step's time (`_time_weights`' c0 / verify[0]) times the run's expected end plus (1 - f) times
        the rows' mean steps, for both. Closed batches only (a stream's tail also weighs its requests' latency)."""
        K = S.shape[1]
        j = np.arange(K)
        Sd = np.where(j[None, :] < depths[:, None], S, 0.0)
        L = Sd.sum(axis=1)                                   # accepted drafts a step: P(L > j) = S[:, j]
        e = 1.0 + L
        v = np.maximum((Sd * (2.0 * j + 1.0)[None, :]).sum(axis=1) - L * L, 0.0)
        r = remaining.astype(np.float64)
        mu = r / e
        f = self._fixed   # (_makespan_veto judges drain_value=time only, where _time_weights set it)
        steps = f * expected_max(mu, np.sqrt(r * v / e ** 3)) + (1.0 - f) * float(mu.mean())
        t_plan = self._plan_value(S, depths) / self._G if self._G > 0 else math.inf
        return steps * t_plan > (f * float(r.max()) + (1.0 - f) * float(r.mean())) * float(costs.verify[0])

    def _plan_value(self, S, depths) -> float:
        """The plan's expected tokens as its goodput G counts them: one a row (the drain's weights where it drains)
        plus the planned slots' survivals, weighted alike; E / G is the plan's predicted seconds."""
        w = self._w
        Sw = S if w is None else S * w[:, None]
        return (float(S.shape[0]) if w is None else float(w.sum())) + float(
            (Sw * (np.arange(S.shape[1])[None, :] < depths[:, None])).sum())

    def _plan_positions(self, S, costs, remaining):
        """plan_by_position on slot survivals S, weighted by the drain's weights where it drains; ties toward
        the rows with more tokens left, so no row falls behind the batch. Returns (depths, goodput)."""
        w = self._w
        if w is None:
            return plan_by_position(S, costs, self._G, tie=remaining)
        return plan_by_position(S * w[:, None], costs, self._G, tie=remaining, nested=True, base=float(w.sum()))

    def _catch_up_args(self, view):
        """(cost, padded) that catch_up_pays prices the draft's catch-up with: the clock's true cost (cost=clock),
        else view.cost as it is, padded as an earlier catch-up showed (`CatchUpPadding`), else where the calibration
        found the engine pads its verify (cost=calibrated). Not times the calibrated draft scale: that also holds
        the fixed seconds of each draft position (weights, launches, the engine's own), which a catch-up does not
        multiply (c78 of robustness draw 2040: scale 2.1 with 1.5 ms per position the cost model missed; the
        catch-up cost what view.cost predicted, 36 ms)."""
        if self.cost == "clock":
            return view.true_cost, False
        return view.cost, self._pad.verdict(self.cost == "calibrated" and bool(self._calib.pad))

    def _catch_up(self, view, depths, S, costs, remaining):
        """`catch_up`: the plan drafts rows whose draft lags (view.draft_lag; they have not drafted for a while).
        Their catch-up is paid if the plan's gain per step (verify[0] x (G / G_none - 1) seconds) over the steps
        it is expected to go on (remaining / expected tokens per step: draining, the batch's longest, till the
        run ends; else the lagging rows' mean) covers it, or it costs at most one idle step (verify[0];
        `_common.catch_up_pays`); else no lagging row drafts, and the others are planned without them. Where the
        acceptance estimate rests on thin evidence (`_common.thin_evidence`, the probe's rule) only the rows with
        the most tokens left whose catch-up costs at most one idle step resume (`_common.catch_up_rows`)."""
        lag = view.draft_lag
        late = (depths > 0) & (lag > 2)
        if not late.any():
            return depths
        w = self._w
        base = float(view.batch_size) if w is None else float(w.sum())
        args = self._catch_up_args(view)
        if not plan_pays_catch_up(view, depths, late, S, self._G, base, costs, self._drained, *args):
            drop = lag > 2   # every lagging row, not only the plan's: the replan would pick others
        elif thin_evidence(self._pool.verified, self.calibration_prior, view.batch_size):
            drop = (lag > 2) & ~catch_up_rows(view, late, float(costs.verify[0]), *args)
        else:
            return depths
        S = S.copy()
        S[drop] = 0.0
        depths, self._G = self._plan_positions(S, costs, remaining)
        return depths

    def _probe_rows(self, view, n):
        """Which rows a probe may draft, or None: every row while the run has probed fewer than PROBE_ROUNDS
        steps (`may_probe`); past that, on thin evidence, the rows no draft of which was verified yet, once they
        are at least a quarter of the batch (and two rows, unless the batch is one row). A stream's first
        requests can say little of its later ones: in a stream whose requests differ (`beta` acceptance), the
        rounds went on the first two, at batch 2, which accepted 3 of 29 drafts, and the batch of up to 80 drafted
        nothing for the remaining 3,000 steps, where one token each paid (c48 of robustness draw 2049: TPOT p50
        1.145 x fixed depth 1's; `oracle_expected` 1.004)."""
        if may_probe(self._probes, self._pool.verified, self.calibration_prior, n):
            return np.ones(n, bool)
        if not thin_evidence(self._pool.verified, self.calibration_prior, n):
            return None
        fresh = self._seq.align(view.request_ids).verified == 0
        k = int(fresh.sum())
        return fresh if k and k >= max(min(2, n), n / 4) else None

    def _probe(self, view, S, costs, rowcap, rows):
        """No row drafts, and the draft's calibration rests on few verified tokens (fewer than max(batch,
        PROBE_TOKENS); `rows`, from _probe_rows): would a draft pay at a calibration `probe`
        standard errors higher (binomial relative error sqrt((1 - A / V) / A), A of V verified drafts accepted,
        its prior's included)? Then every row of `rows` the optimistic plan drafts gets one token, to learn it. Without
        it a batch whose first verified drafts were unlucky never drafts again, so never learns better (c152 of
        robustness draw 2035: 1 of 14 accepted at a = 0.39, 0.915 of fixed depth 1 for the whole run)."""
        A, V = self._pool.evidence()   # accepted / verified drafts, the prior's included
        up = 1.0 + self.probe * math.sqrt(max(1.0 - A / V, 0.0) / max(A, 1e-9))
        hi = np.minimum(S * up ** np.arange(1, S.shape[1] + 1), 0.999)   # slot j: j draft tokens' survival
        hi[np.arange(S.shape[1])[None, :] >= rowcap[:, None]] = 0.0
        depths, _ = self._plan_positions(hi, costs, view.remaining)
        depths[~rows] = 0   # whether it pays is the batch's question; the rows to learn from, `rows`
        late = (depths > 0) & (view.draft_lag > 2)
        if self.catch_up and late.any():   # a probe catches up at most one idle step's worth of rows
            ok = catch_up_rows(view, late, float(costs.verify[0]), *self._catch_up_args(view))
            depths[late & ~ok] = 0
        self._s = np.ones(view.batch_size)
        self._probes += int(depths.any())
        return np.minimum(depths, 1)

    def _track_joins(self, view):
        """For `drain_after`: the newest request seen, the steps since one joined, the largest batch so far; for
        `drain_tail`: whether the batch was closed from the first plan, and a stream's saturation."""
        if self._closed is None:
            self._closed = view.requests_left == 0
        top = int(view.request_ids.max(initial=-1))
        if top > self._max_id:
            self._max_id, self._quiet = top, 0
        else:
            self._quiet += 1
        self._max_n = max(self._max_n, view.batch_size)
        if view.requests_left:   # a stream before its last admission: steps it ran, steps at its largest batch
            self._open_steps += 1
            self._full_steps += view.batch_size >= self._max_n
        elif self._saturated is None and not self._closed:   # its last admission: full on 90 % of its steps
            self._saturated = self._full_steps >= 0.9 * self._open_steps

    def _drain_weights(self, view, S, S0):
        """Draining (`drain`: no request is left to join; `drain_after`: the batch has shrunk below its largest size
        and no new request joined for that many steps), the batch ends when its slowest row does, and a token of a
        row that will finish long before it shortens nothing: a row's tokens are worth its expected remaining steps
        / the slowest row's (remaining / expected tokens per step). While requests may still join:
        `stream_value=slot_time`'s weights (_slot_weights, from S0: S not cut at the requests' ends), or None
        (plain goodput). `drain_tail`: a stream's tail
        (after its last admission) is drained (always), or not (never), or (balanced) drained where the batch was
        full until then (requests queued: throughput-bound), and else valued at the mean of the drain's weight and
        plain goodput's 1. A stream that never filled its batch is latency-bound: there the drain made the last
        requests wait for the slowest one and raised the TPOT p50 (c163 of robustness draw 2044: 1.128 x the best
        fixed depth's, against 1.032 balanced and 1.036 for `oracle_expected`, which does not drain)."""
        drained = self.drain and view.requests_left == 0 and (self._closed or self.drain_tail != "never")
        self._drained = False
        if view.batch_size < 2:
            return None   # (one row: the weights would be 1, plain goodput's plan, without the nested search)
        if not drained and (not self.drain_after or self._quiet < self.drain_after or view.batch_size >= self._max_n):
            return self._slot_weights(S0) if self.stream_value == "slot_time" else None
        self._drained = True
        if self.drain_value == "steps":
            steps = view.remaining / (1.0 + S.sum(axis=1))   # expected tokens per step, as deep as this step may
            w = steps / max(float(steps.max()), 1e-12)
        else:
            w = self._time_weights(view, S)
        if drained and not self._closed and self.drain_tail == "balanced" and not self._saturated:
            w = 0.5 * (w + 1.0)   # a latency-bound stream's tail: as much its requests' latency as the run's end
        return w

    def _tokens_per_step(self, S):
        """Each row's expected tokens per step at the depth the drafted rows got last step (all of K before any)."""
        n, K = S.shape
        d = K if self._dbar is None else min(self._dbar, K)
        lo = int(d)
        c = np.concatenate([np.zeros((n, 1)), np.cumsum(S, axis=1)], axis=1)
        return 1.0 + c[:, lo] + (d - lo) * (c[:, min(lo + 1, K)] - c[:, lo])

    def _slot_weights(self, S0):
        """stream_value=slot_time, while requests may still join: a token of row i frees its slot 1 / e_i steps
        sooner (e_i its expected tokens per step), and a freed slot is worth what the batch's average row makes in
        it, so a row's tokens are worth mean(e) / e_i (then scaled to at most 1). Per step, plain goodput counts
        every row's tokens alike, and drafts the sure rows deepest; but a sure row that finishes sooner leaves its
        slot to the next request, and the batch is then more of the slow rows, whose steps the sure rows' deep
        drafts lengthened (c140 of robustness draw 2048: a row that accepted every draft was drafted 16 deep while
        the slow row beside it made ~2.5 tokens a step; 0.944 of fixed depth 4, as `oracle_expected`, which plans
        each step alike). Minimising a stream's time per request, T x mean(1 / e), gives the same weights."""
        w = 1.0 / self._tokens_per_step(S0)   # its rate, not cut where it ends: its slot frees then anyway
        return w / float(w.max())

    def _time_weights(self, view, S):
        """drain_value=time: a row's token is worth the seconds it saves. The batch's verify costs
        T(n) = c0 + c1 n (c1: one more row at the mean context, cached per 2 % of context as the step-time
        tables are, times the calibration's scale; c0 the rest, fixed costs included). A row that finishes
        sooner leaves the batch 1 / e_i steps earlier per token (e_i: its expected tokens per step at the
        depth the drafted rows got last step), saving c1 each; the row that finishes last also ends the run
        1 / e_i steps earlier, saving c0. Which row ends last is uncertain: P(last) ~ exp(-z^2 / 2), z the gap
        to the slowest row's expected steps in standard deviations, from the outcomes (tokens per step vary
        by about e (e - 1)) and from the estimate (its binomial error over the row's drafted tokens plus
        `prior_strength`). Below the ridge c1 is small and the rows that may end the run are worth the most;
        past it every row's tokens count."""
        n, K = S.shape
        d = K if self._dbar is None else min(self._dbar, K)
        e = self._tokens_per_step(S)
        a = self._a
        dS = ((np.arange(K) + 1.0) * S)[:, :max(int(math.ceil(d)), 1)].sum(axis=1) / a   # de / da
        var_a = a * (1.0 - a) / (self._seq.align(view.request_ids).drafted + self.prior_strength)
        rem = view.remaining
        steps = rem / e
        sd2 = rem * (e - 1.0) / (e * e) + (steps / e * dS) ** 2 * var_a + 1.0
        last = int(np.argmax(steps))
        z = (steps - steps[last]) / np.sqrt(sd2 + sd2[last])
        p = np.exp(-0.5 * z * z)
        self._p_min = float(p.min())   # `drain_makespan`: whether every row may end the run
        cost = view.true_cost if self.cost == "clock" else view.cost
        ctx = view.context_lens
        key = (n, int(math.log1p(float(ctx.mean())) * 50.0), id(cost))   # StepCost's buckets: 2 % of context
        c1 = self._row_cost.get(key)
        if c1 is None:
            if len(self._row_cost) >= 512:
                self._row_cost.clear()
            c1 = self._row_cost[key] = row_cost(cost, ctx)
        c1 *= self._calib.verify_scale() if self.cost == "calibrated" else 1.0
        c0 = max(float(self._tab.verify[0]) - n * c1, 0.0)
        self._fixed = c0 / max(float(self._tab.verify[0]), 1e-300)   # `drain_makespan`: a step's fixed share
        w = (c1 + c0 * p / p.sum()) / e
        return w / max(float(w.max()), 1e-300)

    @staticmethod
    def _plan_global(S, costs, base):
        """vLLM DSpark / SmartSpec as described: every slot ranked by survival, best prefix by goodput (base:
        the value of the step's one token per row)."""
        n = S.shape[0]
        rows, cols = np.nonzero(S > 0)
        surv = S[rows, cols]
        order = np.lexsort((cols, -surv))
        m, g = best_prefix(n, rows[order], cols[order], surv[order], costs, float(base))
        return np.bincount(rows[order[:m]], minlength=n).astype(np.int64), g

    def keep_drafting(self, view, position, confidence):
        drafting = ~np.isnan(confidence)
        if not self.use_confidence:
            return drafting
        c = np.minimum(np.where(drafting, confidence, 0.0) * self._cal, 1.0)
        self._s = self._s * c
        cand = drafting & (view.depths > position + 1)
        idx = np.flatnonzero(cand)
        if idx.size == 0:
            return np.zeros(view.batch_size, bool)
        f = float(self._pool.positions.factor(position + 2)[-1])
        if idx.size == 1:   # one row left to decide (batch 1, a drained tail): the same arithmetic, in floats
            i = int(idx[0])
            v = float(self._s[i]) * min(float(self._a[i]) * f, 0.999)
            if self._w is not None:
                v = v * float(self._w[i])
        else:
            v = self._s[idx] * np.minimum(self._a[idx] * f, 0.999)
            if self._w is not None:
                v = v * self._w[idx]
        past = self._ratio is not None and bool((self._planned[idx] <= position + 1).all())
        return keep_by_margin(view, position, idx, v, self._tab, self._G, self._ratio if past else None)

    def observe(self, view, accepted):
        drafted = view.drafted
        if self.policy_time:
            self._ptime.observe(view)
        if self.catch_up and self.cost != "clock":
            self._pad.observe(view, self._calib)
        if self.cost == "calibrated" and (self.calibrate_idle or not self._kept):
            self._calib.observe(view, pad_extra(self._costs, drafted, view if self.pad_context else None))
        if not drafted.any():   # nothing drafted, nothing learned of the draft (every sum below would add 0)
            return
        st = self._seq.align(view.request_ids)
        rej = (accepted < drafted).astype(float)
        ver = np.minimum(drafted, accepted + 1)   # verified drafts: the accepted ones and the first rejected
        conf = view.confidences
        if conf is not None and conf.shape[1]:
            cols = np.arange(conf.shape[1])[None, :]
            c = np.where(np.isnan(conf), 0.0, conf)
            csum = (c * (cols < drafted[:, None])).sum(axis=1)
            verified = cols < ver[:, None]
            vrow = (c * verified).sum(axis=1)
            vconf = float(vrow.sum())
        else:
            csum = vrow = np.zeros(view.batch_size)
            vconf = 0.0
        self._dbar = float(drafted[drafted > 0].mean())
        st.accepted += accepted
        st.rejected += rej
        st.conf_sum += csum
        st.drafted += drafted
        st.verified_conf += vrow
        st.verified += ver
        self._pool.add(np.exp(-float(drafted.sum()) / self.pool_memory), accepted.sum(), rej.sum(), csum.sum(),
                       drafted.sum(), vconf, ver.sum())
        if conf is not None and conf.shape[1]:
            self._pool.positions.add(verified, cols < accepted[:, None], self._a, drafted)


MIXTURE_PRIOR = ((0.9, 0.3), (0.1, 1.5))   # (weight, sd of log c) of each normal of _Pool._mixture's prior
_MIX_GRID = np.linspace(-5.0, 5.0, 201)   # log c
_MIX_EXP = np.exp(_MIX_GRID)
_MIX_LOGPRIOR = np.log(sum(w / s * np.exp(-0.5 * (_MIX_GRID / s) ** 2) for w, s in MIXTURE_PRIOR))


class _Pool:
    """Batch-wide decayed sums: accepted drafts, rejections, the drafts' confidence sum and count, and the
    accepted drafts / confidence sum over verified tokens (the draft's calibration). Goodput starts the rate at
    view.acceptance_prior (engine.acceptance_prior, 0.7 by default) worth 10 drafted tokens. The calibration
    starts from `cal_accepted` / `cal_conf` (a prior at confidence 1, or evidence) and `cal_tokens` pseudo verified
    tokens at the mean confidence of the verified drafts (accepted / confidence = 1 there; no weight until a draft
    is verified). Per draft position, the factor that corrects a row's estimate there (`_common.PositionFactors`,
    with `position_prior` pseudo-tokens and `position_optimism` standard errors, paired where `position_paired`;
    without the optimism, goodput reached 0.98 of fixed depth 2 at iid a = 0.5, batch 4-32, experiments/pareto)."""

    def __init__(self, position_prior=20.0, position_optimism=2.0, position_paired=False, accepted=7.0, rejected=3.0,
                 conf_sum=7.0, drafted=10.0, cal_accepted=1.0, cal_conf=1.0, cal_tokens=0.0, mixture=False):
        self.accepted, self.rejected, self.conf_sum, self.drafted = accepted, rejected, conf_sum, drafted
        self.mixture = mixture   # calibration: the posterior median under MIXTURE_PRIOR (calibration_prior_at=mixture)
        self._mix = None   # its last (accepted, confidence) sums and value
        self.cal_accepted, self.cal_conf = cal_accepted, cal_conf
        self.verified = cal_conf + cal_tokens   # verified draft tokens (the calibration's prior counted as tokens)
        self._pw = cal_tokens   # the pseudo-tokens' weight (forgotten as the sums are)
        self._vc = self._vn = 0.0   # the verified drafts' confidence sum and count (for their mean)
        self.positions = PositionFactors(position_prior, position_optimism, position_paired)

    @property
    def _pseudo(self) -> float:
        """The pseudo-tokens' confidence mass (and accepted drafts): their weight x the verified mean confidence."""
        return self._pw * self._vc / self._vn if self._vn > 0.0 else 0.0

    @property
    def calibration(self) -> float:
        if self.mixture:
            return self._mixture()
        m = self._pseudo
        return (self.cal_accepted + m) / (self.cal_conf + m) if self.cal_conf + m > 0.0 else 1.0

    def _mixture(self) -> float:
        """`calibration_prior_at=mixture`: the posterior median of the draft's calibration c (accepted = c x
        confidence) from the verified drafts' accepted and confidence sums (A, E; Poisson likelihood c^A e^(-c E),
        as the ratio A / E), under a prior on log c that is a mixture (MIXTURE_PRIOR): 0.9 N(0, 0.3^2), a draft
        calibrated within about a third, and 0.1 N(0, 1.5^2), a draft that may be off by any factor up to ~20. The
        median, not the mean: the wide part lifts the prior's mean of c to 1.24 with no evidence at all (its median
        is 1). Little evidence stays near 1 whatever the confidences' scale: 16 drafts at confidence 0.07, none
        accepted (c188 of robustness draw 2060, a stream whose first request's draft barely ever guessed right),
        give 0.88, where 8 pseudo-tokens at those drafts' own confidence (`confidence`) give 0.33 and priced the next
        requests (confidence 0.26 and 0.34, accepted as often) below what a draft costs for the rest of their runs.
        Strong evidence far from 1 wins: the shipped real pair (accepted 4.8 x its confidence) reads 1.8 after 10
        verified drafts, 4.1 after 20, 4.5 after 33 (`confidence`: 3.1, 3.7, 4.1; `one` with 8: 1.5, 1.8, 2.2).
        Developed on robustness draws 2059-2060, mixture weights and widths chosen there (0.5 / 0.35 and 0.5 / 1.5
        first: mixed), experiments/robustness/README.md."""
        A, E = self.cal_accepted, self.cal_conf
        if self._mix is not None and self._mix[0] == A and self._mix[1] == E:
            return self._mix[2]
        ll = _MIX_LOGPRIOR + A * _MIX_GRID - E * _MIX_EXP
        w = np.exp(ll - ll.max())
        cdf = np.cumsum(w) - 0.5 * w   # at the grid points (each holds half its own mass)
        c = math.exp(float(np.interp(0.5 * float(w.sum()), cdf, _MIX_GRID)))
        self._mix = (A, E, c)
        return c

    def evidence(self) -> tuple[float, float]:
        """(accepted, verified) drafts the calibration rests on, its prior's included (the pseudo-tokens accepted
        at their confidence; before any draft is verified, at 1)."""
        return self.cal_accepted + (self._pseudo if self._vn > 0.0 else self._pw), self.verified

    def add(self, keep: float, accepted, rejected, conf_sum, drafted, verified_conf, verified) -> None:
        """Forget (multiply every sum by `keep`), then add one step's counts."""
        self.accepted = self.accepted * keep + accepted
        self.rejected = self.rejected * keep + rejected
        self.conf_sum = self.conf_sum * keep + conf_sum
        self.drafted = self.drafted * keep + drafted
        self.cal_accepted = self.cal_accepted * keep + accepted
        self.cal_conf = self.cal_conf * keep + verified_conf
        self.verified = self.verified * keep + verified
        self._pw *= keep
        self._vc = self._vc * keep + verified_conf
        self._vn = self._vn * keep + verified
        self.positions.forget(keep)
