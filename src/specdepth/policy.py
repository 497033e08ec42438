"""The policy protocol: what a depth policy sees each step and the hooks it implements.

Subclass `Policy`, implement `plan`, optionally `reset`, `keep_drafting` and `observe`, and point a config at
it (`~policy.depth` drops the preset's key your constructor does not take):

    specdepth policy=none '~policy.depth' policy._target_=mypkg.mypolicy.MyPolicy +policy.my_param=3

A policy imports only this module, `specdepth.errors`, numpy, `specdepth.tree` (tree plans) and, if it likes,
the policy kit (`specdepth.policies.kit`). Everything it needs arrives in the `StepView`. docs/plugins.md is the protocol.
"""
from __future__ import annotations

import numpy as np

from .tree import tree_draft_time


def _ro(a: np.ndarray) -> np.ndarray:
    v = a.view()
    v.setflags(write=False)   # (a third faster than through v.flags)
    return v


class StepView:
    """Read-only view of the running batch for one engine step (arrays are valid during this step only).

    Per sequence (length `batch_size`; row i is the same sequence in every array):
      request_ids         int64   the request each row serves
      context_lens        int64   tokens in the sequence so far (prompt + generated)
      generated           int64   tokens generated so far
      remaining           int64   tokens still to generate before the request is done
      acceptance          float64 the engine's running estimate of this sequence's per-token acceptance
                                  probability: (accepted + prior) / (accepted + rejected + 1), over
                                  counts decayed by engine.acceptance_decay per step it drafted
      recent_accepted     int64   [batch_size, history] accepted drafts in recent steps, newest first, -1 = none
      recent_drafted      int64   [batch_size, history] drafts proposed in those steps, newest first, -1 = none
      draft_lag           int64   tokens the draft's KV cache lacks, which the row's first draft forward of a
                                  step feeds before drafting: 1 after admission or a step with a rejection, 2
                                  after a step whose drafts were all accepted, one more per step the row did not
                                  draft (backend=hf; the simulator with backend.draft_catch_up). 1 for every row
                                  where the executor charges one token whatever the history (the simulator's
                                  default). Price it with `policies.kit.catch_up_s`.
    During drafting (keep_drafting) and in observe:
      depths              int64   this step's plan (a tree step: each row's tree's depth)
      drafted             int64   drafts proposed so far this step
      confidences         float64 [batch_size, max planned depth] the draft's probability of each token it
                                  proposed, NaN where nothing was drafted (None when no hook needs them;
                                  None on a tree step)
    After the plan, on a step whose plan was a tree plan (specdepth.tree; None on a chain step):
      trees               list    the Tree each row drafts (docs/plugins.md: tree plans)
      nodes               int64   nodes per row (its verify tokens are 1 + nodes)
      node_confidences    float64 [batch_size, most nodes] the draft's probability of each node's token in
                                  node order, NaN padding (after drafting: in observe)
    Price a tree plan before returning it with specdepth.tree.tree_step_time(view.cost, view.context_lens,
    trees) (draft forwards level by level; the verify counts the nodes as drafts).
    From plan on, only for policies with requires_oracle = True (simulator):
      oracle_accept       int64   how many leading draft positions the target will accept this step
    In plan, only for policies with requires_accept_prob = True (simulator):
      accept_prob         float64 [batch_size, max_depth] the true acceptance probability of each of the
                                  step's next draft tokens (from the acceptance model; outcomes unknown)
      expected_accept_prob float64 [batch_size, max_depth] the same as known before the draft proposes the
                                  tokens: averaged over the confidences it may report (acceptance=confidence:
                                  a token's probability is a function of its confidence); equal to accept_prob
                                  for iid, beta and decay (computed on first access). A token's entry of
                                  accept_prob is what its confidence tells once drafted (`oracle_causal` plans
                                  with this, stops with that)
      rank_table          float64 [R] the true per-rank acceptance table (specdepth.tree_acceptance: the
                                  probability that the target's token is the draft's rank-r candidate),
                                  where the acceptance model has one (acceptance=ranked, iid), else None
    In observe (after verification; None before), what this step cost, measured and predicted:
      measured_draft_s    float   seconds of this step's draft forwards as the clock charged them (model
                                  time on backend=sim, including its overhead switches; wall time on hf)
      measured_verify_s   float   seconds of this step's verify forward, likewise
      predicted_draft_s   float   what `cost` predicts for the same draft forwards (at context_lens)
      predicted_verify_s  float   what `cost` predicts for the same verify forward
      draft_forwards      int     draft forwards (positions) run this step
      measured_policy_s   float   seconds the policy's own plan and keep_drafting hooks took this step, where a
                                  step pays them: wall time on backend=hf; on the simulator only with
                                  engine.charge_policy_time, else 0.0 (its clock does not charge them)
    Scalars: step, now_s, batch_size, requests_left (requests of the run's workload not admitted yet, arrived
    or still to arrive: 0 means no request will join the batch again, as in offline batch inference, where
    an engine knows its whole input; a closed batch from its first step, any workload after its last
    admission), token_budget (the shared compute budget in verify tokens per step),
    max_depth (engine cap), max_num_batched_tokens (hard cap on verify tokens), acceptance_prior
    (engine.acceptance_prior: the per-token acceptance rate to assume before any evidence; `acceptance`'s
    prior, and where goodput, batch_scaled and confidence start: a warm start), cost (the cost model: verify_time,
    draft_time, step_time, verify_times, draft_times, target_forward, draft_forward, draft_positions; see
    docs/plugins.md), true_cost (only for
    policies with requires_true_cost = True, simulator: the same methods, priced as the clock charges).
    Arrays are computed on access (those of the rows' ids, contexts and remaining tokens once a step) and cannot
    be written; no attribute can be set.
    """

    __slots__ = ("_rows", "_s", "_budget", "_max_depth", "_max_tokens", "_cost", "_prior", "_hptr", "_pred",
                 "_true_cost", "_clock", "_lag", "_expected", "_rank_table", "_ids", "_ctx", "_rem", "_ones",
                 "_parts", "_kept")

    def __init__(self, rows, token_budget: int, max_depth: int, max_num_batched_tokens: int, cost,
                 prior: float = 0.7, true_cost=None, clock=None, lag=None, expected=None, rank_table=None):
        self._rows, self._budget, self._max_depth, self._max_tokens, self._cost, self._prior = (
            rows, token_budget, max_depth, max_num_batched_tokens, cost, prior)
        self._true_cost = true_cost
        self._clock = clock   # the engine's Clock (measured_policy_s); None: 0.0
        self._lag = lag       # the executor's draft_lag (a callable returning an array, or None); None: ones
        self._expected = expected   # the executor's peek_expected_prob (called with k; on first access, per step)
        self._rank_table = None if rank_table is None else _ro(np.asarray(rank_table, np.float64))
        self._s = None
        self._hptr = 0
        self._pred = None
        self._ids = self._ctx = self._rem = None   # this step's request_ids, context_lens, remaining (`bind` resets)
        self._ones = None   # draft_lag's ones where the executor has no lag (read-only; kept while the size holds)
        self._parts = getattr(cost, "step_parts", None)   # both predictions in one call, where the cost model has it
        self._kept = [None] * 4   # depths' and drafted's step arrays and their read-only views (`_kept_ro`)

    def bind(self, step, hptr: int) -> None:
        """The engine shows the view the step it is running (a `specdepth.engine.Step`). The rows' ids, prompts,
        outputs and generated tokens hold still until the next bind (the engine commits a step after observe), so
        the arrays computed from them are computed once a step, when first read."""
        self._s, self._hptr, self._pred = step, hptr, None
        self._ids = self._ctx = self._rem = None

    # ---- scalars ----------------------------------------------------------------------------------
    step = property(lambda self: self._s.step)
    now_s = property(lambda self: self._s.now_s)
    batch_size = property(lambda self: self._s.batch_size)
    requests_left = property(lambda self: self._s.requests_left)
    token_budget = property(lambda self: self._budget)
    max_depth = property(lambda self: self._max_depth)
    max_num_batched_tokens = property(lambda self: self._max_tokens)
    cost = property(lambda self: self._cost)
    true_cost = property(lambda self: self._true_cost)
    acceptance_prior = property(lambda self: self._prior)

    @property
    def verify_tokens_free(self) -> int:
        """Draft tokens that fit in the token budget this step (0 when the batch alone fills it)."""
        return max(0, self._budget - self._s.batch_size)

    # ---- per sequence -----------------------------------------------------------------------------
    @property
    def request_ids(self):
        if self._ids is None:
            self._ids = _ro(self._rows.request_id)
        return self._ids

    @property
    def context_lens(self):
        if self._ctx is None:
            self._ctx = _ro(self._rows.prompt_len + self._rows.generated)
        return self._ctx

    @property
    def generated(self):
        return _ro(self._rows.generated)

    @property
    def remaining(self):
        if self._rem is None:
            self._rem = _ro(self._rows.output_len - self._rows.generated)
        return self._rem

    @property
    def acceptance(self):
        r = self._rows
        return _ro((r.accepted_w + self._prior) / (r.accepted_w + r.rejected_w + 1.0))

    def _recent(self, ring):
        H = ring.shape[1]
        return _ro(ring[:, (self._hptr - np.arange(H)) % H])

    @property
    def recent_accepted(self):
        return self._recent(self._rows.ring_accepted)

    @property
    def recent_drafted(self):
        return self._recent(self._rows.ring_drafted)

    @property
    def draft_lag(self):
        lag = self._lag() if self._lag is not None else None
        if lag is not None:
            return _ro(np.asarray(lag, np.int64))
        n = self._rows.n
        if self._ones is None or self._ones.shape[0] != n:
            self._ones = _ro(np.ones(n, np.int64))
        return self._ones

    # ---- this step --------------------------------------------------------------------------------
    depths = property(lambda self: _kept_ro(self._s.depths, self._kept, 0))
    drafted = property(lambda self: _kept_ro(self._s.row_drafted, self._kept, 2))
    confidences = property(lambda self: _ro_or_none(self._s.confidences))
    oracle_accept = property(lambda self: _ro_or_none(self._s.oracle_accept))
    accept_prob = property(lambda self: _ro_or_none(self._s.accept_prob))
    rank_table = property(lambda self: self._rank_table)
    nodes = property(lambda self: _ro_or_none(self._s.nodes))
    node_confidences = property(lambda self: _ro_or_none(self._s.node_confidences))

    @property
    def trees(self):
        t = self._s.trees
        return None if t is None else list(t)

    @property
    def expected_accept_prob(self):
        s = self._s
        if s.accept_prob is None:   # the policy does not require them, or the step has no plan yet
            return None
        if s.expected_accept_prob is None and self._expected is not None:   # computed once a step, where read
            s.expected_accept_prob = self._expected(s.accept_prob.shape[1])
        return _ro_or_none(s.expected_accept_prob)
    # after verification (row_accepted set: observe and later) the step's times are final
    measured_draft_s = property(lambda self: self._s.draft_s if self._s.row_accepted is not None else None)
    measured_verify_s = property(lambda self: self._s.verify_s if self._s.row_accepted is not None else None)
    draft_forwards = property(lambda self: self._s.draft_forwards if self._s.row_accepted is not None else None)
    measured_policy_s = property(lambda self: (float(self._clock.policy_s) if self._clock is not None else 0.0)
                                 if self._s.row_accepted is not None else None)

    def _predicted(self, which: int):
        """view.cost's seconds for this step's shapes (0: the draft forwards, 1: the verify), each computed once,
        when first read (a step that drafted nothing has no draft forward: 0 s); both at the first read where the cost
        model prices them in one call (`step_parts`, RooflineCost's)."""
        s = self._s
        if s.row_accepted is None:   # (not verified yet)
            return None
        pred = self._pred
        if pred is None:
            pred = self._pred = [None, None]
            if self._parts is not None and s.trees is None:
                both = self._parts(self.context_lens, s.row_drafted)
                if both is not None:
                    pred[1], pred[0] = float(both[0]), float(both[1])
        t = pred[which]
        if t is None:
            ctx, d = self.context_lens, s.row_drafted
            if s.trees is not None:   # a tree step: specdepth.tree's prices (nodes as the verify's drafts)
                t = (float(self._cost.verify_time(ctx, s.nodes)) if which == 1 else
                     tree_draft_time(self._cost, ctx, s.trees))
            elif which == 1:
                t = float(self._cost.verify_time(ctx, d))
            else:
                t = float(self._cost.draft_positions(ctx, d)[0]) if d.any() else 0.0
            pred[which] = t
        return t

    @property
    def predicted_draft_s(self):
        pred = self._pred   # (set only after verification: `_predicted`)
        return pred[0] if pred is not None and pred[0] is not None else self._predicted(0)

    @property
    def predicted_verify_s(self):
        pred = self._pred
        return pred[1] if pred is not None and pred[1] is not None else self._predicted(1)


