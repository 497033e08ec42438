"""Build-time checks of a run's configuration: unknown config keys, what each constructor accepts, a policy's
depth against the engine's cap, batch limits, local checkpoints, and what the cost model describes.

Each check either raises a SpecdepthError naming the key, file or policy at fault, or returns what the run
must record so that its summary says what ran (app.build calls them before anything runs or is written).
"""
from __future__ import annotations

import difflib
import functools
import inspect
import json
import logging
from pathlib import Path

import numpy as np
import yaml

from .errors import ConfigError, PolicyError

log = logging.getLogger("specdepth")

# keys Hydra's instantiate reads itself (not constructor arguments)
_HYDRA_KEYS = {"_target_", "_partial_", "_recursive_", "_convert_", "_args_"}


def _params(func):
    """(named parameters, accepts **kwargs) of a class's constructor or a function; None when unknown."""
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):
        return None
    named = {n for n, p in sig.parameters.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    return named, any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values())


def _required(func) -> list[str]:
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):
        return []
    return [n for n, p in sig.parameters.items()
            if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def constructor_kwargs(key: str, target: str, func, user_keys, provided: dict) -> dict:
    """The app's objects (`provided`) that `func` accepts, after refusing config keys it does not know.

    user_keys: the keys the config sets under `key`; provided: what the app passes besides them (cost,
    model, ...), each only to the constructors whose signature names it."""
    sig = _params(func)
    if sig is None:
        return dict(provided)
    named, var_kw = sig
    for name in _required(func):
        if name not in user_keys and name not in provided:
            raise ConfigError(f"{key}.{name}: missing; {target} needs it (set {key}.{name}=...)")
    if not var_kw:
        unknown = sorted(k for k in user_keys if k not in named and k not in _HYDRA_KEYS)
        if unknown:
            valid = sorted(named - set(provided))
            raise ConfigError(f"{key}.{unknown[0]}: unknown key for {target}"
                              + (f" (also unknown: {', '.join(unknown[1:])})" if unknown[1:] else "")
                              + f"; valid keys: {', '.join(valid) if valid else '(none)'}")
    return {k: v for k, v in provided.items() if var_kw or k in named}


def check_group_keys(key: str, node, valid) -> None:
    """A plain config mapping (no _target_), e.g. `decode`: refuse keys outside `valid`."""
    if node is None:
        return
    unknown = sorted(set(node) - set(valid))
    if unknown:
        raise ConfigError(f"{key}.{unknown[0]}: unknown key; valid keys: {', '.join(sorted(valid))}")


@functools.lru_cache(maxsize=4)
def top_level_keys(conf_dir: str, name: str = "config.yaml") -> frozenset:
    """The top-level keys a config composed from conf_dir/name may hold: its own keys and groups, and (for
    config.yaml) every key an experiment preset (`# @package _global_`) adds at the top level (policies, cell, ...)."""
    conf = Path(conf_dir)
    main = yaml.safe_load((conf / name).read_text()) or {}
    keys = {k for k in main if k != "defaults"} | {"hydra"}
    for d in main.get("defaults", []):
        if isinstance(d, dict):
            keys.update(str(k).split("@")[0].lstrip("/") for k in d)
    if name == "config.yaml":
        keys.add("experiment")
        for f in (conf / "experiment").glob("*.yaml"):
            body = yaml.safe_load(f.read_text()) or {}
            keys.update(str(k) for k in body if k != "defaults")
            for d in body.get("defaults") or []:   # presets placed at a package: /hardware@hws.h200
                for k in (d if isinstance(d, dict) else {}):
                    if "@" in str(k):
                        keys.add(str(k).split("@", 1)[1].split(".")[0])
    return frozenset(keys)


def check_top_level_keys(cfg, conf_dir: str, name: str = "config.yaml") -> None:
    """Refuse a top-level key no config file knows (`+sede=5`, a typo of `seed`), suggesting the nearest."""
    known = top_level_keys(conf_dir, name)
    unknown = sorted(str(k) for k in cfg if str(k) not in known)
    if unknown:
        near = difflib.get_close_matches(unknown[0], sorted(known), n=1)
        raise ConfigError(f"{unknown[0]}: unknown top-level key" + (f" (did you mean {near[0]}?)" if near else "")
                          + (f" (also unknown: {', '.join(unknown[1:])})" if unknown[1:] else "")
                          + f"; valid keys: {', '.join(sorted(known))}")


def one_line(text: str) -> str:
    """An exception's message on one line (Hydra's and transformers' messages span several)."""
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    return " ".join(lines) if lines else ""


# ---- policies ------------------------------------------------------------------------------------------
def check_policy(policy, engine_cfg) -> None:
    """A policy object the engine can run: a specdepth.Policy that implements plan and whose parameters ask
    for no more depth than engine.max_depth (a built-in policy would be capped silently: refused instead)."""
    from .policy import Policy

    name = type(policy).__name__
    if not isinstance(policy, Policy):
        raise PolicyError(f"policy {name}: not a specdepth.Policy subclass ({type(policy).__module__}.{name}); "
                          "a policy class must subclass specdepth.Policy")
    if type(policy).plan is Policy.plan:
        raise PolicyError(f"policy {name}: does not implement plan(view), the one required hook")
    bound = policy.depth_bound()
    if bound is None:
        return
    param, depth = bound
    cap = engine_cfg.max_depth
    if depth > cap:
        raise PolicyError(f"policy {policy.label}: policy.{param}={depth} asks for deeper drafts than "
                          f"engine.max_depth={cap} allows; set policy.{param}<={cap} or engine.max_depth>={depth}")


# ---- the batch that runs -------------------------------------------------------------------------------
def batch_limits(workload, engine_cfg, capacity=None, requests: int | None = None) -> tuple[str | None, int | None, str | None]:
    """(what caps the requested concurrency, the most sequences it lets run at once, a warning), or
    (None, None, None) when workload.batch_size can run at once. The cap is the tightest of
    engine.max_batch_size, engine.max_num_batched_tokens (one verify token per sequence at least) and the KV
    cache memory (`memory`: how many of the first requests fit beside the weights, capacity.Capacity.room).
    summary.json's batch_limited_by / batch_limit / max_running / mean_running then say what ran."""
    want = int(workload.batch_size)
    if requests is not None:
        want = min(want, int(requests))
    cap = min(engine_cfg.max_batch_size, engine_cfg.max_num_batched_tokens)
    by = ("engine.max_batch_size" if engine_cfg.max_batch_size <= engine_cfg.max_num_batched_tokens
          else "engine.max_num_batched_tokens")
    fit = want
    if capacity is not None and capacity.memory:
        none = np.zeros(0, np.int64)
        fit = capacity.room(none, none, 0, min(want, cap))
    if fit < min(want, cap):
        msg = (f"workload.batch_size={workload.batch_size}: at most {fit} sequences run at once: the KV cache "
               f"memory of model {capacity.name} holds {capacity.kv_tokens} tokens per GPU beside the weights and "
               f"each request reserves prompt + output + engine.max_depth tokens (raise hardware.memory_gb or "
               f"parallel.tensor, or shorten the requests; summary.json max_running / mean_running record the "
               f"batch that ran)")
        log_once(msg)
        return "memory", fit, msg
    if int(workload.batch_size) <= cap:
        return None, None, None
    msg = (f"workload.batch_size={int(workload.batch_size)} exceeds {by}={cap}: at most {cap} sequences run at once "
           f"(summary.json max_running / mean_running record the batch that ran)")
    log_once(msg)
    return by, cap, msg


# ---- local checkpoints -----------------------------------------------------------------------------------
def _is_checkpoint(path) -> bool:
    return isinstance(path, str) and bool(path) and (Path(path) / "config.json").is_file()


def checkpoint_kwargs(node: dict, preset: dict | None) -> dict:
    """Constructor overrides for a model preset whose target or draft was pointed at a local checkpoint:
    its architecture (and, for the target, the pair's name) come from the checkpoint's config.json, unless
    the config gives them explicitly (a value other than the preset's own)."""
    if not preset:
        return {}
    out = {}
    for role in ("target", "draft"):
        path = node.get(role)
        if path == preset.get(role) or not _is_checkpoint(path):
            continue
        if node.get(f"{role}_arch") == preset.get(f"{role}_arch"):
            out[f"{role}_arch"] = None
        if role == "target" and node.get("name") == preset.get("name"):
            out["name"] = None
    return out


# ---- a backend that loads models: what it would refuse after loading, checked before ------------------------
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt",
                    "spiece.model", "sentencepiece.bpe.model")


