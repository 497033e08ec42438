"""The Hydra app: one invocation = one run; `--multirun` = a grid.

    specdepth policy=fixed policy.depth=4 workload.batch_size=64
    specdepth --multirun policy=none,fixed,confidence workload.batch_size=1,8,64
"""
from __future__ import annotations

import contextlib
import copy
import difflib
import errno
import fcntl
import functools
import json
import logging
import os
import _thread
import shutil
import signal
import sys
import threading
import warnings
from collections import Counter
from pathlib import Path

import hydra
import numpy as np
import yaml
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException, InstantiationException, OverrideParseException
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

import specdepth.conf
from . import checks, results, sweeps
from .results import timing_mode
from ._resolvers import run_identity
from .capacity import Capacity, Parallel
from .engine import REQUEST_COLUMNS, STEP_COLUMNS, Engine
from .errors import ConfigError, PolicyError, SpecdepthError, as_bool, as_int
from .metrics import summarize

log = logging.getLogger("specdepth")
CONF_DIR = str(Path(specdepth.conf.__file__).resolve().parent)


def make(cfg: DictConfig, key: str, **kwargs):
    """Instantiate config group `key`; any failure becomes a ConfigError naming the key (a PolicyError for
    the policy). `kwargs` (objects the app provides: cost, model, ...) go only to the constructors whose
    signature names them; a config key the constructor does not take is refused with the valid ones."""
    node = cfg.get(key)
    if node is None or not hasattr(node, "keys") or "_target_" not in node:
        raise ConfigError(f"{key}: missing (or has no _target_); pick one with {key}=<name>")
    target = node.get("_target_")
    try:
        # objects are passed to the partial, not through instantiate (which would turn them into configs)
        factory = instantiate(node, _partial_=True)
    except InstantiationException as e:
        cause = e.__cause__
        if isinstance(cause, SpecdepthError):
            raise cause from None
        detail = checks.one_line(cause if cause is not None else e)
        raise ConfigError(f"{key}: cannot build {target}: {detail}") from None
    except OmegaConfBaseException as e:
        raise ConfigError(f"{key}: {checks.one_line(e)}") from None
    kwargs = checks.constructor_kwargs(key, target, factory.func, factory.keywords, kwargs)
    try:
        return factory(**kwargs)
    except SpecdepthError:
        raise
    except Exception as e:  # missing parameters, or the constructor itself raised
        err = PolicyError if key == "policy" else ConfigError
        who = f"policy {target.rsplit('.', 1)[-1]}" if key == "policy" else f"{key}: {target}"
        raise err(f"{who}: __init__() raised {type(e).__name__}: {checks.one_line(e)}") from None


def _preset(cfg: DictConfig, group: str) -> dict | None:
    """The chosen preset file of a config group (conf/<group>/<choice>.yaml), resolved; None if unknown."""
    choice = _choice(group, None) or OmegaConf.select(cfg, f"{group}.name", default=None)
    f = Path(CONF_DIR) / group / f"{choice}.yaml"
    if not choice or not f.is_file():
        return None
    return copy.deepcopy(_load_preset(str(f), f.stat().st_mtime_ns))


@functools.lru_cache(maxsize=64)
def _load_preset(path: str, mtime_ns: int) -> dict | None:
    """A preset file, resolved; read once per version of the file (a sweep's jobs read the same few)."""
    try:
        return OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    except Exception:  # a preset that resolves only in the full config: compare nothing
        return None


try:   # OmegaConf.to_yaml's string representer (quotes what would load as a bool, int or float)
    from omegaconf._utils import OmegaConfDumper as _OmegaDumper
    _ConfigDumper = type("_ConfigDumper", (yaml.CDumper,), {})
    _ConfigDumper.add_representer(str, _OmegaDumper.str_representer)
except (ImportError, AttributeError):   # no libyaml, or another omegaconf: its own dumper
    _ConfigDumper = None


