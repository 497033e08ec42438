"""Plug-ins as someone outside the project writes them: from docs/plugins.md alone, importing only the public
API (specdepth.Policy, specdepth.cost.CostModel, specdepth.acceptance.AcceptanceModel,
specdepth.executor.Executor) and numpy. One of each protocol, plus the previous release's forms and a few that
break the protocol on purpose (tests/plugins/test_plugins.py)."""
from __future__ import annotations

import numpy as np

from specdepth import Policy
from specdepth.acceptance import AcceptanceModel
from specdepth.cost import CostModel
from specdepth.executor import Executor


# ---- a policy ----------------------------------------------------------------------------------------------
class SpreadBudget(Policy):
    """The step's free verify tokens split evenly over the rows, at most `depth` each and never past a row's
    end; a row stops drafting once the draft's confidence falls below `stop_below`."""

    name = "spread_budget"
    depth_param = "depth"

    def __init__(self, depth: int = 4, stop_below: float = 0.0):
        self.depth, self.stop_below = int(depth), float(stop_below)

    def reset(self) -> None:
        self._accepted = self._drafted = 0

    def plan(self, view):
        n = view.batch_size
        each = min(self.depth, view.max_depth, view.verify_tokens_free // max(n, 1))
        return np.minimum(np.full(n, each, np.int64), np.maximum(view.remaining - 1, 0))

    def keep_drafting(self, view, position, confidence):
        return ~(confidence < self.stop_below)

    def observe(self, view, accepted):
        self._accepted += int(accepted.sum())
        self._drafted += int(view.drafted.sum())


# ---- a cost model ------------------------------------------------------------------------------------------
class LinearCost(CostModel):
    """A forward costs a fixed part plus a part per query token and per cached token read; a draft forward
    costs `draft_ratio` x what the same target forward costs."""

    def __init__(self, target, draft=None, fixed_s: float = 5e-3, per_token_s: float = 2e-5,
                 per_context_s: float = 1e-8, draft_ratio: float = 0.1):
        super().__init__(target, draft)
        self.fixed_s, self.per_token_s, self.per_context_s = fixed_s, per_token_s, per_context_s
        self.draft_ratio = draft_ratio

    def _time(self, which, tokens, flops, ctx_tokens, seqs):
        t = self.fixed_s + self.per_token_s * tokens + self.per_context_s * ctx_tokens
        return t if which == "target" else t * self.draft_ratio


# ---- an acceptance model -----------------------------------------------------------------------------------
def _outcomes(ids, pos, rate):
    """accepted[i, j] for request ids[i] at output position pos[i, j]: a fixed pattern, a `rate` share
    accepted (the same for every policy and step)."""
    u = ((ids[:, None] * 7919 + pos * 104729) % 1000) / 1000.0
    return u < rate


class Positional(AcceptanceModel):
    """The draft token at output position m of request r is accepted by a fixed pattern of (r, m) with rate
    `rate`; its confidence is `rate`."""

    COLUMNS = (("pos_request", np.int64), ("pos_next", np.int64))

    def __init__(self, rate: float = 0.7):
        self.rate = float(rate)

    def admit(self, request_ids, new=None):
        self.rows.pos_request[new] = request_ids
        self.rows.pos_next[new] = 0

    def sample(self, n, k):
        pos = self.rows.pos_next[:, None] + np.arange(k)
        return np.full((n, k), self.rate), _outcomes(self.rows.pos_request, pos, self.rate)

    def commit(self, drafted, accepted):
        self.rows.pos_next += accepted + 1


class OldPositional(AcceptanceModel):
    """Positional in the previous release's form: rows of its own, admit(request_ids) and retire(keep)."""

    def __init__(self, rate: float = 0.7):
        self.rate = float(rate)

    def reset(self, rng):
        super().reset(rng)
        self.ids, self.pos = np.zeros(0, np.int64), np.zeros(0, np.int64)

    def admit(self, request_ids):
        ids = np.asarray(request_ids, np.int64)
        self.ids = np.concatenate([self.ids, ids])
        self.pos = np.concatenate([self.pos, np.zeros(ids.size, np.int64)])

    def retire(self, keep):
        self.ids, self.pos = self.ids[keep], self.pos[keep]

    def sample(self, n, k):
        pos = self.pos[:, None] + np.arange(k)
        return np.full((n, k), self.rate), _outcomes(self.ids, pos, self.rate)

    def commit(self, drafted, accepted):
        self.pos = self.pos + accepted + 1


# ---- an executor -------------------------------------------------------------------------------------------
class ToyExecutor(Executor):
    """A model-clock backend with fixed forward times: a draft token at position j of a step is accepted
    while (request id + tokens generated + j) % `period` != 0."""

    name = "toy"
    clock = "model"

    def __init__(self, period: int = 4, prefill_s: float = 1e-3, draft_s: float = 1e-4, verify_s: float = 1e-3):
        self.period, self.prefill_s, self.draft_s, self.verify_s = int(period), prefill_s, draft_s, verify_s
        self.log = []

    def attach(self, rows):
        rows.add("toy_generated")
        rows.on_retire(lambda keep: self.log.append(int((~keep).sum())))
        self.rows = rows

    def prefill(self, requests, new):
        self.rows.toy_generated[new] = 1
        return self.prefill_s * len(requests), 0.0, 0.0

    def draft(self, rows, position):
        return np.full(rows.size, 0.8), self.draft_s, 0.0

    def verify(self, drafted):
        r = self.rows
        accepted = np.zeros(drafted.shape[0], np.int64)
        alive = np.ones(drafted.shape[0], bool)
        for j in range(int(drafted.max(initial=0))):
            alive &= (drafted > j) & ((r.request_id + r.toy_generated + j) % self.period != 0)
            accepted += alive
        r.toy_generated += accepted + 1
        return accepted, self.verify_s, 0.0

    def finish(self):
        return {}


class OldToyExecutor(ToyExecutor):
    """ToyExecutor in the previous release's form: check(requests), prefill(requests) appending rows of its
    own, begin_step(depths) and retire(keep); no attach."""

    def __init__(self, period: int = 4):
        super().__init__(period)
        self.ids, self.gen = np.zeros(0, np.int64), np.zeros(0, np.int64)
        self.checked = self.steps = 0

    attach = Executor.attach   # the previous release had no attach: the base class's, which does nothing

    def check(self, requests):
        self.checked = len(requests)

    def prefill(self, requests):
        self.ids = np.concatenate([self.ids, [r.request_id for r in requests]]).astype(np.int64)
        self.gen = np.concatenate([self.gen, np.ones(len(requests), np.int64)])
        return self.prefill_s * len(requests), 0.0, 0.0

    def begin_step(self, depths):
        self.steps += 1

    def verify(self, drafted):
        accepted = np.zeros(drafted.shape[0], np.int64)
        alive = np.ones(drafted.shape[0], bool)
        for j in range(int(drafted.max(initial=0))):
            alive &= (drafted > j) & ((self.ids + self.gen + j) % self.period != 0)
            accepted += alive
        self.gen = self.gen + accepted + 1
        return accepted, self.verify_s, 0.0

    def retire(self, keep):
        self.ids, self.gen = self.ids[keep], self.gen[keep]


# ---- plug-ins that break their protocol --------------------------------------------------------------------
class NoViewPolicy(Policy):
    def plan(self):   # the protocol's plan takes the view
        return np.zeros(0, np.int64)


class PairTimeCost(LinearCost):
    def _time(self, which, tokens, flops, ctx_tokens, seqs):   # seconds must be one number
        return super()._time(which, tokens, flops, ctx_tokens, seqs), 0.0


class OneArraySample(Positional):
    def sample(self, n, k):   # the protocol's sample returns (confidence, accepted)
        return super().sample(n, k)[1]


class ShortCommit(Positional):
    def commit(self, drafted):   # the protocol's commit takes (drafted, accepted)
        self.rows.pos_next += drafted + 1


class TwoTupleVerify(ToyExecutor):
    def verify(self, drafted):   # the protocol's verify returns (accepted, seconds, flops)
        return super().verify(drafted)[:2]


class OverAccepting(ToyExecutor):
    def verify(self, drafted):   # more accepted drafts than drafted
        accepted, t, f = super().verify(drafted)
        return accepted + 1, t, f