def _local(path) -> bool:
    """A model path the user meant as a local directory (not a hub id such as org/name)."""
    return isinstance(path, str) and path.startswith(("/", "./", "../", "~")) or Path(str(path)).exists()


def before_loading(cfg, backend_cls, policy, parallel, model) -> None:
    """Checks a backend that loads models (a wall clock: backend=hf, 5-11 s to load) would make only after
    loading, made first from its class and the config: local model directories that do not exist (each blamed
    on its own key: model.tokenizer defaults to model.target), a tokenizer directory without tokenizer files,
    a draft vocabulary larger than the target's (their config.json), an oracle policy on a lossless backend,
    tensor parallelism, and model.prompts' lines."""
    from omegaconf import OmegaConf

    from . import inputs
    from .errors import BackendError

    if backend_cls is None or getattr(backend_cls, "clock", "model") == "model":
        return
    name = getattr(backend_cls, "name", backend_cls.__name__)
    own_tokenizer = model.tokenizer not in (None, model.target)
    for key, path in (("target", model.target), ("draft", model.draft),
                      ("tokenizer", model.tokenizer if own_tokenizer else None)):
        if path and _local(path) and not Path(str(path)).expanduser().is_dir():
            raise ConfigError(f"model.{key}: no such directory: {path} (a local checkpoint directory, or a hub id "
                              f"such as org/name)")
    tok = Path(str(model.tokenizer or model.target)).expanduser()
    if getattr(model, "init", "pretrained") != "random" and _local(str(tok)) and tok.is_dir() and \
            not any((tok / f).is_file() for f in _TOKENIZER_FILES):
        key = "model.tokenizer" if own_tokenizer else "model.target"
        raise ConfigError(f"{key}: {tok} has no tokenizer files ({', '.join(_TOKENIZER_FILES[:3])}, ...): set "
                          f"model.tokenizer=<a directory or hub id holding the pair's tokenizer>")
    vocab = {}
    for role in ("target", "draft"):
        f = Path(str(getattr(model, role) or "")).expanduser() / "config.json"
        try:
            vocab[role] = int(json.loads(f.read_text())["vocab_size"]) if f.is_file() else None
        except (ValueError, KeyError, TypeError, OSError):
            vocab[role] = None
    if None not in vocab.values() and vocab["draft"] > vocab["target"]:
        raise BackendError(f"model.draft: its vocabulary has {vocab['draft']} rows, more than model.target's "
                           f"{vocab['target']} ({model.draft} vs {model.target}); the draft could propose tokens "
                           f"the target cannot score: use a draft with the target's vocabulary")
    node = cfg.get("backend")
    lossless = (node.get("acceptance", "model") if node is not None else "model") != "simulated"
    if lossless and (policy.requires_oracle or policy.requires_accept_prob or policy.requires_true_cost):
        raise ConfigError(f"policy {type(policy).__name__} is an oracle: it needs what only a simulated run "
                          f"knows (acceptance outcomes, their probabilities or the clock's true cost); backend "
                          f"{name!r} cannot provide them: use backend=sim")
    if parallel.tensor > 1:
        raise BackendError(f"parallel.tensor={parallel.tensor}: backend {name!r} runs on the devices it finds; "
                           "tensor parallelism is simulated only (backend=sim)")
    prompts = OmegaConf.select(cfg, "model.prompts", default=None)
    if prompts:
        for where, rec in inputs.records(prompts, "model.prompts", inputs.PROMPT_KEYS, "prompts"):
            inputs.prompt_record(where, rec)


