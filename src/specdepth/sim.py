"""The simulator executor: numpy only, vectorised over the batch. Time comes from a cost model,
acceptance from an acceptance model. It plugs into the same engine loop as the real backend.

Tree plans (specdepth.tree) run where the acceptance model has a per-rank table (acceptance=ranked, iid):
the draft is charged level by level as tree.tree_draft prices it, the verify with each row's nodes as its
drafts, and the accepted path is tree_acceptance.TreeAcceptance's walk over the model's own keyed uniforms
(by request and output position), so every policy, chain or tree, faces the same target tokens."""
from __future__ import annotations

import numpy as np

from . import _kernels as _k
from .acceptance import AcceptanceModel
from .cost import CostModel, TableCost
from .errors import ConfigError, as_bool, as_float
from .executor import Executor, prefill_groups, prefill_price
from .timing import SimulatedOutcomes
from .tree import tree_draft, tree_nodes


class SimExecutor(Executor):
    name = "sim"
    clock = "model"
    supports_oracle = True

    def __init__(self, cost: CostModel, acceptance_model: AcceptanceModel, seed: int = 0, step_overhead_s: float = 0.0,
                 position_overhead_s: float = 0.0, pad_ragged: bool = False, clock_profile: str | None = None,
                 draft_catch_up: bool = False, model=None, group_prefill: bool = True):
        self.cost = cost
        # a real backend's fixed costs outside the model forwards (engine and policy bookkeeping, sampling,
        # host copies), which a cost model of forwards alone does not see: seconds per step (charged with
        # the verify) and per draft position (charged with the draft). 0 = forwards only (the default).
        self.step_overhead_s = as_float(step_overhead_s, "backend.step_overhead_s", min=0)
        self.position_overhead_s = as_float(position_overhead_s, "backend.position_overhead_s", min=0)
        # pad_ragged: charge each forward as the backend=hf executor runs it, right-padded (every row carries
        # the step's largest query and attends over the largest context), instead of as a packed ragged batch
        self.pad_ragged = bool(pad_ragged)
        # group_prefill (with pad_ragged): the admitted prompts prefill in groups of similar length, one padded
        # forward a group, split as backend=hf splits them (executor.prefill_groups priced by `cost`); each
        # further group's two forwards pay position_overhead_s. false: one padded forward for all. A packed
        # batch needs no groups.
        self.group_prefill = as_bool(group_prefill, "backend.group_prefill")
        # clock_profile: a specdepth-profile CSV whose times the simulated clock charges; the policies still
        # see `cost` (view.cost). None = the clock charges `cost` too.
        self.clock_cost = cost
        if clock_profile:
            try:
                self.clock_cost = TableCost(cost.target, cost.draft, path=str(clock_profile),
                                            model_name=getattr(model, "name", None))
            except ConfigError as e:
                raise ConfigError(str(e).replace("cost.path", "backend.clock_profile", 1)) from None
        # draft_catch_up: the draft's first forward of a step also feeds the tokens its KV cache lacks, as
        # backend=hf runs it: 2 after a fully accepted step (the last draft and the bonus token), 1 after a
        # rejection, one more for every step the row did not draft. False = one token (the default).
        self.catch_up = bool(draft_catch_up)
        # a clock profile with draft_next rows (specdepth-profile interleave=true) charges a step's first draft
        # forward from its draft rows (timed after a target forward, as backend=hf runs it) and the later
        # ones (positions >= 1) from its draft_next rows (timed after a draft forward)
        self._next = bool(getattr(self.clock_cost, "has_draft_next", False))
        self._exact = self.clock_cost is cost and not self.pad_ragged and not self._next   # time and FLOPs at once
        self.outcomes = SimulatedOutcomes(acceptance_model, seed)   # the model's (confidence, accepted) blocks
        self._table, self._tree_acc = self.outcomes.table, self.outcomes.tree   # tree plans (None: chains only)
        self._depths = None
        self.rows = None
        self._kmax = -1   # the step's deepest plan (begin_step); -1 before the first
        self._ones = np.ones(0, np.int64)   # the verify's query (one token per row) of a step with no drafts

    def attach(self, rows):
        rows.add("sim_ctx")        # tokens in each row's KV cache
        rows.add("sim_lag")        # tokens the draft's cache lacks (draft_catch_up)
        self.outcomes.attach(rows)
        self.rows = rows

    def _pad(self, ctx, q=None):
        """(ctx, q) as the padded forward runs them: every row at the largest context and query."""
        n = ctx.shape[0]
        return (np.full(n, ctx.max(initial=0), np.int64),
                None if q is None else np.full(n, q.max(initial=1), np.int64))

    def _forward(self, which: str, ctx, q=None, position: int = 0):
        fwd = self.cost.target_forward if which == "target" else self.cost.draft_forward
        if self._exact:
            return fwd(ctx, q)
        flops = fwd(ctx, q)[1]
        if self.pad_ragged:
            ctx, q = self._pad(ctx, q)
        if which == "target":
            clk = self.clock_cost.target_forward
        elif position and self._next:
            clk = self.clock_cost.next_draft_forward
        else:
            clk = self.clock_cost.draft_forward
        return clk(ctx, q)[0], flops

    def prefill(self, requests, new):
        plen = self.rows.prompt_len[new]
        if self.pad_ragged and self.group_prefill:
            groups = prefill_groups(plen, prefill_price(self.cost))   # as backend=hf decides
        else:
            groups = [slice(None)]
        t1 = t2 = f1 = f2 = 0.0
        for g in groups:
            zeros = np.zeros(plen[g].shape[0], np.int64)
            t, f = self._forward("target", zeros, plen[g])
            t1, f1 = t1 + t, f1 + f
            t, f = self._forward("draft", zeros, plen[g])
            t2, f2 = t2 + t, f2 + f
        t1 += 2 * self.position_overhead_s * (len(groups) - 1)   # each further group's two forwards
        self.rows.sim_ctx[new] = plen
        if self.catch_up:   # the draft prefilled the prompt; the target's first token is not in its cache
            self.rows.sim_lag[new] = 1
        self.outcomes.admit(self.rows.request_id[new], new)
        return t1 + t2, f1, f2

    def peek_accepted(self, k):
        return self.outcomes.peek(k)

    def peek_accept_prob(self, k):
        return self.outcomes.peek_prob(k)

    def peek_expected_prob(self, k):
        return self.outcomes.peek_expected_prob(k)

    def true_cost(self):
        return ClockCost(self)

    def draft_lag(self):
        return self.rows.sim_lag if self.catch_up else None   # without draft_catch_up the clock charges 1 token

    def begin_step(self, depths, kmax):
        self._kmax, self._depths = kmax, depths
        self.outcomes.begin_step(kmax)

    def draft(self, rows, position):
        r = self.rows
        q = r.sim_lag[rows] if self.catch_up and position == 0 else None
        t, f = self._forward("draft", r.sim_ctx[rows] + position, q, position)
        return self.outcomes.confidence(rows, position), t + self.position_overhead_s, f

    def draft_block(self, depths):
        if self.catch_up or self._next:   # position 0 (with each row's catch-up tokens), then one token per position
            m = np.flatnonzero(depths > 0)
            t, f = self._forward("draft", self.rows.sim_ctx[m], self.rows.sim_lag[m] if self.catch_up else None)
            ctx, rest = self.rows.sim_ctx[m] + 1, depths[m] - 1
            f += self.cost.draft_positions(ctx, rest)[1]
            if self.pad_ragged:
                ctx = self._pad(ctx)[0]
            t += (self.clock_cost.next_draft_positions if self._next else self.clock_cost.draft_positions)(
                ctx, rest)[0]
        elif self._exact:
            t, f = self.cost.draft_positions(self.rows.sim_ctx, depths)
        else:
            ctx = self.rows.sim_ctx
            f = self.cost.draft_positions(ctx, depths)[1]
            ctx = self._pad(ctx)[0] if self.pad_ragged else ctx
            t = self.clock_cost.draft_positions(ctx, depths)[0]
        if self.position_overhead_s:
            t += self.position_overhead_s * int(depths.max(initial=0))
        return t, f

    def verify(self, drafted):
        ctx = self.rows.sim_ctx
        if self._kmax:
            q = drafted + 1
        else:   # nobody drafted: a read-only vector of ones (drafted + 1 costs more than the rest of a
            n = ctx.shape[0]   # step of `none`'s verify at batch 256)
            if self._ones.shape[0] < n:
                self._ones = np.ones(max(n, 2 * self._ones.shape[0]), np.int64)
                self._ones.flags.writeable = False
            q = self._ones[:n]
        t, f = self._forward("target", ctx, q)
        t += self.step_overhead_s
        accepted = self.outcomes.decide(drafted, ctx)   # at most the drafts; ctx advances by those + 1
        if self.catch_up:
            lag = self.rows.sim_lag
            lag[:] = np.where(drafted > 0, 1 + (accepted >= drafted), lag + 1)
        return accepted, t, f

    # ---- tree plans ----------------------------------------------------------------------------------
    @property
    def supports_trees(self) -> bool:
        return self._table is not None

    def tree_refusal(self) -> str:
        return (f"acceptance model {type(self.outcomes.model).__name__} has no per-rank table: tree plans run "
                f"under acceptance=ranked (or acceptance=iid)")

    def rank_table(self):
        return self._table

    def draft_tree(self, trees):
        """Level by level as tree.tree_draft prices it (the first level feeds each row's catch-up tokens with
        backend.draft_catch_up), each level paying position_overhead_s. A node's confidence is the rank
        table's entry of its rank (0 past the table)."""
        if self._table is None:
            raise ConfigError(f"backend 'sim': {self.tree_refusal()}")
        r = self.rows
        lag = r.sim_lag[np.flatnonzero(tree_nodes(trees) > 0)] if self.catch_up else None

        def forward(ctx, q, lvl):
            t, f = self._forward("draft", ctx, lag if lvl == 0 and lag is not None else q, lvl)
            return t + self.position_overhead_s, f

        t, f, forwards = tree_draft(forward, r.sim_ctx, trees)
        return self._tree_acc.confidences(trees), t, f, forwards

    def verify_tree(self, trees):
        """One target forward over 1 + nodes tokens a row; the accepted path by TreeAcceptance at each row's
        next output position; the context and the model advance by that path + 1."""
        if self._table is None:
            raise ConfigError(f"backend 'sim': {self.tree_refusal()}")
        r = self.rows
        ctx = r.sim_ctx
        t, f = self._forward("target", ctx, tree_nodes(trees) + 1)
        t += self.step_overhead_s
        accepted = self._tree_acc.accepted(trees, r.acc_request, r.acc_pos)
        drafted = self._depths
        self.outcomes.commit(drafted, accepted, ctx)   # ctx += accepted + 1
        if self.catch_up:
            r.sim_lag[:] = np.where(drafted > 0, 1 + (accepted >= drafted), r.sim_lag + 1)
        return accepted, t, f


