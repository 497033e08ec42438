"""The simulator executor: numpy only, vectorised over the batch. Time comes from a cost model,
acceptance from an acceptance model. It plugs into the same engine loop as the real backend."""
from __future__ import annotations

import numpy as np

from . import _kernels as _k
from .acceptance import AcceptanceModel
from .cost import CostModel, TableCost
from .errors import ConfigError, as_float
from .executor import Executor


class SimExecutor(Executor):
    name = "sim"
    clock = "model"
    supports_oracle = True

    def __init__(self, cost: CostModel, acceptance: AcceptanceModel, seed: int = 0, step_overhead_s: float = 0.0,
                 position_overhead_s: float = 0.0, pad_ragged: bool = False, clock_profile: str | None = None,
                 draft_catch_up: bool = False, **_):
        self.cost = cost
        # a real backend's fixed costs outside the model forwards (engine and policy bookkeeping, sampling,
        # host copies), which a cost model of forwards alone does not see: seconds per step (charged with
        # the verify) and per draft position (charged with the draft). 0 = forwards only (the default).
        self.step_overhead_s = as_float(step_overhead_s, "backend.step_overhead_s", min=0)
        self.position_overhead_s = as_float(position_overhead_s, "backend.position_overhead_s", min=0)
        # pad_ragged: charge each forward as the backend=hf executor runs it, right-padded (every row carries
        # the step's largest query and attends over the largest context), instead of as a packed ragged batch
        self.pad_ragged = bool(pad_ragged)
        # clock_profile: a specdepth-profile CSV whose times the simulated clock charges; the policies still
        # see `cost` (view.cost). None = the clock charges `cost` too.
        self.clock_cost = cost
        if clock_profile:
            try:
                self.clock_cost = TableCost(cost.target, cost.draft, path=str(clock_profile))
            except ConfigError as e:
                raise ConfigError(str(e).replace("cost.path", "backend.clock_profile", 1)) from None
        # draft_catch_up: the draft's first forward of a step also feeds the tokens its KV cache lacks, as
        # backend=hf runs it: 2 after a fully accepted step (the last draft and the bonus token), 1 after a
        # rejection, one more for every step the row did not draft. False = one token (the default).
        self.catch_up = bool(draft_catch_up)
        self._exact = self.clock_cost is cost and not self.pad_ragged   # time and FLOPs from one call
        self.acceptance = acceptance
        self.rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0x51D]))
        acceptance.reset(self.rng)
        self.ctx = np.empty(0, np.int64)   # tokens in each row's KV cache
        self.lag = np.empty(0, np.int64)   # tokens the draft's cache lacks (draft_catch_up)
        self._conf = self._acc = None      # this step's (confidence, accepted) block

    def _pad(self, ctx, q=None):
        """(ctx, q) as the padded forward runs them: every row at the largest context and query."""
        n = ctx.shape[0]
        return (np.full(n, ctx.max(initial=0), np.int64),
                None if q is None else np.full(n, q.max(initial=1), np.int64))

    def _forward(self, which: str, ctx, q=None):
        fwd = self.cost.target_forward if which == "target" else self.cost.draft_forward
        if self._exact:
            return fwd(ctx, q)
        flops = fwd(ctx, q)[1]
        if self.pad_ragged:
            ctx, q = self._pad(ctx, q)
        clk = self.clock_cost.target_forward if which == "target" else self.clock_cost.draft_forward
        return clk(ctx, q)[0], flops

    def prefill(self, requests):
        plen = np.array([r.prompt_len for r in requests], np.int64)
        zeros = np.zeros_like(plen)
        t1, f1 = self._forward("target", zeros, plen)
        t2, f2 = self._forward("draft", zeros, plen)
        self.ctx = np.concatenate([self.ctx, plen])
        if self.catch_up:   # the draft prefilled the prompt; the target's first token is not in its cache
            self.lag = np.concatenate([self.lag, np.ones_like(plen)])
        self.acceptance.admit(np.fromiter((r.request_id for r in requests), np.int64, len(requests)))
        return t1 + t2, f1, f2

    def _sample(self, k: int):
        self._conf, self._acc = self.acceptance.sample(self.ctx.size, k)

    def peek_accepted(self, k):
        self._sample(k)
        return _k.leading_run(self._acc)

    def peek_accept_prob(self, k):
        self._sample(k)
        return self.acceptance.probability(self._conf)

    def true_cost(self):
        return ClockCost(self)

    def begin_step(self, depths):
        k = _k.depth_stats(depths)[1] if depths.dtype == np.int64 else int(depths.max(initial=0))
        if k and (self._acc is None or self._acc.shape[1] < k):
            self._sample(k)

    def draft(self, rows, position):
        q = self.lag[rows] if self.catch_up and position == 0 else None
        t, f = self._forward("draft", self.ctx[rows] + position, q)
        return self._conf[rows, position], t + self.position_overhead_s, f

    def draft_block(self, depths):
        if self.catch_up:   # position 0 with each row's catch-up tokens, then one token per position
            m = np.flatnonzero(depths > 0)
            t, f = self._forward("draft", self.ctx[m], self.lag[m])
            ctx, rest = self.ctx[m] + 1, depths[m] - 1
            f += self.cost.draft_positions(ctx, rest)[1]
            if self.pad_ragged:
                ctx = self._pad(ctx)[0]
            t += self.clock_cost.draft_positions(ctx, rest)[0]
        elif self._exact:
            t, f = self.cost.draft_positions(self.ctx, depths)
        else:
            f = self.cost.draft_positions(self.ctx, depths)[1]
            ctx = self._pad(self.ctx)[0] if self.pad_ragged else self.ctx
            t = self.clock_cost.draft_positions(ctx, depths)[0]
        if self.position_overhead_s:
            t += self.position_overhead_s * int(depths.max(initial=0))
        return t, f

    def verify(self, drafted):
        t, f = self._forward("target", self.ctx, drafted + 1)
        t += self.step_overhead_s
        if self._acc is None:   # nothing drafted this step: one token each
            accepted = np.zeros_like(drafted)
            self.ctx += 1
        else:
            # leading accepted positions, at most the drafts; ctx advances by those + 1
            accepted = _k.leading_accepted(self._acc, drafted, self.ctx)
            self._conf = self._acc = None
        if self.catch_up:
            self.lag = np.where(drafted > 0, 1 + (accepted >= drafted), self.lag + 1)
        self.acceptance.commit(drafted, accepted)
        return accepted, t, f

    def retire(self, keep):
        self.ctx = self.ctx[keep]
        if self.catch_up:
            self.lag = self.lag[keep]
        self.acceptance.retire(keep)