# ---- what the cost model describes -------------------------------------------------------------------
def cost_label(cost, hardware) -> str:
    from .cost import ConstantCost, RooflineCost, TableCost

    if isinstance(cost, TableCost):
        return f"table({cost.path})"
    if isinstance(cost, RooflineCost):
        return f"roofline({cost.hardware.name})"
    if isinstance(cost, ConstantCost):
        return "constant"
    return type(cost).__name__


def machine_and_budget(executor, cost, hardware, engine_cfg) -> tuple[str | None, str]:
    """(hardware label, where the token budget comes from) for summary.json.

    Simulator: the hardware the cost model describes (a profile's device for cost=table). A wall-clock backend
    is labelled with the device it runs on; its automatic budget comes only from a profile (cost=table):
    another cost model describes no machine this run is on, so no budget applies and policies are offered
    engine.max_num_batched_tokens (stated in summary.json's token_budget_source and the log)."""
    from .cost import TableCost

    profile = isinstance(cost, TableCost)
    explicit = engine_cfg.token_budget != "auto"
    source = "engine.token_budget" if explicit else f"ridge of the cost model ({cost_label(cost, hardware)})"
    machine = executor.machine()
    if machine is None:   # simulated clock
        label = (cost.device or "profile") if profile else (hardware.name if hardware is not None else None)
        return label, source
    if profile and cost.device and cost.device.split(":")[0] != machine.split(":")[0].split(" ")[0]:
        log_once(f"cost.path {cost.path} was profiled on {cost.device}; this run is on {machine}")
    if not explicit and not profile:
        engine_cfg.token_budget = engine_cfg.max_num_batched_tokens
        source = (f"none: {cost_label(cost, hardware)} does not model this machine ({machine}); policies are "
                  f"offered engine.max_num_batched_tokens. Profile it (specdepth-profile) and use cost=table")
        log_once(f"backend={executor.name}: no token budget: {source}")
    return machine, source


