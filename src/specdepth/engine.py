"""The one engine step loop, shared by every backend.

Each step is a `Step` record filled phase by phase:

    admit -> plan -> draft -> verify -> commit -> record -> retire

admit: arrived requests join the batch (their prefill emits each one's first token); plan: the policy's
depths; draft: position by position over the rows still drafting (policy.keep_drafting after each), or one
block when nobody stops early; verify: one batched target forward, then policy.observe; commit: accepted
drafts plus the bonus/correction token, per-row statistics; record: the step row; retire: finished requests
leave (their request rows). A plan may be a tree plan instead of depths (a specdepth.tree.Tree, or one per
row): if every row's tree is a chain it runs as those depths, else the executor drafts the trees level by
level (draft_tree, no keep_drafting) and verifies them in one forward (verify_tree), and the per-row
statistics count a row as drafted = its tree's depth, accepted = its accepted path's length. The running batch's per-row state is one `RowTable` (rows.py) that the engine,
the executor and the acceptance model share; time is a `Clock` (clock.py). `metrics.summarize` turns the
rows into summary.json. docs/architecture.md has the picture.
"""
from __future__ import annotations

import gc
import operator
import sys
from dataclasses import dataclass, field

import numpy as np

from . import _kernels as _k
from . import protocols
from . import tree as _tree
from .clock import Clock
from .cost import CostModel
from .errors import ConfigError, PolicyError, SpecdepthError, as_bool, as_float, as_int
from .executor import Executor
from .policy import Policy, StepView
from .rows import RowTable
from .trace import TraceRecorder
from .tree import Tree
from .workload import Request

STEP_COLUMNS = ("step", "time_s", "batch_size", "max_depth", "drafted", "accepted", "emitted", "verify_tokens",
                "admitted", "finished", "draft_s", "verify_s", "prefill_s", "overhead_s", "step_s",
                "target_flops", "draft_flops")
REQUEST_COLUMNS = ("request_id", "prompt_len", "output_len", "arrival_s", "first_token_s", "finish_s", "ttft_s",
                   "e2e_s", "tpot_s", "steps", "drafted", "accepted")


class EngineConfig:
    """The `engine` config group: batching limits, the shared token budget, the depth cap."""

    def __init__(self, max_batch_size: int = 512, max_num_batched_tokens: int = 8192, token_budget="auto",
                 max_depth: int = 16, acceptance_prior: float = 0.7, acceptance_decay: float = 0.8,
                 history: int = 8, budget_tolerance: float = 0.05, record_trace: bool = False,
                 progress: str | bool = "auto", charge_policy_time: bool = False, gc_freeze: bool = True):
        self.max_batch_size = as_int(max_batch_size, "engine.max_batch_size", min=1)
        self.max_num_batched_tokens = as_int(max_num_batched_tokens, "engine.max_num_batched_tokens", min=1)
        if token_budget != "auto":
            token_budget = as_int(token_budget, "engine.token_budget", min=1)
        self.token_budget = token_budget
        self.max_depth = as_int(max_depth, "engine.max_depth", min=0, max=256)
        self.acceptance_prior = as_float(acceptance_prior, "engine.acceptance_prior", min=0, max=1)
        self.acceptance_decay = as_float(acceptance_decay, "engine.acceptance_decay", min=0, max=1)
        self.history = as_int(history, "engine.history", min=1)
        self.budget_tolerance = as_float(budget_tolerance, "engine.budget_tolerance", min=0)
        self.record_trace = as_bool(record_trace, "engine.record_trace")
        # model clock only: add the policy's own measured time (plan, keep_drafting, observe) to each step,
        # as a real engine pays it; makes simulated times depend on this CPU (off: deterministic)
        self.charge_policy_time = as_bool(charge_policy_time, "engine.charge_policy_time")
        self.gc_freeze = as_bool(gc_freeze, "engine.gc_freeze")
        if progress not in ("auto", True, False):
            raise ConfigError(f"engine.progress must be auto, true or false, got {progress!r}")
        self.progress = progress

    def resolve_budget(self, cost: CostModel) -> int:
        b = cost.ridge_tokens(self.budget_tolerance) if self.token_budget == "auto" else self.token_budget
        return int(min(b, self.max_num_batched_tokens))


