"""Policies defined outside the package, as a user's own module would be (used by the tests)."""
import numpy as np

from specdepth import Policy


class Alternating(Policy):
    """Depth `depth` for even rows, 0 for odd rows: ragged depths inside one verify."""

    name = "alternating"

    def __init__(self, depth: int = 3):
        self.depth = depth

    def plan(self, view):
        d = np.zeros(view.batch_size, dtype=np.int64)
        d[::2] = self.depth
        return d


class Broken(Policy):
    """Returns whatever `answer` says: a shape, dtype or value that breaks one rule."""

    def __init__(self, answer: str = "ok"):
        self.answer = answer

    def plan(self, view):
        n = view.batch_size
        return {
            "ok": lambda: np.ones(n, dtype=np.int64),
            "short": lambda: np.ones(n - 1 if n > 1 else 2, dtype=np.int64),
            "float": lambda: np.ones(n),
            "nan": lambda: np.full(n, np.nan),
            "negative": lambda: np.full(n, -1, dtype=np.int64),
            "too_deep": lambda: np.full(n, view.max_depth + 1, dtype=np.int64),
            "over_cap": lambda: np.full(n, view.max_depth, dtype=np.int64),
            "none": lambda: None,
            "list": lambda: [1] * n,
        }.get(self.answer, lambda: np.full(n, 2, dtype=np.int64))()

    def keep_drafting(self, view, position, confidence):
        if self.answer == "bad_mask":
            return np.ones(view.batch_size + 1, dtype=bool)
        if self.answer == "int_mask":
            return np.ones(view.batch_size, dtype=np.int64)
        return np.ones(view.batch_size, dtype=bool)


class Vandal(Policy):
    """Tries to write into the view."""

    def plan(self, view):
        view.context_lens[0] = 0
        return np.zeros(view.batch_size, dtype=np.int64)


class NoPlan(Policy):
    """Forgets the one required hook."""

    def observe(self, view, accepted):
        pass


class Exploding(Policy):
    """Its constructor raises (a user's parameter check)."""

    def __init__(self, knob: int = 3):
        raise ValueError(f"knob must be odd and prime, got {knob}")

    def plan(self, view):
        return np.zeros(view.batch_size, dtype=np.int64)


class NotAPolicy:
    """Has plan() but does not subclass specdepth.Policy."""

    def plan(self, view):
        return np.zeros(view.batch_size, dtype=np.int64)


class RaisesIn(Policy):
    """Raises a user's exception in the hook named `hook` (plan, keep_drafting, observe or reset); exit=N:
    SystemExit(N) instead (sys.exit in a policy)."""

    def __init__(self, hook: str = "plan", exit: int | None = None):
        self.hook, self.exit = hook, exit

    def _maybe(self, hook):
        if hook == self.hook:
            if self.exit is not None:
                raise SystemExit(self.exit)
            raise RuntimeError(f"my bug in {hook}")

    def reset(self):
        self._maybe("reset")

    def plan(self, view):
        self._maybe("plan")
        return np.full(view.batch_size, 2, dtype=np.int64)

    def keep_drafting(self, view, position, confidence):
        self._maybe("keep_drafting")
        return ~np.isnan(confidence)

    def observe(self, view, accepted):
        self._maybe("observe")


class WritesInto(Policy):
    """Writes into the array a hook is handed (`hook`: keep_drafting's confidence or observe's accepted), as a
    policy that uses its argument as scratch space would."""

    def __init__(self, hook: str = "observe"):
        self.hook = hook

    def plan(self, view):
        return np.full(view.batch_size, 2, dtype=np.int64)

    def keep_drafting(self, view, position, confidence):
        if self.hook == "keep_drafting":
            confidence[:] = 1.0
        return ~np.isnan(confidence)

    def observe(self, view, accepted):
        if self.hook == "observe":
            accepted[:] = 0


class _HalfBuilt:
    """As an llvmlite object that a Ctrl-C left half-built inside numba's compilation: its __del__ fails."""

    def __del__(self):
        raise AttributeError("'PassBuilder' object has no attribute '_as_parameter_'")


_KEPT: list = []


class CtrlCLeavesHalfBuilt(Policy):
    """A real Ctrl-C (SIGINT to this process) while objects whose __del__ fails are alive: one in a reference
    cycle (freed by the collector while the interrupt is handled), one kept until the interpreter ends."""

    def plan(self, view):
        import gc
        import os
        import signal
        import time

        _KEPT.append(_HalfBuilt())
        cycle = [_HalfBuilt()]
        cycle.append(cycle)
        del cycle
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(2)   # the handler runs here
        gc.collect()
        return np.full(view.batch_size, 1, dtype=np.int64)


class InterruptedInCallback(Policy):
    """Ctrl-C as it lands while numba compiles a kernel: inside a ctypes callback, where Python cannot raise it
    (it prints "Exception ignored ..." and goes on), then the compiled code fails on what the callback left
    undone, as numba's "RuntimeError: no compiled object yet"."""

    def plan(self, view):
        import ctypes

        def interrupt():
            raise KeyboardInterrupt

        ctypes.CFUNCTYPE(None)(interrupt)()
        raise RuntimeError("no compiled object yet (the interrupted callback's work)")


class InterruptedInCallbackThenGoesOn(Policy):
    """Ctrl-C as it lands in a callback from compiled code whose work does not fail after it (a finalizer, a
    compilation that goes on): Python cannot raise it there, and the run would go on to its end. Each step then
    takes a millisecond, so that the run lasts seconds."""

    def reset(self):
        self._steps = 0

    def plan(self, view):
        import ctypes
        import time

        def interrupt():
            raise KeyboardInterrupt

        if self._steps == 0:
            ctypes.CFUNCTYPE(None)(interrupt)()
        self._steps += 1
        time.sleep(0.001)
        return np.full(view.batch_size, 1, dtype=np.int64)


class Overflowing(Policy):
    """Depth 1 everywhere, computed through an exp that overflows every step (a numerical slip a user's policy
    can make: the run goes on, numpy warns)."""

    def plan(self, view):
        big = np.exp(np.full(view.batch_size, 1000.0))   # inf, and a RuntimeWarning
        return np.minimum(big, 1.0).astype(np.int64)