def config_yaml(cfg: DictConfig) -> str:
    """The text of OmegaConf.to_yaml(cfg, resolve=True) (tests/test_robustness.py checks it): OmegaConf's
    representers on libyaml's emitter, a third of the time for a config the size of experiment=robustness's."""
    if _ConfigDumper is None:
        return OmegaConf.to_yaml(cfg, resolve=True)
    container = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    return yaml.dump(container, default_flow_style=False, allow_unicode=True, sort_keys=False, Dumper=_ConfigDumper)


def make_model(cfg: DictConfig):
    """The model pair; a preset pointed at a local checkpoint takes that checkpoint's architecture and name
    (checks.checkpoint_kwargs) unless the config sets them."""
    node = cfg.get("model")
    plain = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else None
    extra = checks.checkpoint_kwargs(plain, _preset(cfg, "model")) if isinstance(plain, dict) else {}
    return make(cfg, "model", **extra)


def build(cfg: DictConfig) -> dict:
    """Every object of a run, validated, before anything runs or is written."""
    checks.check_top_level_keys(cfg, CONF_DIR)
    seed = as_int(cfg.get("seed", 0), "seed", min=0)
    checks.check_group_keys("decode", cfg.get("decode"), ("temperature", "top_p"))
    engine_cfg = make(cfg, "engine")
    model = make_model(cfg)
    hardware = make(cfg, "hardware") if cfg.get("hardware") is not None else None
    parallel = make(cfg, "parallel") if cfg.get("parallel") is not None else Parallel()
    draft_arch = model.draft_arch or model.target_arch
    parallel.check(model.target_arch, "target", model.name)
    parallel.check(draft_arch, "draft", model.name)
    cost = make(cfg, "cost", target=model.target_arch, draft=draft_arch, hardware=hardware, parallel=parallel,
                model_name=model.name)
    acceptance = make(cfg, "acceptance")
    workload = make(cfg, "workload")
    policy = make(cfg, "policy")
    checks.check_policy(policy, engine_cfg)
    backend_cls = _target_class(cfg, "backend")
    checks.before_loading(cfg, backend_cls, policy, parallel, model)
    # memory limits the simulated deployment; a real backend has the memory of the devices it runs on
    capacity = Capacity(model, hardware, parallel, engine_cfg.max_depth,
                        memory=getattr(backend_cls, "clock", "model") == "model")
    requests = workload.requests(np.random.default_rng(np.random.SeedSequence([seed, 0x3A7])))
    capacity.check([r for r in requests if r.text is None])   # before a backend loads models (text: its tokens)
    executor = make(cfg, "backend", cost=cost, acceptance_model=acceptance, model=model, seed=seed,
                    decode=cfg.get("decode"), engine=engine_cfg)
    parallel.check_backend(executor, cost)
    machine, budget_source = checks.machine_and_budget(executor, cost, hardware, engine_cfg)
    engine = Engine(policy, executor, cost, engine_cfg, requests, capacity=capacity)
    limited_by, limit, note = checks.batch_limits(workload, engine_cfg, capacity, len(requests))
    notes = ([note] if note else []) + checks.unused_decode(cfg.get("decode"), executor)
    return dict(seed=seed, engine=engine, model=model, hardware=hardware, cost=cost, acceptance=acceptance,
                workload=workload, policy=policy, executor=executor, machine=machine, budget_source=budget_source,
                warnings=notes, parallel=parallel, capacity=capacity, batch_limit=(limited_by, limit))


def _target_class(cfg: DictConfig, key: str):
    """The class config group `key` names in its _target_ (None when it names none or cannot be imported:
    make() then reports it)."""
    from hydra.utils import get_class
    try:
        return get_class(str(cfg[key]["_target_"]))
    except Exception:
        return None


def _choice(group: str, default):
    try:
        return HydraConfig.get().runtime.choices.get(group) or default
    except ValueError:  # not under Hydra (tests call run() directly)
        return default


