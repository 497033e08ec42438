"""The engine's clock: model time (a simulation advances it by the seconds its executor reports) or wall
time (a real backend: read from the system clock), and the policy-time charge. The engine's phases tell
the clock what happened; only the clock knows which kind it is."""
from __future__ import annotations

import time


class Clock:
    """`now` is the run's time in seconds since its start.

    model: advanced by the seconds the executor returns; with `charge_policy` the policy's own measured
           time (plan, keep_drafting, observe) is added to each step, as a real engine pays it.
    wall:  read from time.perf_counter(); the policy's time is inside the wall clock already.
    """

    def __init__(self, kind: str, charge_policy: bool = False):
        if kind not in ("model", "wall"):
            raise ValueError(f"clock kind must be 'model' or 'wall', got {kind!r}")
        self.wall = kind == "wall"
        self.charge = bool(charge_policy) and not self.wall
        # whether a step pays the policy's time: inside the wall clock, or charged to a model clock
        self.pays_policy = self.wall or self.charge
        self.now = 0.0
        self.policy_s = 0.0   # the policy's hooks' time in the current step, where a step pays it (else 0)
        self._t0 = self._step_t0 = self._step_start = 0.0
        if not self.pays_policy:
            self.call = _call   # nothing to measure: the hook is called as it is

    def start(self) -> None:
        self._t0 = time.perf_counter()
        self.now = 0.0

    def elapsed(self) -> float:
        """Wall seconds since start (either kind)."""
        return time.perf_counter() - self._t0

    def begin_step(self) -> float:
        self._step_start = self.now
        self.policy_s = 0.0
        if self.wall:
            self._step_t0 = time.perf_counter()
        return self.now

    def call(self, fn, *args):
        """Run a policy hook and measure its time (policy_s; a model clock with charge_policy charges it to the
        step, a wall clock has it inside already)."""
        t = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.policy_s += time.perf_counter() - t

    def after_prefill(self, seconds: float) -> None:
        self.now = self.elapsed() if self.wall else self.now + seconds

    def after_decode(self, draft_s: float, verify_s: float) -> None:
        self.now = self.elapsed() if self.wall else self.now + draft_s + verify_s + self.policy_s

    def wait_until(self, t: float) -> None:
        """Nothing runs until t (the next arrival): a simulation jumps, a real backend sleeps."""
        wait = t - self.now
        if self.wall and wait > 0:
            time.sleep(wait)
            self.now = self.elapsed()
        else:
            self.now = max(self.now, t)

    def end_step(self, draft_s: float, verify_s: float, prefill_s: float) -> tuple[float, float]:
        """(step seconds, overhead seconds) of the step that began at begin_step. Wall: the overhead is
        what the model forwards (draft, verify, prefill) do not explain; model: the charged policy time."""
        if self.wall:
            step_s = time.perf_counter() - self._step_t0
            return step_s, step_s - draft_s - verify_s - prefill_s
        return self.now - self._step_start, self.policy_s


def _call(fn, *args):
    return fn(*args)


_call = getattr(__import__("operator"), "call", _call)   # Python 3.11+: the same in C
