"""The Hydra app: one invocation = one run; `--multirun` = a grid.

    specdepth policy=fixed policy.depth=4 workload.batch_size=64
    specdepth --multirun policy=none,fixed,confidence workload.batch_size=1,8,64
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import shutil
import sys
from pathlib import Path

import hydra
import numpy as np
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

import specdepth.conf
from . import results
from .results import timing_mode
from ._resolvers import run_identity
from .engine import REQUEST_COLUMNS, STEP_COLUMNS, Engine
from .errors import ConfigError, SpecdepthError, as_int
from .metrics import summarize

log = logging.getLogger("specdepth")
CONF_DIR = str(Path(specdepth.conf.__file__).resolve().parent)


def make(cfg: DictConfig, key: str, **kwargs):
    """Instantiate config group `key`; any failure becomes a ConfigError naming the key."""
    node = cfg.get(key)
    if node is None or "_target_" not in node:
        raise ConfigError(f"{key}: missing (or has no _target_); pick one with {key}=<name>")
    target = node.get("_target_")
    try:
        # objects are passed to the partial, not through instantiate (which would turn them into configs)
        factory = instantiate(node, _partial_=True)
    except InstantiationException as e:
        cause = e.__cause__
        if isinstance(cause, SpecdepthError):
            raise cause from None
        detail = str(cause) if cause is not None else str(e).splitlines()[0]
        raise ConfigError(f"{key}: cannot build {target}: {detail}") from None
    try:
        return factory(**kwargs)
    except TypeError as e:  # unknown or missing parameters
        raise ConfigError(f"{key}: cannot build {target}: {e}") from None


def build(cfg: DictConfig) -> dict:
    """Every object of a run, validated, before anything runs or is written."""
    seed = as_int(cfg.get("seed", 0), "seed", min=0)
    engine_cfg = make(cfg, "engine")
    model = make(cfg, "model")
    hardware = make(cfg, "hardware") if cfg.get("hardware") is not None else None
    draft_arch = model.draft_arch or model.target_arch
    cost = make(cfg, "cost", target=model.target_arch, draft=draft_arch, hardware=hardware)
    acceptance = make(cfg, "acceptance")
    workload = make(cfg, "workload")
    policy = make(cfg, "policy")
    executor = make(cfg, "backend", cost=cost, acceptance_model=acceptance, model=model, seed=seed,
                    decode=cfg.get("decode"), engine=engine_cfg)
    requests = workload.requests(np.random.default_rng(np.random.SeedSequence([seed, 0x3A7])))
    engine = Engine(policy, executor, cost, engine_cfg, requests)
    return dict(seed=seed, engine=engine, model=model, hardware=hardware, cost=cost, acceptance=acceptance,
                workload=workload, policy=policy, executor=executor)


def _choice(group: str, default: str) -> str:
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
    config_yaml = OmegaConf.to_yaml(cfg, resolve=True)
    with _claim(run_dir):
        if cfg.get("resume", True):
            done = finished(run_dir, config_yaml)
            if done is not None:
                log.info("skipping %s: finished earlier with the same config (resume=true)", run_dir)
                return done
        return _execute(cfg, run_dir, config_yaml)


def _execute(cfg: DictConfig, run_dir: str | Path, config_yaml: str) -> dict:
    parts = build(cfg)
    logger = make(cfg, "logger") if cfg.get("logger") is not None else None
    meta = dict(
        policy=parts["policy"].label,
        backend=parts["executor"].name,
        lossless=bool(parts["executor"].lossless),
        batch_size=parts["workload"].batch_size,
        model=parts["model"].name,
        hardware=parts["hardware"].name if parts["hardware"] is not None else None,
        cost=_choice("cost", type(parts["cost"]).__name__),
        acceptance=_choice("acceptance", type(parts["acceptance"]).__name__),
        workload=_choice("workload", type(parts["workload"]).__name__),
        seed=parts["seed"],
    )
    cfg_dict = OmegaConf.to_container(cfg, resolve=True)
    ok = False
    if logger is not None:
        logger.start(cfg_dict, str(run_dir), meta)
    try:
        res = parts["engine"].run()
        summary = summarize(res, **meta)
        tables = {"steps.csv": (STEP_COLUMNS, res.steps), "requests.csv": (REQUEST_COLUMNS, res.requests)}
        extra = dict(res.extra)
        if res.trace is not None:
            extra["acceptance_trace.jsonl"] = res.trace
        results.write_run(run_dir, summary=summary, config_yaml=config_yaml, tables=tables, extra=extra)
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


def format_summary(s: dict) -> str:
    def f(v, fmt):
        return "-" if v is None else format(v, fmt)
    return (f"{s['policy']} on {s['backend']} | batch {s['batch_size']} | {s['output_tokens']} tokens in "
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


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def _task(cfg: DictConfig):
    run_dir = HydraConfig.get().runtime.output_dir
    try:
        summary = run(cfg, run_dir)
    except SpecdepthError as e:
        print(f"specdepth: error: {e}", file=sys.stderr, flush=True)
        _discard_run_dir(run_dir)
        raise SystemExit(2) from None
    print(format_summary(summary), flush=True)
    return summary.get("throughput_tok_s")


def main():
    _task()