class Step:
    """One engine step, filled phase by phase. The fields named like STEP_COLUMNS are the step's row of
    steps.csv (totals over the batch); the per-row arrays (length batch_size) are what the policy sees.
    Fields not yet filled read their class default (a step costs two assignments to create)."""

    # admit
    step: int                           # (set by __init__)
    time_s: float                       # the clock when the step began (set by __init__)
    admitted: int = 0
    prefill_s: float = 0.0
    now_s: float = 0.0                  # the clock when the policy plans (after admission)
    requests_left: int = 0              # requests of the workload not admitted yet (arrived or not)
    # plan
    batch_size: int = 0
    oracle_accept: np.ndarray | None = None
    accept_prob: np.ndarray | None = None    # true per-token acceptance probabilities (requires_accept_prob)
    expected_accept_prob: np.ndarray | None = None   # the same before the draft's confidences are seen (on access)
    depths: np.ndarray | None = None    # per row: the plan (a tree plan: each row's tree's depth)
    trees: list | None = None           # a tree plan's Tree per row; None on a chain step
    nodes: np.ndarray | None = None     # a tree plan's nodes per row; None on a chain step
    max_depth: int = 0                  # the deepest depth planned
    # draft
    row_drafted: np.ndarray | None = None
    confidences: np.ndarray | None = None
    node_confidences: np.ndarray | None = None   # a tree step's [rows, most nodes], NaN padding
    draft_forwards: int = 0
    draft_s: float = 0.0
    draft_flops: float = 0.0
    # verify
    row_accepted: np.ndarray | None = None
    verify_s: float = 0.0
    target_flops: float = 0.0
    # commit and record: totals over the batch
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    finished: int = 0                   # requests done this step (at their prefill or by this decode)
    decoded_done: int = 0               # ... of which by this decode: the retire phase removes them
    verify_tokens: int = 0
    overhead_s: float = 0.0
    step_s: float = 0.0

    def __init__(self, step: int, time_s: float, **fields):
        self.step, self.time_s = step, time_s
        for name, value in fields.items():
            if not hasattr(Step, name):
                raise TypeError(f"Step has no field {name!r}")
            setattr(self, name, value)

    def row(self) -> tuple:
        """The step's row of steps.csv, by column name."""
        return _STEP_ROW(self)


_STEP_ROW = operator.attrgetter(*STEP_COLUMNS)
_INT64 = np.dtype(np.int64)
# the row columns a leaving request's row of requests.csv is made of (_leave), and its depth changes
_LEAVING = ("request_id", "prompt_len", "output_len", "arrival_s", "first_token_s", "generated", "admitted_step",
            "drafted_total", "accepted_total", "depth_changes")
assert REQUEST_COLUMNS == _LEAVING[:5] + ("finish_s", "ttft_s", "e2e_s", "tpot_s", "steps", "drafted", "accepted")


@dataclass
class RunResult:
    steps: list = field(default_factory=list)          # tuples in STEP_COLUMNS order
    requests: list = field(default_factory=list)       # tuples in REQUEST_COLUMNS order
    position_proposed: np.ndarray | None = None        # drafts proposed at position j
    position_accepted: np.ndarray | None = None        # drafts accepted at position j
    position_reached: np.ndarray | None = None         # position j drafted with all before it accepted
    seq_steps: int = 0                                  # (sequence, verify step) pairs
    emitted_unclipped: int = 0                          # accepted + 1 over those pairs
    token_budget: int = 0
    trace: list | None = None                          # acceptance_trace.jsonl records (TraceRecorder)
    depth_changes: list = field(default_factory=list)  # per finished request: steps whose depth differed
    extra: dict = field(default_factory=dict)           # executor outputs (generations.jsonl, ...)
    wall_s: float = 0.0


def _read_only(a: np.ndarray) -> np.ndarray:
    """A read-only view of the engine's array `a` for a policy hook: a policy that writes into what it is handed
    (keep_drafting's confidence, observe's accepted) gets a ValueError, not a silently changed result."""
    v = a.view()
    v.flags.writeable = False
    return v


def _overrides(policy: Policy, hook: str) -> bool:
    return getattr(type(policy), hook) is not getattr(Policy, hook)


