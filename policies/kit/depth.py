"""One depth for the whole batch, priced with the calibrated cost model (`CostAwareDepth`), and the base of the
policies that use it (`CostAwarePolicy`)."""
from __future__ import annotations

import math

import numpy as np

from specdepth.errors import as_bool, as_float, as_int
from specdepth.policy import Policy

from .acceptance import PositionFactors, expected_tokens, shrunk_rates
from .calibration import CostCalibration
from .cost import PolicyTime, StepCost
from .idle import CatchUpPadding, IdleReplan, catch_up_pays, catch_up_rows, may_probe, thin_evidence
from .search import draft_caps, fit_token_cap, uniform_depth
from .state import PerRequest


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

    def _start(self, view) -> None:
        if self._pool is None:
            p = view.acceptance_prior if self.prior is None else self.prior
            self._pool = np.array([p, 1.0 - p]) * self.prior_tokens

    def level(self, view) -> tuple[float, float]:
        """The batch's acceptance level (see the class) and the trials it rests on (pseudo-tokens included)."""
        self._start(view)
        st = self._seq.align(view.request_ids)
        P = self.prior_tokens
        trials = float(st.array.sum()) + P
        return min((float(st.accepted.sum()) + P * self._pool[0] / self._pool.sum()) / trials, 0.999), trials

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
            rest = (view.remaining, shrunk_rates(st.accepted, st.rejected, a), f, t)
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
        e = float(expected_tokens(np.array([level]), np.array([k]), *rest[2:])[0, 0])
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
        st.accepted += accepted
        st.rejected += rejected
        if drafted.any():
            keep = math.exp(-float(drafted.sum()) / self.memory)
            self._start(view)
            self._pool = self._pool * keep + [accepted.sum(), rejected.sum()]
            if self.positions and self._level is not None:
                cols = np.arange(int(drafted.max()))[None, :]
                self._pos.forget(keep)
                self._pos.add(cols < np.minimum(drafted, accepted + 1)[:, None], cols < accepted[:, None],
                              np.full(drafted.size, self._level))



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