class ClockCost:
    """What this simulator's clock charges, with view.cost's methods (the `true cost` of oracle_expected and
    `goodput cost=clock`): the clock's cost model (backend.clock_profile, else the run's), padded forwards
    (backend.pad_ragged) and the fixed seconds per step (with the verify) and per draft position. The draft's
    catch-up tokens (backend.draft_catch_up) depend on each row's history: the tables do not hold them; a policy
    prices them from view.draft_lag with `draft_forward` (`policies.kit.catch_up_s`)."""

    def __init__(self, ex: SimExecutor):
        self._ex = ex
        self.target, self.draft = ex.cost.target, ex.cost.draft
        # True: every forward is padded to its deepest row (backend.pad_ragged), so a verify costs what one with
        # every row as deep as the deepest costs, whatever the number of drafts (policies' StepCost prices it so)
        self.pad_ragged = ex.pad_ragged
        # seconds per draft forward beyond draft_forward's (tree.tree_draft_time adds it a level)
        self.position_overhead_s = ex.position_overhead_s

    def verify_time(self, ctx, depths):
        ex = self._ex
        return ex._forward("target", np.asarray(ctx), np.asarray(depths) + 1)[0] + ex.step_overhead_s

    def draft_forward(self, ctx, q=None):
        """One draft forward as the clock charges it (padded where the engine pads), without the per-position
        overhead: (seconds, flops)."""
        return self._ex._forward("draft", np.asarray(ctx), None if q is None else np.asarray(q))

    def draft_time(self, ctx):
        ex = self._ex
        return ex._forward("draft", np.asarray(ctx))[0] + ex.position_overhead_s if len(ctx) else 0.0

    def draft_positions(self, ctx, depths):
        ctx, depths = np.asarray(ctx), np.asarray(depths)
        ex = self._ex
        t = sum(ex._forward("draft", ctx[depths > p] + p, None, p)[0] + ex.position_overhead_s
                for p in range(int(depths.max(initial=0))))
        return t, self._ex.cost.draft_positions(ctx, depths)[1]

    def step_time(self, ctx, depths):
        return self.verify_time(ctx, depths) + self.draft_positions(ctx, depths)[0]
