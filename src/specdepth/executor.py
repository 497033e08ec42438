"""The interface between the engine's step loop and a backend. The engine knows executors only by this.

An executor owns its per-sequence state (KV caches, context lengths, acceptance draws) in row order:
`prefill` appends rows at the end, `retire(keep)` drops rows where keep is False, exactly as the engine
does with its own arrays. Every call returns the seconds it took (model time for `clock = "model"`,
measured time for `clock = "wall"`) and the FLOPs it spent.
"""
from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np

from .errors import BackendError
from .workload import Request


class Executor(ABC):
    name: str = "executor"
    #: "model": the engine's clock advances by the seconds the executor returns (simulation);
    #: "wall": the engine reads the wall clock (a real backend).
    clock: str = "model"
    #: True when the executor can reveal acceptance outcomes before drafting (oracle policies).
    supports_oracle: bool = False
    #: True: the engine records acceptance_trace.jsonl even when engine.record_trace is false.
    record_trace: bool = False

    def check(self, requests: list[Request]) -> None:
        """Validate the whole workload before anything runs (raise ConfigError/BackendError)."""

    @abstractmethod
    def prefill(self, requests: list[Request]) -> tuple[float, float, float]:
        """Admit requests (append rows), run their prefill, emit each one's first token.
        Returns (seconds, target_flops, draft_flops)."""

    def begin_step(self, depths: np.ndarray) -> None:
        """Called after the policy's plan, before the first draft position."""

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

    @abstractmethod
    def retire(self, keep: np.ndarray) -> None:
        """Drop the rows where keep is False (finished requests), keeping the order of the rest."""

    def peek_accepted(self, k: int) -> np.ndarray:
        """How many of the next k draft positions the target will accept, per row (oracle policies)."""
        raise BackendError(f"backend {self.name!r} cannot reveal acceptance outcomes in advance; "
                           "oracle policies run on the simulator only (backend=sim)")

    def peek_accept_prob(self, k: int) -> np.ndarray:
        """The true acceptance probability of each of the next k draft tokens, float [rows, k]
        (policies with requires_accept_prob; the outcomes stay hidden)."""
        raise BackendError(f"backend {self.name!r} cannot reveal acceptance probabilities; "
                           "oracle_expected runs on the simulator only (backend=sim)")

    def true_cost(self):
        """A cost model (view.cost's methods) of what this backend's clock really charges
        (policies with requires_true_cost)."""
        raise BackendError(f"backend {self.name!r} has no exact cost model of its clock; "
                           "policies that need the true cost run on the simulator only (backend=sim)")

    def finish(self) -> dict:
        """After the run: extra outputs, {file name: list of JSON-able records}."""
        return {}
