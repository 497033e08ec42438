"""Guard rails of the plug-in protocols (docs/plugins.md) for plug-ins written outside this package.

A cost model, acceptance model or executor whose class is not specdepth's own is called through a checked
adapter: a call that raises, or an answer of the wrong arity, type or shape, becomes a `PluginError` naming
the plug-in, the hook and what the protocol expects. A cost model is probed once, before the run (its methods
are pure). The previous release's forms of a hook keep working for one release with a DeprecationWarning that
names the new form (CHANGELOG.md). specdepth's own plug-ins are used as they are: their tests hold them to the
protocol, and their hot paths pay nothing. Policies are checked by the engine itself (engine._hook).
"""
from __future__ import annotations

import inspect
import logging
import math
import numbers
import warnings

import numpy as np

from .errors import PluginError
from .executor import Executor

log = logging.getLogger("specdepth")


def foreign(obj) -> bool:
    """True for a plug-in whose class is defined outside the specdepth package."""
    return not type(obj).__module__.startswith("specdepth.")


def deprecated(kind: str, name: str, old: str, new: str) -> None:
    """Warn (DeprecationWarning, and the run's log) that plug-in `name` implements the old form of a hook."""
    msg = (f"{kind} {name}: {old} is the previous protocol's form, kept for one release; implement {new} "
           f"(docs/plugins.md, CHANGELOG.md)")
    warnings.warn(msg, DeprecationWarning, stacklevel=3)
    log.warning(msg)


def _takes(fn, *args) -> bool:
    """Whether fn's signature accepts these positional arguments (True where it cannot be read)."""
    try:
        inspect.signature(fn).bind(*args)
    except TypeError:
        return False
    except ValueError:
        return True
    return True


#: each policy hook's form (policy.Policy), by the number of arguments the engine passes
POLICY_HOOKS = {"reset": ("reset()", 0), "plan": ("plan(view) -> int depths [batch_size]", 1),
                "keep_drafting": ("keep_drafting(view, position, confidence) -> bool mask [batch_size]", 3),
                "observe": ("observe(view, accepted) -> None", 2)}


def policy_expects(fn, hook: str) -> str:
    """'; expected <form>' where the policy's hook cannot take the engine's arguments, else ''."""
    form, n = POLICY_HOOKS[hook]
    return "" if _takes(fn, *([None] * n)) else f"; expected {form}"


class _Checked:
    """Calls a plug-in's hooks; what they raise or answer wrongly becomes a PluginError."""

    kind = "plug-in"

    def __init__(self, obj):
        self._obj, self._name = obj, type(obj).__name__

    def __getattr__(self, attr):   # plain attributes (name, clock, ...) and hooks not checked here
        return getattr(self._obj, attr)

    def _bad(self, hook: str, expected: str, got) -> PluginError:
        return PluginError(f"{self.kind} {self._name}: {hook} {got}; expected {expected}")

    def _call(self, hook: str, expected: str, *args):
        fn = getattr(self._obj, hook.split("(")[0], None)
        if fn is None:
            raise self._bad(hook, expected, "is missing")
        try:
            return fn(*args)
        except PluginError:
            raise
        except Exception as e:
            raise self._bad(hook, expected, f"raised {type(e).__name__}: {e}") from e

    def _array(self, hook, expected, a, shape, kinds: str):
        if not isinstance(a, np.ndarray) or a.shape != shape or a.dtype.kind not in kinds:
            got = (f"{a.dtype} array of shape {a.shape}" if isinstance(a, np.ndarray) else type(a).__name__)
            raise self._bad(hook, expected, f"returned {got}")
        return a

    def _tuple(self, hook, expected, v, n: int) -> tuple:
        if not isinstance(v, tuple) or len(v) != n:
            got = f"a tuple of {len(v)}" if isinstance(v, tuple) else type(v).__name__
            raise self._bad(hook, expected, f"returned {got}")
        return v

    def _seconds(self, hook, expected, *values) -> None:
        for v in values:
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) or v < 0:
                raise self._bad(hook, expected, f"returned {v!r} where a finite number >= 0 belongs")


# ---- cost models ---------------------------------------------------------------------------------------
_PAIR = "(seconds, flops): two finite floats >= 0"


