"""`specdepth-profile`: measure target and draft forward times on this machine over a grid of
(batch size, query tokens per sequence, context length) and write a CSV that `cost=table` interpolates.

    specdepth-profile model=tiny_pair                      # the default grid (docs/real_backend.md)
    specdepth-profile model=tiny_pair grid.batch=[1,8] grid.query=[1,4] grid.context=[128] repeats=3
    specdepth-profile model=tiny_pair rounds=3                # median over 3 passes of the grid
    specdepth cost=table cost.path=<run dir>/profile.csv model=tiny_pair ...

Each point is one forward of the backend's own code path (`specdepth.hf_runner.Runner`: slot KV cache, explicit
4D mask and position ids) with `batch` rows each feeding `query` new tokens on top of `context` cached ones;
the cached keys are placeholders (their values do not change the cost), but the cache's buffers have the
length the executor's have at that context (`hf_runner.slots`: the buffer's length does change the cost).
The median of `repeats` timed forwards after `warmup` untimed ones is one measurement (CUDA: synchronized);
with `rounds` > 1 the whole grid (both models) is walked that many times and the median over rounds is
recorded, which spreads a slow spell of a shared machine over every point instead of biasing the points
measured during it. Points whose context + query exceed the model's max_position_embeddings are skipped.
"""
from __future__ import annotations

import csv
import io
import logging
import statistics
import sys
import time
from pathlib import Path

import hydra
import numpy as np
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from .app import CONF_DIR, _debug, _discard_run_dir, make_model
from .checks import check_top_level_keys
from .errors import ConfigError, SpecdepthError, as_int
from .results import atomic_write
from .versions import require_hf

log = logging.getLogger("specdepth.profile")
# `arch` (ModelArch.signature of the row's model) lets cost=table refuse a profile made for another model;
# readers that predate it ignore the extra column
COLUMNS = ("model", "batch", "query", "context", "seconds", "device", "dtype", "name", "arch", "model_seconds",
           "spread", "warmup", "repeats", "static_shapes")


def _ints(values, key):
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise ConfigError(f"{key} must be a list of integers, got {values!r}")
    try:
        out = sorted({as_int(v, key, min=0) for v in values})
    except TypeError:
        raise ConfigError(f"{key} must be a list of integers, got {values!r}") from None
    if not out:
        raise ConfigError(f"{key} is empty")
    return out


def _load(cfg, pair, which, torch) -> list[tuple]:
    """[(target|draft, the loaded model)] for the entries of `models`, on model.device, in model.dtype."""
    from transformers import AutoModelForCausalLM

    if pair.dtype not in ("float32", "float16", "bfloat16"):
        raise ConfigError(f"model.dtype: profiling supports float32/float16/bfloat16, got {pair.dtype!r}")
    dev = pair.device if pair.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, pair.dtype)
    loaded = []
    for w in which:
        if w not in ("target", "draft"):
            raise ConfigError(f"models: entries must be target or draft, got {w!r}")
        path = pair.target if w == "target" else pair.draft
        if not path:
            log.warning("model.%s is not set: skipped", w)
            continue
        kw = dict(dtype=dtype, attn_implementation=cfg.get("attn_implementation", "sdpa"))
        if pair.init == "random":   # the timing of random weights is the timing of trained ones
            from .hf_runner import random_causal_lm
            loaded.append((w, random_causal_lm(path, f"model.{w}", dtype, kw["attn_implementation"],
                                               torch.device(dev), int(w == "draft"))))
            continue
        if w == "target" and pair.device_map is not None:
            kw["device_map"] = pair.device_map
        try:
            model = AutoModelForCausalLM.from_pretrained(str(path), **kw)
        except Exception as e:
            raise ConfigError(f"model.{w}: cannot load {path!r}: {type(e).__name__}: {str(e).splitlines()[0]}") from None
        if "device_map" not in kw:
            model = model.to(dev)
        loaded.append((w, model.eval()))
    return loaded