def engine_rows(history: int, capacity: int = 8) -> RowTable:
    """The engine's columns of the run's RowTable (the executor and acceptance model add theirs)."""
    rows = RowTable(capacity)
    for name in ("request_id", "prompt_len", "output_len", "admitted_step", "drafted_total", "accepted_total",
                 "depth_changes"):
        rows.add(name, np.int64)
    rows.add("generated", np.int64, fill=1)     # prefill emits each request's first token
    rows.add("last_depth", np.int64, fill=-1)   # drafts in the row's previous step, -1 = none yet
    for name in ("arrival_s", "first_token_s", "accepted_w", "rejected_w"):   # *_w: decayed counts
        rows.add(name, np.float64)
    rows.add("ring_accepted", np.int64, fill=-1, width=history)   # ring buffers, column hptr = newest
    rows.add("ring_drafted", np.int64, fill=-1, width=history)
    return rows


class Engine:
    def __init__(self, policy: Policy, executor: Executor, cost: CostModel, config: EngineConfig,
                 requests: list[Request], capacity=None):
        if not isinstance(policy, Policy):
            raise ConfigError(f"policy must subclass specdepth.Policy, got {type(policy).__name__}")
        if (policy.requires_oracle or policy.requires_accept_prob or policy.requires_true_cost) and \
                not executor.supports_oracle:
            raise ConfigError(f"policy {type(policy).__name__} is an oracle: it needs what only a simulated run "
                              f"knows (acceptance outcomes, their probabilities or the clock's true cost); backend "
                              f"{executor.name!r} cannot provide them: use backend=sim")
        protocols.check_cost(cost)
        executor = protocols.checked_executor(executor)
        self.policy, self.executor, self.cost, self.cfg = policy, executor, cost, config
        self.requests = executor.prepare(sorted(requests, key=lambda r: r.arrival_s))
        self.budget = config.resolve_budget(cost)
        self._pname = type(policy).__name__
        self.capacity = capacity   # capacity.Capacity: the context window and the KV memory admission obeys
        if capacity is not None:
            capacity.check(self.requests)

    # ---- policy hooks and the validation of their answers ----------------------------------------
    def _hook(self, hook: str, *args):
        """Call a policy hook through the clock (which charges its time, or not); an exception the
        policy raises becomes a PolicyError naming the policy, the hook and the exception's message."""
        try:
            return self._call(self._hooks[hook], *args)
        except SpecdepthError:
            raise
        except Exception as e:
            hint = protocols.policy_expects(self._hooks[hook], hook) if isinstance(e, TypeError) else ""
            raise PolicyError(f"policy {self._pname}: {hook}() raised {type(e).__name__}: {e}{hint}") from e

    def _bad(self, rule: str):
        raise PolicyError(f"policy {self._pname} broke a rule: {rule}")

    def _check_depths(self, depths, n: int) -> tuple[np.ndarray, int]:
        if type(depths) is np.ndarray and depths.dtype is _INT64 and depths.shape == (n,):   # the usual answer
            lo, hi, total = _k.depth_stats(depths)
            if lo >= 0 and hi <= self._max_depth and n + total <= self._max_tokens:
                return depths, int(hi)
        return self._check_any_depths(depths, n)

    def _check_any_depths(self, depths, n: int) -> tuple[np.ndarray, int]:
        if isinstance(depths, Tree) or (isinstance(depths, (list, tuple)) and any(isinstance(t, Tree) for t in depths)):
            return self._check_trees(depths, n)
        d = depths if isinstance(depths, np.ndarray) else (None if depths is None else np.asarray(depths))
        if d is None or d.shape != (n,):
            self._bad(f"plan() must return one depth per sequence, shape ({n},); got "
                      f"{None if d is None else d.shape}")
        if d.dtype.kind not in "iu":
            if d.dtype.kind == "f" and np.isnan(d).any():
                self._bad("plan() returned NaN depths")
            self._bad(f"plan() must return integer depths, got dtype {d.dtype}")
        lo, hi, total = (int(d.min()), int(d.max()), int(d.sum())) if n else (0, 0, 0)
        if lo < 0:
            self._bad(f"plan() returned a negative depth ({lo})")
        if hi > self.cfg.max_depth:
            self._bad(f"plan() returned depth {hi} > engine.max_depth={self.cfg.max_depth}")
        if n + total > self.cfg.max_num_batched_tokens:
            self._bad(f"the step's verify tokens ({n + total} = {n} sequences + {total} drafts) exceed "
                      f"engine.max_num_batched_tokens={self.cfg.max_num_batched_tokens}")
        return d.astype(np.int64), int(hi)

    def _check_trees(self, plan, n: int) -> tuple[np.ndarray, int]:
        """A tree plan: one Tree for every row, or a list of n. All chains: their depths, checked as depths
        (the same step as returning them). Else each tree's depth and the nodes are checked, the trees kept for
        the draft (self._tree_plan), and each tree's depth returned as the row's depth."""
        trees = [plan] * n if isinstance(plan, Tree) else list(plan)
        if len(trees) != n:
            self._bad(f"plan() must return one Tree for every sequence or a list of {n} (one per sequence); got "
                      f"a list of {len(trees)}")
        unique = {}
        for i, t in enumerate(trees):
            if id(t) not in unique:
                if not isinstance(t, Tree):
                    self._bad(f"plan()'s tree plan: element {i} is a {type(t).__name__}, not a specdepth.tree.Tree "
                              f"(tree.chain(k) is a chain of k drafts)")
                unique[id(t)] = t
        nodes = _tree.tree_nodes(trees)
        if all(t.is_chain for t in unique.values()):
            return self._check_depths(nodes, n)
        depths = np.array([t.max_depth for t in trees], np.int64)
        hi, total = int(depths.max()), int(nodes.sum())
        if hi > self.cfg.max_depth:
            i = int(np.argmax(depths))
            self._bad(f"plan() returned a tree of depth {hi} (sequence {i}) > engine.max_depth={self.cfg.max_depth}")
        if n + total > self.cfg.max_num_batched_tokens:
            self._bad(f"the step's verify tokens ({n + total} = {n} sequences + {total} tree nodes) exceed "
                      f"engine.max_num_batched_tokens={self.cfg.max_num_batched_tokens}")
        if not self.executor.supports_trees:
            self._bad(f"plan() returned a tree plan, but {self.executor.tree_refusal()}")
        self._tree_plan = (trees, nodes)
        return depths, hi

    def _check_mask(self, mask, n: int) -> np.ndarray:
        m = np.asarray(mask) if mask is not None else None
        if m is None or m.shape != (n,) or m.dtype != np.bool_:
            self._bad(f"keep_drafting() must return a bool mask of shape ({n},); got "
                      f"{None if m is None else (m.shape, str(m.dtype))}")
        return m

    # ---- the loop ---------------------------------------------------------------------------------
    def run(self) -> RunResult:
        self._start()
        rows, total, begin = self.rows, len(self.requests), self.clock.begin_step
        admit, plan, draft, verify, commit, record, retire = (self._admit, self._plan, self._draft, self._verify,
                                                              self._commit, self._record, self._retire)
        try:
            while self._next < total or rows.n:
                s = Step(self._step, begin())
                admit(s)
                if rows.n == 0:
                    self._idle(s)
                    continue
                plan(s)
                draft(s)
                verify(s)
                commit(s)
                record(s)
                retire(s)
        finally:
            if self._frozen:
                gc.unfreeze()
        return self._finish()

    def _start(self) -> None:
        """Per-run state: the row table (shared with the executor), the clock, the view, the results."""
        cfg, ex = self.cfg, self.executor
        self._cap = min(cfg.max_batch_size, cfg.max_num_batched_tokens)
        self.rows = engine_rows(cfg.history, self._cap)
        ex.attach(self.rows)
        self.clock = Clock(ex.clock, cfg.charge_policy_time)
        self._call = self.clock.call
        self._hooks = {h: getattr(self.policy, h) for h in ("reset", "plan", "keep_drafting", "observe")}
        self._oracle, self._accept_prob = self.policy.requires_oracle, self.policy.requires_accept_prob
        self.view = StepView(self.rows, self.budget, cfg.max_depth, cfg.max_num_batched_tokens, self.cost,
                             cfg.acceptance_prior, ex.true_cost() if self.policy.requires_true_cost else None,
                             self.clock, ex.draft_lag, ex.peek_expected_prob,
                             ex.rank_table() if self.policy.requires_accept_prob else None)
        self._has_keep, self._has_obs = _overrides(self.policy, "keep_drafting"), _overrides(self.policy, "observe")
        recorder = cfg.record_trace or ex.record_trace
        self._trace = TraceRecorder() if recorder else None
        self._need_conf = self._has_keep or self._has_obs or recorder
        self.res = RunResult(token_budget=self.budget)
        self._joint = np.zeros((cfg.max_depth + 1) ** 2, np.int64)   # (drafted, accepted) per (row, step)
        self._no_drafts = np.zeros(self._cap, np.int64)
        self._no_drafts.flags.writeable = False
        self._next = self._step = self._hptr = 0
        self._tree_plan = None
        self._commit_version = -1
        self._max_depth, self._max_tokens, self._history = cfg.max_depth, cfg.max_num_batched_tokens, cfg.history
        self._commit_args = (cfg.acceptance_decay, self._joint, cfg.max_depth + 1)
        reqs = self.requests
        self._arrivals = [r.arrival_s for r in reqs]
        self._admit_cols = {c: np.array([getattr(r, c) for r in reqs], np.float64 if c == "arrival_s" else np.int64)
                            for c in ("request_id", "prompt_len", "output_len", "arrival_s")}
        self._short = np.cumsum([0] + [r.output_len <= 1 for r in reqs]).tolist()   # done after the prefill
        self._pbar = self._progress(sum(r.output_len for r in self.requests))
        self._hook("reset")
        self._frozen = False
        if ex.clock != "model":
            self._warm_cost()
            if cfg.gc_freeze and gc.get_freeze_count() == 0:   # a caller's own freeze is left as it is
                self._freeze()
        self.clock.start()

    def _freeze(self) -> None:
        """On a measured clock (`engine.gc_freeze`, on by default): move every object alive now (the models, the
        configs, the workload: ~470k tracked objects in a `specdepth experiment=real_pareto` process) to the
        collector's permanent generation until the run ends (`run` unfreezes), so that the collections the step
        loop triggers do not traverse them inside the timed steps. Measured with gc.callbacks on that experiment's
        cell (experiments/perf/gc_time.py, batch 4 and 32, none and goodput): 8-27 ms of collections in a 1.1-3.6
        s decode without it, 1.5-2.8 ms with it. No collection first: a full one costs ~0.4 s there, and garbage frozen
        now is collected after the run. Cycles made during the run are still collected. Where the caller froze
        objects already, nothing is done (unfreezing would undo theirs). The simulator's clock is model time: there
        nothing changes."""
        gc.freeze()
        self._frozen = True

    def _warm_cost(self) -> None:
        """On a measured clock (backend=hf), call view.cost's methods once before the clock starts: the first call
        in a process loads the compiled kernels behind them from numba's cache (~5-7 ms on this CPU), which a
        policy that prices its steps (goodput, batch_scaled, confidence) would otherwise pay inside its first
        timed steps and `none` never does. Numba compiles per signature, and a read-only array (the view's) is
        another signature than a writable one: every mix is warmed. The results are discarded; a cost model keeps
        no state from them."""
        c = self.cost
        try:
            for ro_ctx, ro_depths in ((False, False), (True, False), (False, True), (True, True)):
                ctx, depths = np.array([8, 9], np.int64), np.array([1, 2], np.int64)
                ctx.flags.writeable, depths.flags.writeable = not ro_ctx, not ro_depths
                c.verify_time(ctx, depths)
                c.draft_positions(ctx, depths)
                c.verify_times(ctx, np.array([0.0, 2.0]))
                if hasattr(c, "step_tables"):   # (optional: StepCost's tables, from its read-only grids)
                    grid = np.array([0.0, 2.0])
                    grid.flags.writeable = not ro_depths
                    c.step_tables(ctx, grid, 8.0, grid)
                c.target_forward(ctx)
                c.draft_forward(ctx)
            c.draft_times(8.0, np.array([1, 2]))
            if hasattr(c, "row_verify_times"):   # (optional: goodput's row cost)
                c.row_verify_times(8.0, 2)
        except Exception:   # a user's cost model without these methods: it fails where a policy calls one, not here
            return

    def _admit(self, s: Step) -> None:
        """Every arrived request, up to the batch and token limits, joins at the end of the table; the
        prefill emits its first token. Requests done after one token (output_len 1) leave at once."""
        rows, now, arrivals = self.rows, self.clock.now, self._arrivals
        start = end = self._next
        s.now_s, s.requests_left = now, len(arrivals) - start
        if start == len(arrivals) or arrivals[start] > now:   # nobody waiting
            rows.sync()
            return
        room = self._cap - rows.n
        if self.capacity is not None and room:
            rows.sync()   # the views, after a retirement that left them stale
            room = self.capacity.room(rows.prompt_len, rows.output_len, start, room)   # what the KV memory fits
        while end < len(arrivals) and end - start < room and arrivals[end] <= now:
            end += 1
        if end == start:
            rows.sync()
            return
        self._next, s.admitted = end, end - start
        s.requests_left -= s.admitted
        new = rows.grow(s.admitted)
        for col, values in self._admit_cols.items():
            getattr(rows, col)[new] = values[start:end]
        rows.admitted_step[new] = self._step
        s.prefill_s, s.target_flops, s.draft_flops = self.executor.prefill(self.requests[start:end], new)
        self.clock.after_prefill(s.prefill_s)
        rows.first_token_s[new] = s.now_s = self.clock.now
        if self._pbar is not None:
            self._pbar.update(s.admitted)
        if self._short[end] > self._short[start]:
            done = rows.generated[new] >= rows.output_len[new]
            keep = np.ones(rows.n, bool)
            keep[new] = ~done
            s.finished = int(done.sum())
            self._leave(keep)
            rows.sync()

    def _idle(self, s: Step) -> None:
        """Nothing running: record a step that only prefilled (every request it admitted was done after
        its first token), then wait for the next arrival."""
        if s.admitted:
            self._record(s)
        if self._next < len(self.requests):
            self.clock.wait_until(self.requests[self._next].arrival_s)

    def _plan(self, s: Step) -> None:
        s.batch_size = self.rows.n
        if self._oracle:
            s.oracle_accept = self.executor.peek_accepted(self.cfg.max_depth)
        if self._accept_prob:
            s.accept_prob = self.executor.peek_accept_prob(self.cfg.max_depth)
        self.view.bind(s, self._hptr)
        s.depths, s.max_depth = self._check_depths(self._hook("plan", self.view), s.batch_size)
        if self._tree_plan is not None:
            s.trees, s.nodes = self._tree_plan
            self._tree_plan = None
        self.executor.begin_step(s.depths, s.max_depth)

    def _draft(self, s: Step) -> None:
        """Position by position over the rows still drafting, or one block when nobody stops early."""
        n, kmax, ex = s.batch_size, s.max_depth, self.executor
        if not kmax:
            s.row_drafted = self._no_drafts[:n]   # read-only zeros
            return
        if s.trees is not None:   # a tree step: level by level, no keep_drafting
            s.node_confidences, s.draft_s, f, s.draft_forwards = ex.draft_tree(s.trees)
            s.draft_flops += f
            s.row_drafted = s.depths
            return
        if not self._need_conf:
            s.draft_s, f = ex.draft_block(s.depths)
            s.draft_flops += f
            s.row_drafted, s.draft_forwards = s.depths, kmax
            return
        s.row_drafted = np.zeros(n, np.int64)
        s.confidences = np.full((n, kmax), np.nan)
        active = s.depths > 0
        for p in range(kmax):
            rows = np.flatnonzero(active)
            if rows.size == 0:
                break
            c, t, f = ex.draft(rows, p)
            s.draft_s += t
            s.draft_flops += f
            s.draft_forwards += 1
            s.row_drafted[rows] += 1
            s.confidences[rows, p] = c
            if p + 1 < kmax:
                active &= s.depths > p + 1
                if self._has_keep:
                    active &= self._check_mask(self._hook("keep_drafting", self.view, p, _read_only(s.confidences[:, p])),
                                               n)

    def _verify(self, s: Step) -> None:
        if s.trees is None:
            s.row_accepted, s.verify_s, f = self.executor.verify(s.row_drafted)
        else:
            s.row_accepted, s.verify_s, f = self.executor.verify_tree(s.trees)
        s.target_flops += f
        if self._has_obs:
            self._hook("observe", self.view, _read_only(s.row_accepted))
        self.clock.after_decode(s.draft_s, s.verify_s)

    def _commit(self, s: Step) -> None:
        """Accepted drafts plus the bonus/correction token (clipped at output_len) and the per-row
        statistics: one compiled pass over the rows."""
        r = self.rows
        if self._commit_version != r.version:   # the columns the kernel updates, read once per table change
            self._commit_version = r.version
            self._commit_cols = (r.generated, r.output_len, r.accepted_w, r.rejected_w, r.drafted_total,
                                 r.accepted_total, r.last_depth, r.depth_changes, r.ring_accepted, r.ring_drafted)
        self._hptr = hptr = (self._hptr + 1) % self._history
        s.accepted, s.drafted, s.emitted, s.decoded_done = _k.commit(
            *self._commit_cols, hptr, s.row_drafted, s.row_accepted, *self._commit_args, s.max_depth > 0)
        s.finished += s.decoded_done
        if s.trees is not None:   # steps.csv: a tree step's drafts are its nodes (verify_tokens = batch + nodes)
            s.drafted = int(s.nodes.sum())
        self.res.seq_steps += s.batch_size
        self.res.emitted_unclipped += s.accepted + s.batch_size
        if self._trace is not None and s.max_depth and s.trees is None:   # chain steps only
            self._trace.record(r.request_id, s.row_drafted, s.row_accepted, s.confidences)
        if self._pbar is not None:
            self._pbar.update(s.emitted)

    def _record(self, s: Step) -> None:
        s.verify_tokens = s.batch_size + s.drafted
        s.step_s, s.overhead_s = self.clock.end_step(s.draft_s, s.verify_s, s.prefill_s)
        self.res.steps.append(_STEP_ROW(s))
        self._step += 1

    def _retire(self, s: Step) -> None:
        if s.decoded_done:
            self._leave(self.rows.generated < self.rows.output_len)

    def _leave(self, keep: np.ndarray) -> None:
        """Requests where keep is False finish now: their request rows, then the table drops them."""
        r, now, out = self.rows, self.clock.now, self.res.requests
        if self.capacity is not None:   # the KV the batch holds peaks just before requests leave
            self.capacity.observe(r.prompt_len, r.generated)
        step, changes = self._step, self.res.depth_changes
        for rid, plen, olen, arr, first, g, adm, dr, acc, dc in r.gather((~keep).nonzero()[0], _LEAVING):
            out.append((rid, plen, olen, arr, first, now, first - arr, now - arr,   # REQUEST_COLUMNS' order
                        (now - first) / (g - 1) if g > 1 else 0.0, step - adm, dr, acc))
            changes.append(dc)
        r.keep(keep, refresh=False)   # the views refresh at the next admission (rows.grow or rows.sync)

    def _finish(self) -> RunResult:
        """Per-position counts over (row, step) pairs: position j was drafted (drafted > j), reached
        (drafted > j and the j drafts before it accepted), accepted (accepted > j)."""
        if self._pbar is not None:
            self._pbar.close()
        res, K1 = self.res, self.cfg.max_depth + 1
        joint = self._joint.reshape(K1, K1)
        hist_d, hist_a, hist_f = joint.sum(axis=1), joint.sum(axis=0), np.diagonal(joint)
        ge_d, ge_a = np.cumsum(hist_d[::-1])[::-1], np.cumsum(hist_a[::-1])[::-1]
        res.position_proposed = ge_d[1:]
        res.position_accepted = ge_a[1:]
        res.position_reached = ge_a[:-1] - hist_f[:-1]
        res.trace = self._trace.records() if self._trace is not None else None
        res.wall_s = self.clock.elapsed()
        res.extra = self.executor.finish()
        return res

    def _progress(self, total: int):
        show = self.cfg.progress
        if show == "auto":
            show = sys.stderr.isatty()
        if not show:
            return None
        from tqdm import tqdm
        return tqdm(total=total, unit="tok", desc=f"{self._pname} on {self.executor.name}", mininterval=0.5,
                    leave=False)