class _CostProbe(_Checked):
    kind = "cost model"

    def _call(self, hook, expected, *args):
        if not hasattr(self._obj, hook.split("(")[0]):   # not a CostModel: it fails where a caller needs it
            return None
        return super()._call(hook, expected, *args)

    def run(self) -> None:
        ctx, q, d = np.array([8, 9], np.int64), np.array([1, 2], np.int64), np.array([1, 2], np.int64)
        for hook in ("target_forward(ctx, q)", "draft_forward(ctx, q)", "draft_positions(ctx, depths)"):
            v = self._call(hook, _PAIR, ctx, q if "forward" in hook else d)
            if v is not None:
                self._seconds(hook, _PAIR, *self._tuple(hook, _PAIR, v, 2))
        for hook, args in (("verify_time(ctx, depths)", (ctx, d)), ("draft_time(ctx)", (ctx,)),
                           ("step_time(ctx, depths)", (ctx, d))):
            t = self._call(hook, "seconds", *args)
            if t is not None:
                self._seconds(hook, "seconds: a finite float >= 0", t)
        for hook, args in (("verify_times(ctx, totals)", (ctx, np.array([0.0, 2.0]))),
                           ("draft_times(context, rows)", (8.0, np.array([1, 2])))):
            expected = "seconds per entry: a float array of shape (2,)"
            t = self._call(hook, expected, *args)
            if t is not None:
                self._seconds(hook, expected, *self._array(hook, expected, t, (2,), "f").tolist())


def check_cost(cost) -> None:
    """Probe a foreign cost model's methods once on a two-row batch (before the run; nothing is kept). A method
    it lacks is skipped: a CostModel subclass has them all; a partial one fails where a caller needs it."""
    if foreign(cost):
        _CostProbe(cost).run()


# ---- acceptance models ---------------------------------------------------------------------------------
class _Acceptance(_Checked):
    kind = "acceptance model"

    def __init__(self, model):
        super().__init__(model)
        self._legacy = not _takes(model.admit, np.zeros(0, np.int64), slice(0, 0)) and _takes(
            model.admit, np.zeros(0, np.int64))
        if self._legacy:
            deprecated(self.kind, self._name, "admit(request_ids), with the engine calling retire(keep)",
                       "admit(request_ids, new): fill the run's RowTable rows `new`, declared as COLUMNS")
        self._n = 0

    def reset(self, rng) -> None:
        self._call("reset(rng)", "reset(rng) -> None", rng)

    def attach(self, rows) -> None:
        self._rows = rows
        self._call("attach(rows)", "attach(rows) -> None (AcceptanceModel.attach)", rows)
        if self._legacy:   # the old form keeps its own rows: the table's retirement calls its retire
            rows.on_retire(lambda keep: self._call("retire(keep)", "retire(keep) -> None", keep))

    def admit(self, request_ids, new) -> None:
        if self._legacy:
            self._call("admit(request_ids)", "admit(request_ids) -> None", request_ids)
        else:
            self._call("admit(request_ids, new)", "admit(request_ids, new) -> None", request_ids, new)

    def sample(self, n: int, k: int):
        e = f"(confidence float [{n}, {k}], accepted bool [{n}, {k}])"
        conf, acc = self._tuple("sample(n, k)", e, self._call("sample(n, k)", e, n, k), 2)
        self._array("sample(n, k)", e, conf, (n, k), "f")
        self._array("sample(n, k)", e, acc, (n, k), "b")
        return conf, acc

    def leading(self, drafted):
        if not hasattr(self._obj, "leading"):   # optional
            return None
        e = f"None, or accepted drafts per row: int [{drafted.shape[0]}] within 0..drafted"
        a = self._call("leading(drafted)", e, drafted)
        if a is not None:
            self._array("leading(drafted)", e, a, drafted.shape, "iu")
            if ((a < 0) | (a > drafted)).any():
                raise self._bad("leading(drafted)", e, "returned counts outside 0..drafted")
        return a

    def draw(self, rows, offset, conf, acc) -> bool:
        if not hasattr(self._obj, "draw"):   # optional
            return False
        e = "True (conf and acc filled at rows, offset) or False (not offered)"
        v = self._call("draw(rows, offset, conf, acc)", e, rows, offset, conf, acc)
        if not isinstance(v, (bool, np.bool_)):
            raise self._bad("draw(rows, offset, conf, acc)", e, f"returned {type(v).__name__}")
        return bool(v)

    def commit(self, drafted, accepted) -> None:
        self._call("commit(drafted, accepted)", "commit(drafted, accepted) -> None", drafted, accepted)

    def probability(self, conf):
        e = f"float array of conf's shape {conf.shape}"
        return self._array("probability(conf)", e, self._call("probability(conf)", e, conf), conf.shape, "f")

    def expected_probability(self, k: int):
        n = self._rows.n
        e = f"float [{n}, {k}]"
        return self._array("expected_probability(k)", e, self._call("expected_probability(k)", e, k), (n, k), "f")


