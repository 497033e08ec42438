"""The one engine step loop, shared by every backend.

Each step: admit waiting requests (prefill) -> policy.plan -> draft position by position, with
policy.keep_drafting after each -> one batched verify -> policy.observe -> append accepted tokens plus
the bonus/correction token -> retire finished sequences. Per-step and per-request events are recorded
as plain rows; `metrics.summarize` turns them into summary.json.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

import numpy as np

from . import _kernels as _k
from .cost import CostModel
from .errors import ConfigError, PolicyError, as_float, as_int
from .executor import Executor
from .policy import Policy, StepView
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
                 progress: str | bool = "auto", charge_policy_time: bool = False):
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
        self.record_trace = bool(record_trace)
        # model clock only: add the policy's own measured time (plan, keep_drafting, observe) to each step,
        # as a real engine pays it; makes simulated times depend on this CPU (off: deterministic)
        self.charge_policy_time = bool(charge_policy_time)
        if progress not in ("auto", True, False):
            raise ConfigError(f"engine.progress must be auto, true or false, got {progress!r}")
        self.progress = progress

    def resolve_budget(self, cost: CostModel) -> int:
        b = cost.ridge_tokens(self.budget_tolerance) if self.token_budget == "auto" else self.token_budget
        return int(min(b, self.max_num_batched_tokens))


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
    trace: dict | None = None                          # request_id -> ([confidence], [accepted], [unverified])
    depth_changes: int = 0                              # over retired requests: steps whose depth differed
    extra: dict = field(default_factory=dict)           # executor outputs (generations.jsonl, ...)
    wall_s: float = 0.0


def _overrides(policy: Policy, hook: str) -> bool:
    return getattr(type(policy), hook) is not getattr(Policy, hook)


class BatchState:
    """The running batch, row i = one sequence, in the executor's row order. Columns live in one int and
    one float matrix, preallocated for the batch cap (grown by doubling past it): admitting writes rows at
    the end, retiring compacts the kept rows to the front in place (one compiled call), so neither
    allocates per step."""

    INT = ("rid", "plen", "gen", "olen", "adm", "rdr", "racc", "pdep", "nchg")   # pdep, nchg: depth changes
    FLT = ("arr", "first", "A", "R")   # A, R: decayed accepted / rejected draft counts

    def __init__(self, history: int, prior: float, capacity: int = 0):
        self._I = np.zeros((capacity, len(self.INT)), np.int64)
        self._F = np.zeros((capacity, len(self.FLT)))
        self._hacc = np.full((capacity, history), -1, np.int64)   # ring buffers, column hptr = newest
        self._hdr = np.full((capacity, history), -1, np.int64)
        self.n = 0
        self.hptr = 0
        self.prior = prior
        self._views()

    def _views(self):
        n = self.n
        self.I, self.F, self.hacc, self.hdr = self._I[:n], self._F[:n], self._hacc[:n], self._hdr[:n]

    def append(self, requests: list[Request], clock: float, step: int) -> None:
        n, m = self.n, len(requests)
        if n + m > self._I.shape[0]:   # past the preallocated rows (the engine sizes them for its batch cap)
            cap = max(n + m, 2 * self._I.shape[0], 8)
            for name, fill in (("_I", 0), ("_F", 0.0), ("_hacc", -1), ("_hdr", -1)):
                old = getattr(self, name)
                new = np.full((cap, old.shape[1]), fill, old.dtype)
                new[:n] = old[:n]
                setattr(self, name, new)
        # prefill emits each request's first token: gen = 1
        self._I[n:n + m] = [(r.request_id, r.prompt_len, 1, r.output_len, step, 0, 0, -1, 0) for r in requests]
        self._F[n:n + m] = [(r.arrival_s, clock, 0.0, 0.0) for r in requests]
        self._hacc[n:n + m] = -1
        self._hdr[n:n + m] = -1
        self.n = n + m
        self._views()

    def keep(self, keep: np.ndarray) -> None:
        self.n = int(_k.compact(keep, self.I, self.F, self.hacc, self.hdr))
        self._views()

    def note_depths(self, drafted: np.ndarray) -> None:
        """Count, per row, the steps whose drafted depth differs from the row's previous step's."""
        self.I[:, 8] += (self.I[:, 7] >= 0) & (self.I[:, 7] != drafted)
        self.I[:, 7] = drafted

    def acceptance(self) -> np.ndarray:
        return (self.A + self.prior) / (self.A + self.R + 1.0)

    def recent(self, ring: np.ndarray) -> np.ndarray:
        H = ring.shape[1]
        return ring[:, (self.hptr - np.arange(H)) % H]


for _j, _name in enumerate(BatchState.INT):
    setattr(BatchState, _name, property(lambda s, j=_j: s.I[:, j], doc=f"int column {_name}"))
for _j, _name in enumerate(BatchState.FLT):
    setattr(BatchState, _name, property(lambda s, j=_j: s.F[:, j], doc=f"float column {_name}"))


class Engine:
    def __init__(self, policy: Policy, executor: Executor, cost: CostModel, config: EngineConfig,
                 requests: list[Request]):
        if not isinstance(policy, Policy):
            raise ConfigError(f"policy must subclass specdepth.Policy, got {type(policy).__name__}")
        if (policy.requires_oracle or policy.requires_accept_prob or policy.requires_true_cost) and \
                not executor.supports_oracle:
            raise ConfigError(f"policy {type(policy).__name__} needs acceptance outcomes in advance (an oracle); "
                              f"backend {executor.name!r} cannot provide them: use backend=sim")
        self.policy, self.executor, self.cost, self.cfg = policy, executor, cost, config
        self.requests = sorted(requests, key=lambda r: r.arrival_s)
        self.budget = config.resolve_budget(cost)
        self._pname = type(policy).__name__
        executor.check(self.requests)

    # ---- validation of policy answers ----------------------------------------------------------
    def _bad(self, rule: str):
        raise PolicyError(f"policy {self._pname} broke a rule: {rule}")

    def _check_depths(self, depths, n: int) -> np.ndarray:
        d = depths if isinstance(depths, np.ndarray) else (None if depths is None else np.asarray(depths))
        if d is None or d.shape != (n,):
            self._bad(f"plan() must return one depth per sequence, shape ({n},); got "
                      f"{None if d is None else d.shape}")
        if d.dtype.kind not in "iu":
            if d.dtype.kind == "f" and np.isnan(d).any():
                self._bad("plan() returned NaN depths")
            self._bad(f"plan() must return integer depths, got dtype {d.dtype}")
        if d.dtype == np.int64:
            lo, hi, total = _k.depth_stats(d)
        else:
            lo, hi, total = (int(d.min()), int(d.max()), int(d.sum())) if n else (0, 0, 0)
        if lo < 0:
            self._bad(f"plan() returned a negative depth ({lo})")
        if hi > self.cfg.max_depth:
            self._bad(f"plan() returned depth {hi} > engine.max_depth={self.cfg.max_depth}")
        if n + total > self.cfg.max_num_batched_tokens:
            self._bad(f"the step's verify tokens ({n + total} = {n} sequences + {total} drafts) exceed "
                      f"engine.max_num_batched_tokens={self.cfg.max_num_batched_tokens}")
        return (d if d.dtype == np.int64 else d.astype(np.int64)), hi

    def _check_mask(self, mask, n: int) -> np.ndarray:
        m = np.asarray(mask) if mask is not None else None
        if m is None or m.shape != (n,) or m.dtype != np.bool_:
            self._bad(f"keep_drafting() must return a bool mask of shape ({n},); got "
                      f"{None if m is None else (m.shape, str(m.dtype))}")
        return m

    # ---- the loop -------------------------------------------------------------------------------
    def run(self) -> RunResult:
        cfg, ex, pol = self.cfg, self.executor, self.policy
        K, H = cfg.max_depth, cfg.history
        wall = ex.clock == "wall"
        charge = cfg.charge_policy_time and not wall
        perf = time.perf_counter
        has_keep, has_obs = _overrides(pol, "keep_drafting"), _overrides(pol, "observe")
        trace = {} if (cfg.record_trace or getattr(ex, "record_trace", False)) else None
        need_conf = has_keep or has_obs or trace is not None
        decay = cfg.acceptance_decay
        reqs, nreq = self.requests, len(self.requests)
        res = RunResult(token_budget=self.budget, trace=trace)
        steps_out, reqs_out = res.steps, res.requests
        joint = np.zeros((K + 1) * (K + 1), np.int64)   # histogram of (drafted, accepted) per (sequence, step)
        cap = min(cfg.max_batch_size, cfg.max_num_batched_tokens)
        st = BatchState(H, cfg.acceptance_prior, cap)
        view = StepView(st, self.budget, K, cfg.max_num_batched_tokens, self.cost)
        view.true_cost = ex.true_cost() if pol.requires_true_cost else None

        pol.reset()
        pbar = self._progress(sum(r.output_len for r in reqs))
        t0 = time.perf_counter()
        clock = 0.0
        nxt = step = seq_steps = emitted_total = 0
        while nxt < nreq or st.n:
            step_start = clock
            t_step0 = time.perf_counter()
            prefill_s = tfl = dfl = 0.0
            admitted = 0
            # -- admission: every arrived request, up to the batch and token limits
            if nxt < nreq and st.n < cap and reqs[nxt].arrival_s <= clock:
                end = nxt
                while end < nreq and end - nxt < cap - st.n and reqs[end].arrival_s <= clock:
                    end += 1
                new = reqs[nxt:end]
                nxt, admitted = end, end - nxt
                prefill_s, tfl, dfl = ex.prefill(new)
                clock = time.perf_counter() - t0 if wall else clock + prefill_s
                st.append(new, clock, step)
                if pbar is not None:
                    pbar.update(admitted)
            n = st.n
            if n == 0:
                # idle: jump (or, on a real backend, sleep) to the next arrival
                wait = reqs[nxt].arrival_s - clock
                if wall and wait > 0:
                    time.sleep(wait)
                    clock = time.perf_counter() - t0
                else:
                    clock = max(clock, reqs[nxt].arrival_s)
                continue

            # requests with output_len == 1 finish at their prefill (other rows finished are retired below)
            done = st.gen >= st.olen if admitted else None
            if done is None or not done.any():
                view.step, view.now_s, view.batch_size = step, clock, n
                view._depths = view._drafted = view._conf = view._measured = None
                if pol.requires_oracle:
                    view._oracle = ex.peek_accepted(K)
                if pol.requires_accept_prob:
                    view._accept_prob = ex.peek_accept_prob(K)
                if charge:
                    pol_s = -perf()
                depths, kmax = self._check_depths(pol.plan(view), n)
                if charge:
                    pol_s += perf()
                view._depths = depths
                ex.begin_step(depths)

                # -- draft: position by position over the rows still drafting
                draft_s = 0.0
                conf = None
                if not kmax:
                    drafted = np.zeros(n, np.int64)
                elif not need_conf:   # nobody stops early or looks at confidences: one call
                    draft_s, f = ex.draft_block(depths)
                    dfl += f
                    drafted = depths
                else:
                    drafted = np.zeros(n, np.int64)
                    conf = np.full((n, kmax), np.nan)
                    view._conf, view._drafted = conf, drafted
                    active = depths > 0
                    for p in range(kmax):
                        rows = np.flatnonzero(active)
                        if rows.size == 0:
                            break
                        c, t, f = ex.draft(rows, p)
                        draft_s += t
                        dfl += f
                        drafted[rows] += 1
                        conf[rows, p] = c
                        if p + 1 < kmax:
                            active &= depths > p + 1
                            if has_keep:
                                if charge:
                                    pol_s -= perf()
                                active &= self._check_mask(pol.keep_drafting(view, p, conf[:, p]), n)
                                if charge:
                                    pol_s += perf()

                # -- verify
                accepted, verify_s, f = ex.verify(drafted)
                tfl += f
                if has_obs:
                    view._drafted, view._measured = drafted, (draft_s, verify_s)
                    if charge:
                        pol_s -= perf()
                    pol.observe(view, accepted)
                    if charge:
                        pol_s += perf()
                clock = time.perf_counter() - t0 if wall else clock + draft_s + verify_s + (pol_s if charge else 0.0)

                # -- commit: accepted drafts plus the bonus/correction token, clipped at output_len; the
                # acceptance estimate's counts (decayed in rows that drafted), per-row totals, the history
                # ring and the (drafted, accepted) histogram: one compiled pass over the rows
                st.hptr = (st.hptr + 1) % H
                a_sum, d_sum, out_step, n_done = _k.commit(st.I, st.F, st.hacc, st.hdr, st.hptr, drafted,
                                                           accepted, decay, joint, K + 1, kmax > 0)
                st.note_depths(drafted)
                seq_steps += n
                emitted_total += a_sum + n
                if trace is not None and kmax:
                    for i in np.flatnonzero(drafted):
                        d = int(drafted[i])
                        k = int(min(d, accepted[i] + 1))
                        cs, acs, unv = trace.setdefault(int(st.rid[i]), ([], [], []))
                        if k < d:   # drafted after the rejected token: never verified, but policies saw them
                            unv.append([len(cs) + k - 1, conf[i, k:d].tolist()])
                        cs.extend(conf[i, :k].tolist())
                        acs.extend([1] * int(accepted[i]) + [0] * (k - int(accepted[i])))
                if pbar is not None:
                    pbar.update(out_step)
                if wall:
                    step_s = time.perf_counter() - t_step0
                    overhead = step_s - draft_s - verify_s - prefill_s
                else:
                    step_s, overhead = clock - step_start, (pol_s if charge else 0.0)
                if n_done:
                    done = st.gen >= st.olen
                steps_out.append((step, step_start, n, kmax, d_sum, a_sum, out_step, n + d_sum, admitted,
                                  n_done, draft_s, verify_s, prefill_s, overhead, step_s, tfl, dfl))
                step += 1
            else:
                n_done = int(np.count_nonzero(done))
            # -- retire finished sequences
            if n_done:
                for i in np.flatnonzero(done):
                    rid, plen, g, olen, adm, rdr, racc = st.I[i, :7].tolist()
                    arr, first = float(st.F[i, 0]), float(st.F[i, 1])
                    reqs_out.append((rid, plen, olen, arr, first, clock, first - arr, clock - arr,
                                     (clock - first) / (g - 1) if g > 1 else 0.0, step - adm, rdr, racc))
                res.depth_changes += int(st.I[done, 8].sum())
                keep = ~done
                st.keep(keep)
                ex.retire(keep)
        if pbar is not None:
            pbar.close()
        # over (sequence, step) pairs: position j was drafted (drafted > j), reached (drafted > j and the
        # j drafts before it accepted), accepted (accepted > j)
        joint = joint.reshape(K + 1, K + 1)
        hist_d, hist_a, hist_f = joint.sum(axis=1), joint.sum(axis=0), np.diagonal(joint)
        ge_d, ge_a = np.cumsum(hist_d[::-1])[::-1], np.cumsum(hist_a[::-1])[::-1]
        res.position_proposed = ge_d[1:]
        res.position_accepted = ge_a[1:]
        res.position_reached = ge_a[:-1] - hist_f[:-1]
        res.seq_steps, res.emitted_unclipped = seq_steps, emitted_total
        res.wall_s = time.perf_counter() - t0
        res.extra = ex.finish()
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