def _ro_or_none(a):
    """`_ro(a)` (inline), None where `a` is None."""
    if a is None:
        return None
    v = a.view()
    v.setflags(write=False)
    return v


def _kept_ro(a, kept: list, i: int):
    """A read-only view of the step's array `a` (None: None), kept in kept[i + 1] (`a` in kept[i]) and handed out
    again while the step holds the same array and the view is still read-only: a view, it shows the array's
    current values (the engine counts row_drafted in place while drafting)."""
    if a is kept[i] and a is not None and not kept[i + 1].flags.writeable:
        return kept[i + 1]
    v = kept[i + 1] = _ro_or_none(a)
    kept[i] = a
    return v


def _plain(v):
    return v is None or isinstance(v, (bool, int, float, str)) or (
        isinstance(v, (list, tuple)) and all(_plain(x) for x in v))


class Policy:
    """Base class of depth policies.

    Hooks (called by the engine: reset once before the run, then in this order every step with running
    sequences; keep_drafting and observe only where a subclass overrides them):
      reset()                         clear per-run state
      plan(view) -> depths            required: int array [batch_size], 0 <= depth <= view.max_depth, and
                                      batch_size + sum(depths) <= view.max_num_batched_tokens; or a tree
                                      plan: a specdepth.tree.Tree for every row or a list of one per row
                                      (depth <= view.max_depth, batch_size + total nodes within the cap;
                                      executors with supports_trees; docs/plugins.md)
      keep_drafting(view, position, confidence) -> mask
                                      after draft position `position` (0-based); `confidence` is float
                                      [batch_size], NaN for rows not drafting; rows whose mask is False stop
                                      (the token just drafted is still verified). Default: keep all.
      observe(view, accepted)         accepted drafts per row after verification (a tree step: the accepted
                                      path's nodes). Default: nothing.
    Set `requires_oracle = True` to receive `view.oracle_accept`, `requires_accept_prob = True` for
    `view.accept_prob` and `view.expected_accept_prob`, `requires_true_cost = True` for `view.true_cost` (each
    simulator only). Set `depth_param` (or override depth_bound) to have a configuration deeper than
    engine.max_depth refused before the run. A hook that raises, or an answer the engine cannot execute, fails
    the run with a PolicyError naming the policy and the hook.
    Attributes whose names start with `_` are private state; the public ones form the label.
    """

    name: str | None = None
    requires_oracle: bool = False
    requires_accept_prob: bool = False
    requires_true_cost: bool = False
    #: the parameter bounding the deepest plan (see depth_bound), e.g. "depth" or "max_depth"
    depth_param: str | None = None

    def reset(self) -> None:
        """Called once before a run starts. Clear per-run state here."""

    def plan(self, view: StepView) -> np.ndarray:
        raise NotImplementedError(f"{type(self).__name__} must implement plan(view)")

    def keep_drafting(self, view: StepView, position: int, confidence: np.ndarray) -> np.ndarray:
        return np.ones(view.batch_size, dtype=bool)

    def observe(self, view: StepView, accepted: np.ndarray) -> None:
        pass

    def depth_bound(self) -> tuple[str, int] | None:
        """The parameter that bounds this policy's deepest plan, and its value: ("depth", 4). The app refuses
        (PolicyError) a policy whose bound exceeds engine.max_depth rather than let the engine's cap change
        what the policy's label says it does. Default: the attribute named by `depth_param`; None (no such
        parameter, as for most user policies): every plan is still checked by the engine."""
        if self.depth_param is None:
            return None
        return self.depth_param, int(getattr(self, self.depth_param))

    @property
    def label(self) -> str:
        """Short name plus the public parameters that differ from their defaults, e.g.
        `confidence(threshold=0.7)`; used in summaries and reports."""
        import inspect
        base = self.name or type(self).__name__
        try:
            defaults = {k: p.default for k, p in inspect.signature(type(self).__init__).parameters.items()}
        except (TypeError, ValueError):
            defaults = {}
        params = {k: v for k, v in vars(self).items()
                  if not k.startswith("_") and _plain(v) and defaults.get(k, inspect.Parameter.empty) != v}
        if not params:
            return base
        return base + "(" + ",".join(f"{k}={v}" for k, v in params.items()) + ")"
