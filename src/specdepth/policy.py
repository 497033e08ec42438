"""The policy protocol: what a depth policy sees each step and the hooks it implements.

Subclass `Policy`, implement `plan`, optionally `keep_drafting` and `observe`, and point a config at it:

    specdepth policy._target_=mypkg.mypolicy.MyPolicy +policy.my_param=3

A policy should import only this module and numpy. Everything it needs arrives in the `StepView`.
"""
from __future__ import annotations

import numpy as np


def _ro(a: np.ndarray) -> np.ndarray:
    v = a.view()
    v.flags.writeable = False
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
    During drafting (keep_drafting) and in observe:
      depths              int64   this step's plan
      drafted             int64   drafts proposed so far this step
      confidences         float64 [batch_size, max planned depth] the draft's probability of each token it
                                  proposed, NaN where nothing was drafted
      oracle_accept       int64   only for policies with requires_oracle = True (simulator): how many
                                  leading draft positions the target will accept this step
    In plan, only for policies with requires_accept_prob = True (simulator):
      accept_prob         float64 [batch_size, max_depth] the true acceptance probability of each of the
                                  step's next draft tokens (from the acceptance model; outcomes unknown)
    In observe (this step's costs; on backend=sim model seconds as the clock charged them, overheads,
    padding and catch-up included; on backend=hf wall seconds):
      measured_draft_s    float   seconds of this step's draft forwards
      measured_verify_s   float   seconds of this step's verify forward
      predicted_draft_s   float   what view.cost predicts for the same draft forwards, at context_lens
      predicted_verify_s  float   what view.cost predicts for the same verify, at context_lens
      draft_forwards      int     draft positions run (draft forwards) this step
    Scalars: step, now_s, batch_size, token_budget (the shared compute budget in verify tokens per step),
    max_depth (engine cap), max_num_batched_tokens (hard cap on verify tokens), cost (the cost model:
    cost.verify_time(ctx, depths), cost.draft_time(ctx), cost.step_time(ctx, depths)), true_cost (only
    for policies with requires_true_cost = True, simulator: the same methods, priced as the clock charges).
    Arrays are computed on access and cannot be written.
    """

    __slots__ = ("step", "now_s", "batch_size", "token_budget", "max_depth", "max_num_batched_tokens", "cost",
                 "_st", "_depths", "_drafted", "_conf", "_oracle", "_accept_prob", "_measured", "true_cost")

    def __init__(self, state, token_budget: int, max_depth: int, max_num_batched_tokens: int, cost):
        self._st = state
        self.token_budget, self.max_depth, self.max_num_batched_tokens, self.cost = (
            token_budget, max_depth, max_num_batched_tokens, cost)
        self.step, self.now_s, self.batch_size = 0, 0.0, 0
        self._depths = self._drafted = self._conf = self._oracle = self._accept_prob = self._measured = None
        self.true_cost = None

    @property
    def request_ids(self):
        return _ro(self._st.rid)

    @property
    def context_lens(self):
        return _ro(self._st.plen + self._st.gen)

    @property
    def generated(self):
        return _ro(self._st.gen)

    @property
    def remaining(self):
        return _ro(self._st.olen - self._st.gen)

    @property
    def acceptance(self):
        return _ro(self._st.acceptance())

    @property
    def recent_accepted(self):
        return _ro(self._st.recent(self._st.hacc))

    @property
    def recent_drafted(self):
        return _ro(self._st.recent(self._st.hdr))

    @property
    def depths(self):
        return None if self._depths is None else _ro(self._depths)

    @property
    def drafted(self):
        return None if self._drafted is None else _ro(self._drafted)

    @property
    def confidences(self):
        return None if self._conf is None else _ro(self._conf)

    @property
    def oracle_accept(self):
        return None if self._oracle is None else _ro(self._oracle)

    def _step_cost(self, name: str):
        """This step's measured and predicted costs (set after verification; None before). Predictions are
        computed on access, so a policy that does not read them costs the engine nothing."""
        m = self._measured
        if m is None:
            return None
        if name.startswith("measured"):
            return m[0] if name == "measured_draft_s" else m[1]
        if name == "draft_forwards":
            return int(self._drafted.max(initial=0))
        ctx = self._st.plen + self._st.gen
        if name == "predicted_draft_s":
            return float(self.cost.draft_positions(ctx, self._drafted)[0])
        return float(self.cost.verify_time(ctx, self._drafted))

    @property
    def verify_tokens_free(self) -> int:
        """Draft tokens that fit in the token budget this step (0 when the batch alone fills it)."""
        return max(0, self.token_budget - self.batch_size)


StepView.accept_prob = property(lambda v: None if v._accept_prob is None else _ro(v._accept_prob),
                                doc="true acceptance probabilities of the step's draft tokens (requires_accept_prob)")
for _name in ("measured_draft_s", "measured_verify_s", "predicted_draft_s", "predicted_verify_s", "draft_forwards"):
    setattr(StepView, _name, property(lambda v, n=_name: v._step_cost(n), doc=f"this step's {_name} (observe)"))


def _plain(v):
    return v is None or isinstance(v, (bool, int, float, str)) or (
        isinstance(v, (list, tuple)) and all(_plain(x) for x in v))


class Policy:
    """Base class of depth policies.

    Hooks (called by the engine, in this order, every step):
      plan(view) -> depths            required: int array [batch_size], 0 <= depth <= view.max_depth, and
                                      batch_size + sum(depths) <= view.max_num_batched_tokens
      keep_drafting(view, position, confidence) -> mask
                                      after draft position `position` (0-based); `confidence` is float
                                      [batch_size], NaN for rows not drafting; rows whose mask is False stop
                                      (the token just drafted is still verified). Default: keep all.
      observe(view, accepted)         accepted drafts per row after verification. Default: nothing.
    Set `requires_oracle = True` to receive `view.oracle_accept`, `requires_accept_prob = True` for
    `view.accept_prob`, `requires_true_cost = True` for `view.true_cost` (each simulator only).
    Attributes whose names start with `_` are private state; the public ones form the label.
    """

    name: str | None = None
    requires_oracle: bool = False
    requires_accept_prob: bool = False
    requires_true_cost: bool = False

    def reset(self) -> None:
        """Called once before a run starts. Clear per-run state here."""

    def plan(self, view: StepView) -> np.ndarray:
        raise NotImplementedError(f"{type(self).__name__} must implement plan(view)")

    def keep_drafting(self, view: StepView, position: int, confidence: np.ndarray) -> np.ndarray:
        return np.ones(view.batch_size, dtype=bool)

    def observe(self, view: StepView, accepted: np.ndarray) -> None:
        pass

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