class ClockCost:
    """What this simulator's clock charges, with view.cost's methods (the `true cost` of oracle_expected and
    `goodput cost=clock`): the clock's cost model (backend.clock_profile, else the run's), padded forwards
    (backend.pad_ragged) and the fixed seconds per step (with the verify) and per draft position. Not
    modelled: the draft's catch-up tokens (backend.draft_catch_up), which depend on each row's history."""

    def __init__(self, ex: SimExecutor):
        self._ex = ex
        self.target, self.draft = ex.cost.target, ex.cost.draft

    def verify_time(self, ctx, depths):
        ex = self._ex
        return ex._forward("target", np.asarray(ctx), np.asarray(depths) + 1)[0] + ex.step_overhead_s

    def draft_time(self, ctx):
        ex = self._ex
        return ex._forward("draft", np.asarray(ctx))[0] + ex.position_overhead_s if len(ctx) else 0.0

    def draft_positions(self, ctx, depths):
        ctx, depths = np.asarray(ctx), np.asarray(depths)
        t = sum(self.draft_time(ctx[depths > p] + p) for p in range(int(depths.max(initial=0))))
        return t, self._ex.cost.draft_positions(ctx, depths)[1]

    def step_time(self, ctx, depths):
        return self.verify_time(ctx, depths) + self.draft_positions(ctx, depths)[0]