def checked_acceptance(model):
    """A foreign acceptance model through its checked adapter; specdepth's own as it is."""
    return _Acceptance(model) if foreign(model) else model


# ---- executors -------------------------------------------------------------------------------------------
class _Executor(_Checked):
    kind = "executor"

    def __init__(self, ex):
        super().__init__(ex)
        has = lambda hook: callable(getattr(type(ex), hook, None))   # noqa: E731
        self._old_prefill = not _takes(ex.prefill, [], slice(0, 0)) and _takes(ex.prefill, [])
        self._old_begin = not _takes(ex.begin_step, np.zeros(0, np.int64), 0) and _takes(ex.begin_step,
                                                                                         np.zeros(0, np.int64))
        self._old_check = has("check") and getattr(type(ex), "prepare", None) is Executor.prepare
        self._old_retire = has("retire")
        for old, flag, new in (
                ("prefill(requests)", self._old_prefill, "prefill(requests, new): the engine appends the rows first"),
                ("begin_step(depths)", self._old_begin, "begin_step(depths, kmax)"),
                ("check(requests)", self._old_check, "prepare(requests) -> the requests it will serve"),
                ("retire(keep)", self._old_retire, "attach(rows) with rows.on_retire(hook), or per-row columns")):
            if flag:
                deprecated(self.kind, self._name, old, new)

    def prepare(self, requests):
        if self._old_check:
            self._call("check(requests)", "check(requests) -> None", requests)
            return requests
        e = "prepare(requests) -> a list of the requests it will serve"
        out = self._call("prepare(requests)", e, requests)
        if not isinstance(out, list):
            raise self._bad("prepare(requests)", e, f"returned {type(out).__name__}")
        return out

    def attach(self, rows) -> None:
        self._call("attach(rows)", "attach(rows) -> None", rows)
        if self._old_retire:
            rows.on_retire(lambda keep: self._call("retire(keep)", "retire(keep) -> None", keep))

    def prefill(self, requests, new):
        e = "(seconds, target_flops, draft_flops): three finite floats >= 0"
        hook = "prefill(requests)" if self._old_prefill else "prefill(requests, new)"
        v = self._tuple(hook, e, self._call(hook, e, *((requests,) if self._old_prefill else (requests, new))), 3)
        self._seconds(hook, e, *v)
        return v

    def begin_step(self, depths, kmax) -> None:
        if self._old_begin:
            self._call("begin_step(depths)", "begin_step(depths) -> None", depths)
        else:
            self._call("begin_step(depths, kmax)", "begin_step(depths, kmax) -> None", depths, kmax)

    def draft(self, rows, position):
        e = f"(confidence float [{rows.shape[0]}], seconds, flops)"
        conf, t, f = self._tuple("draft(rows, position)", e, self._call("draft(rows, position)", e, rows, position), 3)
        self._array("draft(rows, position)", e, np.asarray(conf) if isinstance(conf, list) else conf, rows.shape, "f")
        self._seconds("draft(rows, position)", e, t, f)
        return np.asarray(conf, float), t, f

    def draft_block(self, depths):
        e = "(seconds, flops): two finite floats >= 0"
        if getattr(type(self._obj), "draft_block", Executor.draft_block) is Executor.draft_block:
            return Executor.draft_block(self, depths)   # the default: position by position, each draft checked
        v = self._tuple("draft_block(depths)", e, self._call("draft_block(depths)", e, depths), 2)
        self._seconds("draft_block(depths)", e, *v)
        return v

    def verify(self, drafted):
        e = f"(accepted: int [{drafted.shape[0]}] within 0..drafted, seconds, flops)"
        acc, t, f = self._tuple("verify(drafted)", e, self._call("verify(drafted)", e, drafted), 3)
        self._array("verify(drafted)", e, acc, drafted.shape, "iu")
        if ((acc < 0) | (acc > drafted)).any():
            raise self._bad("verify(drafted)", e, "returned accepted counts outside 0..drafted")
        self._seconds("verify(drafted)", e, t, f)
        return acc.astype(np.int64, copy=False), t, f

    def finish(self) -> dict:
        e = "finish() -> {file name: list of JSON-able records}"
        out = self._call("finish()", e)
        if not isinstance(out, dict):
            raise self._bad("finish()", e, f"returned {type(out).__name__}")
        return out


def checked_executor(ex):
    """A foreign executor through its checked adapter; specdepth's own as it is."""
    return _Executor(ex) if foreign(ex) else ex