@contextlib.contextmanager
def _claim(run_dir: str | Path):
    """Hold run_dir's lock for the whole run: two jobs with the same config (a duplicated grid point, or
    the same sweep started twice) never write one run dir at once; the second one then resumes."""
    path = Path(run_dir) / ".lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            log.info("waiting for another job running the same config in %s", run_dir)
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def finished(run_dir: str | Path, config_yaml: str) -> dict | None:
    """The summary of a finished run in run_dir whose config matches config_yaml, else None. Keys that
    do not change results (resume, name, logger, engine.progress: _resolvers.VOLATILE) may differ."""
    done = results.completed(run_dir, config_yaml)
    if done is not None:
        return done
    s, c = Path(run_dir) / results.SUMMARY, Path(run_dir) / results.CONFIG
    if not (s.is_file() and c.is_file()):
        return None
    try:
        old = OmegaConf.to_container(OmegaConf.create(c.read_text()))
        new = OmegaConf.to_container(OmegaConf.create(config_yaml))
        if not isinstance(old, dict) or run_identity(old) != run_identity(new):
            return None
        return json.loads(s.read_text())
    except Exception:  # an unreadable config.yaml or summary.json: run again
        return None


def run(cfg: DictConfig, run_dir: str | Path) -> dict:
    """Run one configuration and write its results into run_dir. Returns summary.json's content.

    resume=true (the default): a run dir that already holds summary.json for the same config is not run
    again; its summary is returned."""
    text = config_yaml(cfg)
    resume = as_bool(cfg.get("resume", True), "resume")
    with _claim(run_dir):
        if resume:
            done = finished(run_dir, text)
            if done is not None:
                log.info("skipping %s: finished earlier with the same config (resume=true)", run_dir)
                return done
        return _execute(cfg, run_dir, text)


def _execute(cfg: DictConfig, run_dir: str | Path, text: str) -> dict:
    parts = build(cfg)
    logger = make(cfg, "logger") if cfg.get("logger") is not None else None
    meta = dict(
        policy=parts["policy"].label,
        backend=parts["executor"].name,
        lossless=bool(parts["executor"].lossless),
        batch_size=parts["workload"].batch_size,
        model=parts["model"].name,
        hardware=parts["machine"],
        cost=_choice("cost", type(parts["cost"]).__name__),
        cost_model=checks.cost_label(parts["cost"], parts["hardware"]),
        token_budget_source=parts["budget_source"],
        acceptance=_choice("acceptance", type(parts["acceptance"]).__name__),
        workload=_choice("workload", type(parts["workload"]).__name__),
        seed=parts["seed"],
        warnings=parts["warnings"],
    )
    ok = False
    if logger is not None:
        logger.start(OmegaConf.to_container(cfg, resolve=True), str(run_dir), meta)
    try:
        with runtime_warnings() as seen:
            res = parts["engine"].run()
        meta["warnings"] = meta["warnings"] + seen
        summary = summarize(res, **meta)
        ran, notes = checks.what_ran(cfg, parts)
        summary.update(ran)
        summary["warnings"] = summary["warnings"] + notes
        summary["peak_kv_gb"] = parts["capacity"].peak_kv_gb   # per GPU, target + draft KV (issue 16)
        summary.update(parts["executor"].summary_fields())
        tables = {"steps.csv": (STEP_COLUMNS, res.steps), "requests.csv": (REQUEST_COLUMNS, res.requests)}
        extra = dict(res.extra)
        if res.trace is not None:
            extra["acceptance_trace.jsonl"] = res.trace
        results.write_run(run_dir, summary=summary, config_yaml=text, tables=tables, extra=extra)
        ok = True
        if logger is not None:
            try:
                logger.log(summary, (STEP_COLUMNS, res.steps))
            except Exception as e:  # a tracker failure never loses local results
                log.warning("logger failed (local results are safe in %s): %s", run_dir, e)
        log.info("run took %.2f s of wall time", res.wall_s)
    finally:
        if logger is not None:
            try:
                logger.finish(ok)
            except Exception as e:
                log.warning("logger.finish failed: %s", e)
    return summary


