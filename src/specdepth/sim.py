"""The simulator executor: numpy only, vectorised over the batch. Time comes from a cost model,
acceptance from an acceptance model. It plugs into the same engine loop as the real backend."""
from __future__ import annotations

import numpy as np

from . import _kernels as _k
from .acceptance import AcceptanceModel
from .cost import CostModel
from .errors import as_float
from .executor import Executor


class SimExecutor(Executor):
    name = "sim"
    clock = "model"
    supports_oracle = True

    def __init__(self, cost: CostModel, acceptance: AcceptanceModel, seed: int = 0, step_overhead_s: float = 0.0,
                 position_overhead_s: float = 0.0, **_):
        self.cost = cost
        # a real backend's fixed costs outside the model forwards (engine and policy bookkeeping, sampling,
        # host copies), which a cost model of forwards alone does not see: seconds per step (charged with
        # the verify) and per draft position (charged with the draft). 0 = forwards only (the default).
        self.step_overhead_s = as_float(step_overhead_s, "backend.step_overhead_s", min=0)
        self.position_overhead_s = as_float(position_overhead_s, "backend.position_overhead_s", min=0)
        self.acceptance = acceptance
        self.rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0x51D]))
        acceptance.reset(self.rng)
        self.ctx = np.empty(0, np.int64)   # tokens in each row's KV cache
        self._conf = self._acc = None      # this step's (confidence, accepted) block

    def prefill(self, requests):
        plen = np.array([r.prompt_len for r in requests], np.int64)
        zeros = np.zeros_like(plen)
        t1, f1 = self.cost.target_forward(zeros, plen)
        t2, f2 = self.cost.draft_forward(zeros, plen)
        self.ctx = np.concatenate([self.ctx, plen])
        self.acceptance.admit(np.fromiter((r.request_id for r in requests), np.int64, len(requests)))
        return t1 + t2, f1, f2

    def _sample(self, k: int):
        self._conf, self._acc = self.acceptance.sample(self.ctx.size, k)

    def peek_accepted(self, k):
        self._sample(k)
        return _k.leading_run(self._acc)

    def begin_step(self, depths):
        k = _k.depth_stats(depths)[1] if depths.dtype == np.int64 else int(depths.max(initial=0))
        if k and (self._acc is None or self._acc.shape[1] < k):
            self._sample(k)

    def draft(self, rows, position):
        t, f = self.cost.draft_forward(self.ctx[rows] + position)
        return self._conf[rows, position], t + self.position_overhead_s, f

    def draft_block(self, depths):
        t, f = self.cost.draft_positions(self.ctx, depths)
        if self.position_overhead_s:
            t += self.position_overhead_s * int(depths.max(initial=0))
        return t, f

    def verify(self, drafted):
        t, f = self.cost.target_forward(self.ctx, drafted + 1)
        t += self.step_overhead_s
        if self._acc is None:   # nothing drafted this step: one token each
            accepted = np.zeros_like(drafted)
            self.ctx += 1
        else:
            # leading accepted positions, at most the drafts; ctx advances by those + 1
            accepted = _k.leading_accepted(self._acc, drafted, self.ctx)
            self._conf = self._acc = None
        self.acceptance.commit(drafted, accepted)
        return accepted, t, f

    def retire(self, keep):
        self.ctx = self.ctx[keep]
        self.acceptance.retire(keep)