def _time_point(runner, toks, lens, q: int, warmup: int, repeats: int, device, before=None) -> tuple:
    """One point: (median seconds of one batched forward, synchronized wall clock; median model seconds (CUDA
    events on a GPU, the same wall clock on a CPU); relative spread (max - min) / median of the wall times),
    after `warmup` untimed forwards of the same shape. `before()`, untimed, precedes every one of them
    (interleave: the forwards the executor runs before this one)."""
    import torch
    b = toks.shape[0]
    cuda = device.type == "cuda"
    walls, models = [], []
    with torch.inference_mode():
        for r in range(warmup + repeats):
            if before is not None:
                before()
            if cuda:
                torch.cuda.synchronize(device)
                runner.collect()
                runner.forward_s = 0.0
            t0 = time.perf_counter()
            runner.forward(slice(0, b), toks, lens, None, "all" if q > 1 else "last")
            if cuda:
                torch.cuda.synchronize(device)
            wall = time.perf_counter() - t0
            if cuda:
                runner.forward_s = 0.0
                runner.collect()
            if r >= warmup:
                walls.append(wall)
                models.append(runner.forward_s if cuda else wall)
    med = statistics.median(walls)
    return med, statistics.median(models), (max(walls) - min(walls)) / med if med > 0 else 0.0


def _walk(loaded, grid, rnd: int, rounds: int, warmup: int, repeats: int, times: dict,
          interleave: bool = False, static: str = "off") -> None:
    """One round: every (model, batch, query, context) point of the grid once. interleave (with both models):
    each draft point is timed right after an untimed target forward (one token per row, same batch and
    context), as the executor runs a
    step's first draft forward (after the verify) and the draft's prefill (after the target's); and the
    draft_next points (query 1) right after a target forward and an untimed draft forward, as the executor
    runs the draft's later positions. On a CPU a small model's forward after a large one's is much slower
    (its weights and the interpreter's working set left the caches) than the same forward back to back."""
    batches, queries, contexts = grid
    models = dict(loaded)
    interleave = interleave and "target" in models and "draft" in models
    for w, model in loaded:
        limit = int(getattr(model.config, "max_position_embeddings", 0) or 1 << 30)
        device = model.get_input_embeddings().weight.device
        vocab = int(model.get_input_embeddings().weight.shape[0])
        rng = np.random.default_rng(rnd)
        pre = interleave and w == "draft"
        for b in batches:
            width = max(contexts) + max(queries) + 1
            runner = _runner(model, b, width, max(queries), static, device)
            trunner = _runner(models["target"], b, width, max(queries), static, device) if pre else None

            def point(name, q, c, before):
                sec = _time_point(runner, rng.integers(0, vocab, (b, q)), np.full(b, c, np.int64), q, warmup,
                                  repeats, device, before)
                times.setdefault((name, b, q, c, str(device)), []).append(sec)
                log.info("round %d/%d %s batch=%d query=%d context=%d: %.3f ms (model %.3f ms, spread %.1f%%)",
                         rnd + 1, rounds, name, b, q, c, sec[0] * 1e3, sec[1] * 1e3, sec[2] * 100)

            for c in contexts:
                for q in queries:
                    if c + q > limit:
                        continue
                    before = None
                    if pre:   # one target token per row: the forward streams all the target's weights
                        tt, tl = rng.integers(0, vocab, (b, 1)), np.full(b, c, np.int64)
                        before = (lambda tt=tt, tl=tl: trunner.forward(slice(0, b), tt, tl, None, "last"))
                    point(w, q, c, before)
                if pre and c + 1 <= limit:
                    t1, l1 = rng.integers(0, vocab, (b, 1)), np.full(b, c, np.int64)

                    def before_next(t1=t1, l1=l1):
                        trunner.forward(slice(0, b), t1, l1, None, "last")
                        runner.forward(slice(0, b), t1, l1, None, "last")
                    point("draft_next", 1, c, before_next)
            runner = trunner = None   # free the caches before the next batch's


def _runner(model, rows: int, width: int, max_query: int, static: str, device):
    """The executor's forward path for this point: the dynamic Runner, or the static one (backend.static_shapes;
    queries up to the grid's longest decode query run static, longer ones eagerly, as in the executor)."""
    from .hf_runner import Runner
    from .hf_static import StaticRunner, resolve_mode
    mode = resolve_mode(static, device.type)
    if mode == "off":
        return Runner(model, rows, width)
    graphs = None if mode == "eager" else ("cuda" if device.type == "cuda" else "standin")
    return StaticRunner(model, rows, width, min(max_query, 17), graphs)