@contextlib.contextmanager
def runtime_warnings():
    """Yields a list that, once the block is done, holds each distinct RuntimeWarning raised inside it (numpy's
    overflow, invalid value, division by zero: numerical trouble in a policy or an executor) as one line with its
    count and where it came from; each is also logged. summary.json's `warnings` keeps them, so that they are seen
    in the results of every run they happened in, not once per worker process on a terminal (Python shows a
    warning once per place and process). A filter that makes RuntimeWarning an error (`-W error::RuntimeWarning`,
    PYTHONWARNINGS) or ignores it is left as it is; other warnings are shown as usual."""
    counts: Counter = Counter()
    lines: list[str] = []
    with warnings.catch_warnings():   # restores the filters and showwarning on the way out
        if _runtime_action() not in ("error", "ignore"):
            warnings.simplefilter("always", RuntimeWarning)
        show = warnings.showwarning

        def record(message, category, filename, lineno, file=None, line=None):
            if issubclass(category, RuntimeWarning):
                counts[f"{category.__name__} at {Path(filename).name}:{lineno}: {message}"] += 1
            else:
                show(message, category, filename, lineno, file, line)

        warnings.showwarning = record
        try:
            yield lines
        finally:
            for text, n in counts.items():
                lines.append(f"{text} ({n} time{'s' if n > 1 else ''})")
                log.warning("%s", lines[-1])


def _runtime_action() -> str:
    """What the warning filters do with a RuntimeWarning raised anywhere (the first filter that matches any
    message and module)."""
    for action, message, category, module, lineno in warnings.filters:
        if issubclass(RuntimeWarning, category) and lineno == 0 and (message is None or message.match("")) \
                and (module is None or module.match("")):
            return action
    return warnings.defaultaction


def format_summary(s: dict) -> str:
    def f(v, fmt):
        return "-" if v is None else format(v, fmt)
    batch = f"batch {s['batch_size']}"
    if s.get("batch_limited_by"):
        batch += f" (at most {s.get('batch_limit')} at once: {s['batch_limited_by']})"
    return (f"{s['policy']} on {s['backend']} | {batch} | {s['output_tokens']} tokens in "
            f"{f(s['time_s'], '.4g')} s = {f(s['throughput_tok_s'], ',.0f')} tok/s | tokens/step "
            f"{f(s['tokens_per_step'], '.3f')} | acceptance {f(s['acceptance_rate'], '.3f')} | TPOT p50 "
            f"{f(s['tpot_p50_s'] and s['tpot_p50_s'] * 1e3, '.3f')} ms | FLOPs/token {f(s['flops_per_token'], '.3g')}"
            + (" | TIMING MODE: accept/reject simulated, outputs are not the target's" if timing_mode(s) else ""))


def _discard_run_dir(run_dir) -> None:
    """A run that failed at start leaves nothing behind: drop its dir if it holds only Hydra's own
    files (.hydra/, the job log) and the run lock, never a result."""
    d = Path(run_dir)
    if not d.is_dir():
        return
    entries = list(d.iterdir())
    if all(e.name in (".hydra", ".lock") or e.suffix == ".log" for e in entries):
        shutil.rmtree(d, ignore_errors=True)


def _job_failed(run_dir: str, message: str, multirun: bool):
    """A job's clean failure: one line on stderr. A single run leaves nothing behind and exits with code 2; a
    job of a sweep records its error (sweeps.record_failure) and the sweep goes on."""
    print(message, file=sys.stderr, flush=True)
    if not multirun:
        _discard_run_dir(run_dir)
        raise SystemExit(2)
    hc = HydraConfig.get()
    sweeps.record_failure(run_dir, hc.sweep.dir, hc.overrides.task, message)
    return None   # the Optuna sweeper records a trial without a number as failed (a NaN fails its own bookkeeping)


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def _task(cfg: DictConfig):
    hc = HydraConfig.get()
    run_dir, multirun = hc.runtime.output_dir, hc.mode == RunMode.MULTIRUN
    try:
        return _job(cfg, run_dir, multirun)
    except KeyboardInterrupt:   # wherever it lands, the run dir holds no half-written result afterwards
        _interrupt_handled()
        try:
            _discard_run_dir(run_dir)
        except KeyboardInterrupt:   # pressed again while cleaning up: clean up, then stop
            _discard_run_dir(run_dir)
        raise


