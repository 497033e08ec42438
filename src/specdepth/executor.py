"""The interface between the engine's step loop and a backend. The engine knows executors only by this.

Row order belongs to the run's `RowTable` (rows.py): the engine appends a row per admitted request and
retires finished ones; an executor keeps its per-sequence numbers (context lengths, cache lengths, token
ids) as columns it declares on that table in `attach`, so they follow admission and retirement by
themselves, and registers `rows.on_retire(hook)` for state that is not a column (KV caches, finished
outputs). Every call returns the seconds it took (model time for `clock = "model"`, measured time for
`clock = "wall"`) and the FLOPs it spent. docs/architecture.md says what an executor for an external
serving engine implements.
"""
from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np

from .errors import BackendError
from .workload import Request


def prefill_groups(prompt_len: np.ndarray, price, max_cuts: int = 32) -> list[np.ndarray]:
    """How a backend that pads ragged forwards prefills a set of admitted prompts: split into groups of similar
    length, one right-padded forward a group, so that the groups' prices add up to the least. A padded forward
    runs every row at the group's longest prompt; one forward for all wastes the padding (a queue that admits
    many short and long prompts at once), one a prompt pays each forward's fixed part (the weights streamed).

    prompt_len: int [m]; price(rows, tokens) -> seconds of one padded prefill of `rows` prompts of `tokens` each.
    Returns index arrays into prompt_len (each ascending), the groups in order of length. Exact over splits of
    the prompts sorted by length (a group is never worth breaking a run of equal lengths): dynamic programming
    over at most `max_cuts` cut points; with more distinct lengths the cuts lie on a geometric grid of lengths."""
    m = int(prompt_len.shape[0])
    order = np.argsort(prompt_len, kind="stable")
    length = prompt_len[order]
    if m < 2 or length[0] == length[-1]:
        return [np.arange(m)]
    cuts = np.flatnonzero(np.r_[True, length[1:] != length[:-1]])   # where a new length starts
    if cuts.size > max_cuts:
        grid = length[0] * (length[-1] / length[0]) ** (np.arange(max_cuts) / max_cuts)
        cuts = np.unique(np.searchsorted(length, grid))
    cuts = np.r_[cuts, m]
    best = np.full(cuts.size, np.inf)
    best[0] = 0.0
    back = np.zeros(cuts.size, np.int64)
    for e in range(1, cuts.size):            # best[e]: the cheapest prefill of the first cuts[e] prompts
        for s in range(e):
            v = best[s] + float(price(int(cuts[e] - cuts[s]), int(length[cuts[e] - 1])))
            if v < best[e]:
                best[e], back[e] = v, s
    groups, e = [], cuts.size - 1
    while e:
        groups.append(np.sort(order[cuts[back[e]]:cuts[e]]))
        e = back[e]
    return groups[::-1]


def prefill_price(cost, fixed_s: float = 0.0):
    """price(rows, tokens) for prefill_groups: a cost model's target and draft forwards of `rows` prompts
    of `tokens` tokens each, from an empty cache, plus `fixed_s` a group (the two forwards' fixed costs)."""
    def price(rows: int, tokens: int) -> float:
        zeros, q = np.zeros(rows, np.int64), np.full(rows, tokens, np.int64)
        return cost.target_forward(zeros, q)[0] + cost.draft_forward(zeros, q)[0] + fixed_s
    return price