def measure(loaded, grid, warmup: int = 2, repeats: int = 5, rounds: int = 1, dtype: str = "", name: str = "",
            arch: dict | None = None, interleave: bool = False, static: str = "off") -> list[tuple]:
    """Rows of profile.csv (COLUMNS) for [(target|draft, model)] over grid = (batches, queries, contexts);
    arch: {target|draft: ModelArch.signature} for the `arch` column. Every round walks the whole grid (both
    models); a point's figure is the median over rounds of each round's median, so a slow minute of the
    machine moves one round of every point, not a block of points. interleave: draft points timed as the
    executor runs them (after a target forward), plus draft_next rows (_walk)."""
    times: dict[tuple, list[tuple]] = {}
    for rnd in range(rounds):
        _walk(loaded, grid, rnd, rounds, warmup, repeats, times, interleave, static)
    arch = dict(arch or {})
    if "draft" in arch:
        arch.setdefault("draft_next", arch["draft"])
    out = []
    for (w, b, q, c, device), v in times.items():
        walls = [x[0] for x in v]
        spread = max(x[2] for x in v) if len(v) == 1 else (max(walls) - min(walls)) / statistics.median(walls)
        out.append((w, b, q, c, statistics.median(walls), device, dtype, name, arch.get(w, ""),
                    statistics.median(x[1] for x in v), round(spread, 6), warmup, repeats * rounds, static))
    return out


def write_profile(rows, out_path) -> None:
    """profile.csv (the format cost=table reads), atomically."""
    buf = io.StringIO()
    wr = csv.writer(buf, lineterminator="\n")
    wr.writerow(COLUMNS)
    for r in rows:
        wr.writerow([repr(v) if isinstance(v, float) else v for v in r])
    atomic_write(Path(out_path), buf.getvalue())


def profile(cfg: DictConfig, out_path: str | Path) -> list[tuple]:
    require_hf("specdepth-profile")
    import torch
    pair = make_model(cfg)
    grid = cfg.get("grid") or {}
    batches = _ints(grid.get("batch", [1]), "grid.batch")
    queries = _ints(grid.get("query", [1]), "grid.query")
    contexts = _ints(grid.get("context", [0]), "grid.context")
    if batches[0] < 1 or queries[0] < 1:
        raise ConfigError("grid.batch and grid.query must be >= 1")
    repeats = as_int(cfg.get("repeats", 5), "repeats", min=1)
    warmup = as_int(cfg.get("warmup", 2), "warmup", min=0)
    rounds = as_int(cfg.get("rounds", 1), "rounds", min=1)
    if cfg.get("num_threads") is not None:
        torch.set_num_threads(as_int(cfg.num_threads, "num_threads", min=1))
    loaded = _load(cfg, pair, list(cfg.get("models", ["target", "draft"])), torch)
    t_all = time.perf_counter()
    arch = {"target": pair.target_arch.signature, "draft": (pair.draft_arch or pair.target_arch).signature}
    rows = measure(loaded, (batches, queries, contexts), warmup, repeats, rounds, pair.dtype, pair.name, arch,
                   bool(cfg.get("interleave", False)), str(cfg.get("static_shapes", "auto")))
    write_profile(rows, out_path)
    log.info("profiled %d points in %.1f s -> %s", len(rows), time.perf_counter() - t_all, out_path)
    return rows


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="profile")
def _task(cfg: DictConfig):
    out = Path(str(cfg.get("output", "profile.csv")))
    if not out.is_absolute():
        out = Path(HydraConfig.get().runtime.output_dir) / out
    try:
        check_top_level_keys(cfg, CONF_DIR, "profile.yaml")
        rows = profile(cfg, out)
    except SpecdepthError as e:
        if _debug():
            raise
        print(f"specdepth-profile: error: {e}", file=sys.stderr, flush=True)
        _discard_run_dir(HydraConfig.get().runtime.output_dir)
        raise SystemExit(2) from None
    print(f"{len(rows)} points -> {out}", flush=True)


def main():
    """`specdepth-profile`: a bad key, value or file is one line on stderr (exit code 2) unless
    HYDRA_FULL_ERROR=1 / SPECDEPTH_DEBUG=1 asks for the traceback."""
    import os

    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from .app import _input_error
    debug, saved = _debug(), os.environ.get("HYDRA_FULL_ERROR")
    os.environ["_SPECDEPTH_FULL_ERROR"] = "1" if debug else ""   # the user's choice (_debug), kept
    os.environ["HYDRA_FULL_ERROR"] = "1"   # Hydra re-raises; the errors are reported here
    try:
        _task()
    except (HydraException, OmegaConfBaseException, SpecdepthError) as e:
        if debug:
            raise
        print(f"specdepth-profile: error: {_input_error(e)}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    finally:
        os.environ.pop("_SPECDEPTH_FULL_ERROR", None)
        if saved is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = saved


if __name__ == "__main__":
    main()