def _job(cfg: DictConfig, run_dir: str, multirun: bool):
    try:
        summary = run(cfg, run_dir)
    except SystemExit as e:   # sys.exit() in a policy or plug-in: the run failed, whatever its code
        if _debug() and not multirun:
            _discard_run_dir(run_dir)
            raise
        return _job_failed(run_dir, f"specdepth: error: {_exit_culprit(e)} raised SystemExit({e.code!r}): the run "
                           f"stopped before its results; a policy must not call sys.exit() or exit() (raise an "
                           f"exception to fail the run)", multirun)
    except SpecdepthError as e:
        if _interrupted(e):   # a Ctrl-C that could not be raised (_unraisable) made this fail
            raise KeyboardInterrupt from None
        if _debug() and not multirun:
            _discard_run_dir(run_dir)
            raise
        return _job_failed(run_dir, f"specdepth: error: {checks.one_line(e)}", multirun)
    except Exception as e:  # a bug, not the user's input: a sweep records it and goes on
        if _interrupted(e):   # Ctrl-C inside compiled code arrives wrapped in a SystemError
            raise KeyboardInterrupt from None
        if _full(e) and not _debug():   # a full disk: the machine's state, not a bug
            return _job_failed(run_dir, f"specdepth: error: {_input_error(e)}", multirun)
        if not multirun or _debug():
            _discard_run_dir(run_dir)
            raise
        return _job_failed(run_dir, f"specdepth: unexpected error: {type(e).__name__}: {checks.one_line(e)}", True)
    Path(run_dir, sweeps.ERROR).unlink(missing_ok=True)   # an earlier failure of this job, now fixed
    print(format_summary(summary), flush=True)
    if not multirun:
        print(f"results: {run_dir}", flush=True)
    return summary.get("throughput_tok_s")


def _exit_culprit(e: BaseException) -> str:
    """Who raised `e`: "policy <name>: <hook>()" when a policy hook did (engine.Engine._hook's frame), else the
    function and file of the innermost frame."""
    tb, who = e.__traceback__, "the run"
    while tb is not None:
        f = tb.tb_frame
        if f.f_code.co_name == "_hook" and "hook" in f.f_locals and hasattr(f.f_locals.get("self"), "_pname"):
            return f"policy {f.f_locals['self']._pname}: {f.f_locals['hook']}()"
        who = f"{f.f_code.co_name}() in {Path(f.f_code.co_filename).name}"
        tb = tb.tb_next
    return who


def _interrupted(e: BaseException) -> bool:
    if _SWALLOWED[0]:   # a Ctrl-C that Python could not raise (_unraisable): what failed after it is its doing
        _interrupt_handled()
        return True
    seen = 0
    while e is not None and seen < 20:
        if isinstance(e, KeyboardInterrupt):
            return True
        e, seen = e.__cause__ or e.__context__, seen + 1
    return False


_SWALLOWED = [False]   # a KeyboardInterrupt reached sys.unraisablehook during this command
_REDELIVERY: list = [None]   # the timer that raises a swallowed Ctrl-C again (_unraisable), until it is handled
_REDELIVER_S = 0.05   # a swallowed Ctrl-C is raised again this much later (_unraisable)