def unused_decode(decode, executor) -> list[str]:
    """A warning when decode.* asks for sampling on the simulator, which decodes nothing (its accept/reject
    comes from the acceptance model): the run is the same as with greedy decoding."""
    if decode is None or getattr(executor, "clock", "wall") != "model":
        return []
    asked = [f"decode.{k}={decode.get(k)}" for k, plain in (("temperature", 0.0), ("top_p", 1.0))
             if decode.get(k) is not None and decode.get(k) != plain]
    if not asked:
        return []
    msg = (f"{', '.join(asked)}: backend={executor.name} decodes nothing (accept/reject come from the acceptance "
           f"model), so decode.* changes nothing here; it applies to backend=hf")
    log_once(msg)
    return [msg]


# ---- what ran, for summary.json ---------------------------------------------------------------------------
def what_ran(cfg, parts: dict) -> tuple[dict, list[str]]:
    """(summary.json fields that say what ran without config.yaml, warnings): the tensor-parallel degrees, the
    clock's cost model and profile (backend.clock_profile: the hardware label is then the profile's device),
    the acceptance model and its parameters (null on a lossless backend: the target decides), and what capped
    the batch (batch_limited_by: memory, engine.max_batch_size or engine.max_num_batched_tokens; batch_limit:
    the most sequences it let run at once; null when the requested batch could run)."""
    from omegaconf import OmegaConf

    executor, cost, par = parts["executor"], parts["cost"], parts["parallel"]
    clock = getattr(executor, "clock_cost", cost)
    profile = getattr(clock, "path", None) if clock is not cost else None
    node = cfg.get("acceptance")
    params = None
    if node is not None and not executor.lossless:
        params = {k: v for k, v in OmegaConf.to_container(node, resolve=True).items() if k != "_target_"}
    by, limit = parts["batch_limit"]
    fields = dict(tensor_parallel=par.tensor, draft_tensor_parallel=par.draft_tensor,
                  clock_profile=profile, clock_model=cost_label(clock, parts["hardware"]),
                  acceptance_model=type(parts["acceptance"]).__name__, acceptance_params=params,
                  batch_limited_by=by, batch_limit=limit)
    notes = []
    if profile is not None:
        fields["hardware"] = getattr(clock, "device", None) or "profile"
    if profile is not None and getattr(cost, "device", None) != fields["hardware"]:   # policies saw another machine
        notes.append(f"backend.clock_profile: every time of this run comes from {profile} (profiled on "
                     f"{fields['hardware']}); the policies saw cost {cost_label(cost, parts['hardware'])}")
        log_once(notes[-1])
    return fields, notes


_LOGGED: set = set()   # warnings printed by this command (log_once); app.main empties it


def log_once(msg: str) -> None:
    """log.warning(msg) the first time this command meets it: once per run, or per sweep (its jobs share a
    process); summary.json keeps it in every run it applies to."""
    if msg not in _LOGGED:
        _LOGGED.add(msg)
        log.warning("%s", msg)


def clear_logged() -> None:
    """A new command: every warning may be printed once again (log_once)."""
    _LOGGED.clear()