class Executor(ABC):
    name: str = "executor"
    #: "model": the engine's clock advances by the seconds the executor returns (simulation);
    #: "wall": the engine reads the wall clock (a real backend).
    clock: str = "model"
    #: True when the executor can reveal acceptance outcomes before drafting (oracle policies).
    supports_oracle: bool = False
    #: True: the engine records acceptance_trace.jsonl even when engine.record_trace is false.
    record_trace: bool = False
    #: True when the outputs are the target model's own decoding (its greedy output, or distributed as its
    #: samples): backend=hf with backend.acceptance=model. False for the simulator and for the real backend's
    #: timing mode (backend.acceptance=simulated), whose accept/reject decisions come from an acceptance model.
    #: summary.json's `lossless`.
    lossless: bool = False
    #: True when the executor runs tree plans (draft_tree, verify_tree); the engine refuses a policy's tree plan
    #: (one whose rows are not all chains) on an executor without, with tree_refusal()'s reason.
    supports_trees: bool = False

    def machine(self) -> str | None:
        """The device a wall-clock executor is timed on ("cpu", "cuda:0 NVIDIA H200"): summary.json's
        `hardware`. None for a simulated clock (the cost model's hardware is the label)."""
        return None

    def prepare(self, requests: list[Request]) -> list[Request]:
        """Validate the whole workload before anything runs (raise ConfigError/BackendError) and return
        the requests this backend will serve (new Request objects where it fills in token ids: never
        modify the ones given)."""
        return requests

    def attach(self, rows) -> None:
        """Before the run: declare this executor's per-row columns on the run's RowTable (`rows.add`)
        and keep the table to read them back (`rows.<name>`)."""

    @abstractmethod
    def prefill(self, requests: list[Request], new: slice) -> tuple[float, float, float]:
        """Requests admitted into the table's rows `new` (already appended, the engine's columns
        request_id, prompt_len, output_len, arrival_s and admitted_step already written): fill this
        executor's columns for them, run their prefill, emit each one's first token. Returns (seconds,
        target_flops, draft_flops)."""

    def begin_step(self, depths: np.ndarray, kmax: int) -> None:
        """Called after the policy's plan (kmax = depths.max()), before the first draft position."""

    @abstractmethod
    def draft(self, rows: np.ndarray, position: int) -> tuple[np.ndarray, float, float]:
        """One draft forward for `rows` at draft `position`. Returns (confidence per row, seconds, flops)."""

    def draft_block(self, depths: np.ndarray) -> tuple[float, float]:
        """All draft positions of a step when no sequence may stop early: row i drafts depths[i] tokens.
        The default drafts position by position; executors may do it in fewer calls. (seconds, flops)"""
        seconds = flops = 0.0
        for p in range(int(depths.max(initial=0))):
            _, t, f = self.draft(np.flatnonzero(depths > p), p)
            seconds += t
            flops += f
        return seconds, flops

    @abstractmethod
    def verify(self, drafted: np.ndarray) -> tuple[np.ndarray, float, float]:
        """One target forward over every row's last token plus its `drafted[i]` drafts; keeps the accepted
        drafts and the bonus/correction token. Returns (accepted drafts per row, seconds, flops)."""

    def tree_refusal(self) -> str:
        """Why this executor cannot run tree plans (the end of the engine's PolicyError), where it cannot."""
        return f"backend {self.name!r} runs chain plans only (depths)"

    def draft_tree(self, trees: list) -> tuple[np.ndarray, float, float, int]:
        """Propose every row's tree (`specdepth.tree.Tree`, one per row; a chain(0) row drafts nothing) level
        by level: one draft forward per level over the rows with nodes at that level. begin_step ran before,
        with each tree's depth. Returns (node_confidences float [rows, most nodes]: the draft's probability of
        each node's token in node order, NaN padding; seconds, flops, forwards)."""
        raise BackendError(f"backend {self.name!r} cannot draft trees; {self.tree_refusal()}")

    def verify_tree(self, trees: list) -> tuple[np.ndarray, float, float]:
        """One target forward over every row's last token and its tree's nodes; keeps the accepted path and
        the bonus/correction token as `verify` does for a chain, frees the other nodes. Returns (accepted
        nodes per row: the accepted path's length, seconds, flops)."""
        raise BackendError(f"backend {self.name!r} cannot verify trees; {self.tree_refusal()}")

    def rank_table(self) -> np.ndarray | None:
        """The true per-rank acceptance table of this run, float [R] (the simulator's; view.rank_table for
        policies with requires_accept_prob), or None where nobody knows it (a real backend)."""
        return None

    def peek_accepted(self, k: int) -> np.ndarray:
        """How many of the next k draft positions the target will accept, per row (oracle policies)."""
        raise BackendError(f"backend {self.name!r} cannot reveal acceptance outcomes in advance; "
                           "oracle policies run on the simulator only (backend=sim)")

    def peek_accept_prob(self, k: int) -> np.ndarray:
        """The true acceptance probability of each of the next k draft tokens, float [rows, k]
        (policies with requires_accept_prob; the outcomes stay hidden)."""
        raise BackendError(f"backend {self.name!r} cannot reveal acceptance probabilities; "
                           "oracle_expected runs on the simulator only (backend=sim)")

    def peek_expected_prob(self, k: int) -> np.ndarray:
        """Each row's acceptance probability at its next k draft positions before the draft proposes them,
        float [rows, k] (policies with requires_accept_prob)."""
        raise BackendError(f"backend {self.name!r} cannot reveal acceptance probabilities; "
                           "oracle_causal runs on the simulator only (backend=sim)")

    def draft_lag(self) -> np.ndarray | None:
        """Tokens each row's draft KV cache lacks, int [rows]: what the row's next draft forward feeds before its
        first draft (view.draft_lag). 1 after admission and after a step whose drafts were not all accepted, 2
        after one whose drafts all were (the last draft and the bonus token), one more for every step the row
        did not draft. None where the executor charges one token per row whatever the history."""
        return None

    def true_cost(self):
        """A cost model (view.cost's methods) of what this backend's clock really charges
        (policies with requires_true_cost)."""
        raise BackendError(f"backend {self.name!r} has no exact cost model of its clock; "
                           "policies that need the true cost run on the simulator only (backend=sim)")

    def summary_fields(self) -> dict:
        """After the run: fields this executor adds to summary.json (what ran that the config does not say)."""
        return {}

    def finish(self) -> dict:
        """After the run: extra outputs, {file name: list of JSON-able records}."""
        return {}