def _unraisable(u) -> None:
    """sys.unraisablehook of the `specdepth` command. A Ctrl-C that lands in a callback from compiled code
    (numba compiling a kernel on its first use, inside llvmlite's ctypes callback) or in a finalizer cannot
    propagate: Python prints "Exception ignored ..." with a traceback and the code goes on, either to fail on what
    the callback left undone ("RuntimeError: no compiled object yet") or to the run's end. Remember it, quietly
    (main() then reports the interrupt), and deliver it again a moment later in the main thread, where it can be
    raised; a redelivered one that is swallowed too is delivered again, until the interrupt is being handled.
    After a real Ctrl-C, what other destructors print is noise and is dropped."""
    if u.exc_type is not None and issubclass(u.exc_type, KeyboardInterrupt):
        _SWALLOWED[0] = True
        timer = _REDELIVERY[0]   # False once the interrupt is being handled: nothing to deliver again
        if timer is None or (timer is not False and not timer.is_alive()):   # again, if that one was swallowed too
            _REDELIVERY[0] = timer = threading.Timer(_REDELIVER_S, _thread.interrupt_main)
            timer.daemon = True
            timer.start()
        return
    if _SIGINT[0]:   # the process is being stopped: a destructor failing after the interrupt is noise
        return
    sys.__unraisablehook__(u)


def _interrupt_handled() -> None:
    """The Ctrl-C is being handled: a swallowed one need not be raised again (_unraisable)."""
    timer, _REDELIVERY[0] = _REDELIVERY[0], False
    if timer:
        timer.cancel()


def _debug() -> bool:
    """HYDRA_FULL_ERROR=1 or SPECDEPTH_DEBUG=1 (as the user set them: main() sets HYDRA_FULL_ERROR itself and
    keeps the user's value in _SPECDEPTH_FULL_ERROR): full tracebacks instead of one-line errors."""
    full = os.environ.get("_SPECDEPTH_FULL_ERROR", os.environ.get("HYDRA_FULL_ERROR", ""))
    return any(v not in ("", "0") for v in (full, os.environ.get("SPECDEPTH_DEBUG", "")))


_INTERRUPTED = "specdepth: interrupted (Ctrl-C); finished runs are kept, rerun the command to resume"
_SIGINT = [False]   # a real Ctrl-C (SIGINT) reached this command (_on_sigint)


def _on_sigint(signum, frame):
    """The `specdepth` command's SIGINT handler: Python's own (raise KeyboardInterrupt), remembering that the
    process is being stopped (_unraisable then drops what destructors print; _exit_interrupted ends it at once)."""
    _SIGINT[0] = True
    raise KeyboardInterrupt


def _exit_interrupted():
    """The interrupt's one line, then exit code 130. After a real Ctrl-C the process ends at once (os._exit,
    after flushing): interrupted in numba's compilation, llvmlite objects left half-built print AttributeErrors
    from their __del__ when the interpreter tears down ("'PassBuilder' object has no attribute
    '_as_parameter_'"); no result file is open then, the run dir is already cleaned up (_task) and the log
    handlers flush every record."""
    _interrupt_handled()
    print(_INTERRUPTED, file=sys.stderr, flush=True)
    if _SIGINT[0]:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(130)
    raise SystemExit(130) from None
# errors in the user's input that Hydra or OmegaConf raise before the run starts (exit code 2)
_INPUT_ERRORS = (HydraException, OmegaConfBaseException, OSError, SpecdepthError)


