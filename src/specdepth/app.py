"""The Hydra app: one invocation = one run; `--multirun` = a grid.

    specdepth policy=fixed policy.depth=4 workload.batch_size=64
    specdepth --multirun policy=none,fixed,confidence workload.batch_size=1,8,64
"""
from __future__ import annotations

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
    executor = make(cfg, "backend", cost=cost, acceptance=acceptance, model=model, seed=seed,
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


def run(cfg: DictConfig, run_dir: str | Path) -> dict:
    """Run one configuration and write its results into run_dir. Returns summary.json's content."""
    config_yaml = OmegaConf.to_yaml(cfg, resolve=True)
    if cfg.get("resume", True):
        done = results.completed(run_dir, config_yaml)
        if done is not None:
            log.info("skipping %s: finished earlier with the same config (resume=true)", run_dir)
            return done
    parts = build(cfg)
    logger = make(cfg, "logger") if cfg.get("logger") is not None else None
    meta = dict(
        policy=parts["policy"].label,
        backend=parts["executor"].name,
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
            extra["acceptance_trace.jsonl"] = [
                {"request_id": r, "confidence": c, "accepted": a} for r, (c, a) in sorted(res.trace.items())]
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
            f"{f(s['tpot_p50_s'] and s['tpot_p50_s'] * 1e3, '.3f')} ms | FLOPs/token {f(s['flops_per_token'], '.3g')}")


def _discard_run_dir(run_dir) -> None:
    """A run that failed at start leaves nothing behind: drop its dir if it holds only Hydra's own
    files (.hydra/, the job log), never a result."""
    d = Path(run_dir)
    if not d.is_dir():
        return
    entries = list(d.iterdir())
    if all(e.name == ".hydra" or e.suffix == ".log" for e in entries):
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