def main():
    """The `specdepth` command: every error is one line on stderr (exit code 2 for bad input, 1 for a failed
    sweep or a bug, 130 for Ctrl-C) unless HYDRA_FULL_ERROR=1 / SPECDEPTH_DEBUG=1 asks for the traceback."""
    debug = _debug()
    saved = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["_SPECDEPTH_FULL_ERROR"] = "1" if debug else ""
    os.environ["HYDRA_FULL_ERROR"] = "1"   # Hydra re-raises; the errors are reported here
    sweeps.last_failures.clear()
    sweeps.running[0] = None
    checks.clear_logged()
    _SWALLOWED[0], _REDELIVERY[0] = False, None
    # a log line that cannot be written (a full disk) is dropped, not printed as a traceback; the write that
    # matters (a result, failures.jsonl) reports it
    raise_log_errors, logging.raiseExceptions = logging.raiseExceptions, False
    hook, sys.unraisablehook = sys.unraisablehook, _unraisable
    _SIGINT[0] = False
    sigint = signal.getsignal(signal.SIGINT)
    ours = sigint is signal.default_int_handler and threading.current_thread() is threading.main_thread()
    if ours:   # Python's handler (not SIG_IGN: a job started in the background keeps ignoring Ctrl-C)
        signal.signal(signal.SIGINT, _on_sigint)
    try:
        _task()
        if _SWALLOWED[0]:   # the run ended before the swallowed Ctrl-C could be raised again (_unraisable)
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        _exit_interrupted()
    except _INPUT_ERRORS as e:
        if _interrupted(e):
            _exit_interrupted()
        if debug:
            raise
        print(f"specdepth: error: {_input_error(e)}", file=sys.stderr, flush=True)
        sweeps.record_stop(f"specdepth: error: {_input_error(e)}")
        raise SystemExit(2) from None
    except Exception as e:
        if _interrupted(e):
            _exit_interrupted()
        if debug:
            raise
        if sweeps.running[0] is not None and "No trials are completed" in str(e):   # Optuna: every trial failed
            print(f"specdepth: error: no trial of the Optuna study finished (their errors: "
                  f"{Path(sweeps.running[0]) / sweeps.FAILURES})", file=sys.stderr, flush=True)
            raise SystemExit(1) from None
        print(f"specdepth: unexpected error: {type(e).__name__}: {checks.one_line(e)} "
              f"(HYDRA_FULL_ERROR=1 shows the traceback)", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    finally:
        _interrupt_handled()
        if ours:
            signal.signal(signal.SIGINT, sigint)
        logging.raiseExceptions = raise_log_errors
        sys.unraisablehook = hook
        os.environ.pop("_SPECDEPTH_FULL_ERROR", None)
        if saved is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = saved
    if sweeps.last_failures:
        raise SystemExit(1)


def _unknown_key(e: BaseException) -> str | None:
    """Hydra's "Could not override 'grid.batchs' ... Key 'batchs' is not in struct" as one line naming the key,
    the nearest known one and the valid ones; None for any other error."""
    c = e.__cause__
    parent = getattr(c, "parent_node", None)
    if not isinstance(c, OmegaConfBaseException) or "not in struct" not in str(c) or not hasattr(parent, "keys"):
        return None
    key, full = str(getattr(c, "key", "")), str(getattr(c, "full_key", "") or "")
    valid = sorted(str(k) for k in parent.keys())
    near = difflib.get_close_matches(key, [k for k in valid if not k.startswith("_")], n=1)
    return (f"{full or key}: unknown key" + (f" (did you mean {full.rsplit('.', 1)[0] + '.' if '.' in full else ''}"
            f"{near[0]}?)" if near else "") + f"; valid keys: {', '.join(valid)}")


def _full(e: BaseException) -> bool:
    """A write failed for want of space: a full disk, a quota, a file size limit."""
    return isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def _input_error(e: Exception) -> str:
    if isinstance(e, OverrideParseException):
        return f"cannot parse the override {e.override!r}: {checks.one_line(e)}"
    unknown = _unknown_key(e)
    if unknown is not None:
        return unknown
    if _full(e):
        where = f" writing {e.filename}" if e.filename is not None else ""
        return (f"{e.strerror or type(e).__name__}{where}: free space (or raise the quota) and rerun the command; "
                f"finished runs are kept (resume=true)")
    if isinstance(e, OSError) and e.filename is not None:
        return f"cannot write {e.filename}: {e.strerror or type(e).__name__} (check hydra.run.dir / hydra.sweep.dir)"
    text = checks.one_line(e)
    cause = e.__cause__
    if cause is not None and checks.one_line(cause) not in text:
        text += f" ({checks.one_line(cause)})"
    return text
