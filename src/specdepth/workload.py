"""Workloads: the requests a run serves (arrival time, prompt length, output length, optional token ids)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import inputs
from .errors import ConfigError, as_choice, as_float, as_int


@dataclass
class Request:
    request_id: int
    arrival_s: float
    prompt_len: int
    output_len: int
    prompt_ids: list[int] | None = None
    text: str | None = None
    meta: dict = field(default_factory=dict)


_DIST_KEYS = {"fixed": ("value",), "uniform": ("low", "high"), "lognormal": ("mean", "sigma", "max")}


def lengths(spec, key: str, n: int, rng: np.random.Generator, min_value: int = 1) -> np.ndarray:
    """Draw n lengths from `spec`: an int, or {dist: fixed|uniform|lognormal, ...}."""
    if isinstance(spec, (int, float)) and not isinstance(spec, bool):
        return np.full(n, as_int(spec, key, min=min_value), dtype=np.int64)
    try:
        spec = dict(spec)
    except (TypeError, ValueError):
        raise ConfigError(f"{key} must be an integer or a mapping with 'dist', got {spec!r}") from None
    dist = as_choice(spec.get("dist"), f"{key}.dist", set(_DIST_KEYS))
    unknown = sorted(set(spec) - {"dist", *_DIST_KEYS[dist]})
    if unknown:
        raise ConfigError(f"{key}.{unknown[0]}: unknown key for dist={dist}; valid keys: "
                          f"{', '.join(['dist', *_DIST_KEYS[dist]])}")
    if dist == "fixed":
        return np.full(n, as_int(spec.get("value"), f"{key}.value", min=min_value), dtype=np.int64)
    if dist == "uniform":
        lo = as_int(spec.get("low"), f"{key}.low", min=min_value)
        hi = as_int(spec.get("high"), f"{key}.high", min=lo)
        return rng.integers(lo, hi + 1, n)
    mean = as_float(spec.get("mean"), f"{key}.mean", min=1)
    sigma = as_float(spec.get("sigma", 0.5), f"{key}.sigma", min=0)
    hi = as_int(spec.get("max", 1 << 20), f"{key}.max", min=min_value)
    mu = np.log(mean) - sigma * sigma / 2
    return np.clip(np.rint(rng.lognormal(mu, sigma, n)), min_value, hi).astype(np.int64)


class Workload:
    """Base class. `requests(rng)` returns every request of the run, sorted by arrival."""

    #: the concurrency reported as `batch_size` in summary.json
    batch_size: int

    def requests(self, rng: np.random.Generator) -> list[Request]:
        raise NotImplementedError


class Closed(Workload):
    """`batch_size` requests all at t=0 (a closed batch: the classic decode benchmark)."""

    def __init__(self, batch_size: int = 8, prompt_len=256, output_len=128):
        self.batch_size = as_int(batch_size, "workload.batch_size", min=1)
        self.prompt_len = prompt_len
        self.output_len = output_len
        lengths(prompt_len, "workload.prompt_len", 1, np.random.default_rng(0))
        lengths(output_len, "workload.output_len", 1, np.random.default_rng(0))

    def requests(self, rng):
        p = lengths(self.prompt_len, "workload.prompt_len", self.batch_size, rng)
        o = lengths(self.output_len, "workload.output_len", self.batch_size, rng)
        return [Request(i, 0.0, int(p[i]), int(o[i])) for i in range(self.batch_size)]


class Poisson(Workload):
    """`num_requests` requests arriving as a Poisson process of `rate` requests per second."""

    def __init__(self, rate: float = 10.0, num_requests: int = 64, prompt_len=256, output_len=128,
                 max_concurrency: int | None = None):
        self.rate = as_float(rate, "workload.rate", min=0, min_open=True)
        self.num_requests = as_int(num_requests, "workload.num_requests", min=1)
        self.prompt_len = prompt_len
        self.output_len = output_len
        self.batch_size = (as_int(max_concurrency, "workload.max_concurrency", min=1)
                           if max_concurrency is not None else self.num_requests)
        lengths(prompt_len, "workload.prompt_len", 1, np.random.default_rng(0))
        lengths(output_len, "workload.output_len", 1, np.random.default_rng(0))

    def requests(self, rng):
        arrivals = np.cumsum(rng.exponential(1.0 / self.rate, self.num_requests))
        arrivals -= arrivals[0]
        p = lengths(self.prompt_len, "workload.prompt_len", self.num_requests, rng)
        o = lengths(self.output_len, "workload.output_len", self.num_requests, rng)
        return [Request(i, float(arrivals[i]), int(p[i]), int(o[i])) for i in range(self.num_requests)]


class File(Workload):
    """Requests from a JSONL file: one object per line with `prompt_len` (or `prompt_ids`), `output_len`,
    and optionally `arrival_s` (default 0)."""

    KEYS = ("prompt_len", "prompt_ids", "output_len", "arrival_s")

    def __init__(self, path: str, max_concurrency: int | None = None):
        self.path = Path(str(path))
        self._reqs = []
        for where, rec in inputs.records(self.path, "workload.path", self.KEYS, "workload"):
            ids = rec.get("prompt_ids")
            if ids is not None:
                ids = inputs.token_ids(ids, where)
                if rec.get("prompt_len") is not None and as_int(rec["prompt_len"], f"{where}: prompt_len") != len(ids):
                    raise ConfigError(f"{where}: prompt_len ({rec['prompt_len']}) differs from the length of "
                                      f"prompt_ids ({len(ids)}); give one of them")
            plen = len(ids) if ids is not None else as_int(rec.get("prompt_len"), f"{where}: prompt_len", min=1)
            self._reqs.append(Request(len(self._reqs), as_float(rec.get("arrival_s", 0.0), f"{where}: arrival_s", min=0),
                                      plen, as_int(rec.get("output_len"), f"{where}: output_len", min=1),
                                      prompt_ids=ids))
        if not self._reqs:
            raise ConfigError(f"workload.path: {self.path} holds no requests")
        self._reqs.sort(key=lambda r: r.arrival_s)
        self.batch_size = (as_int(max_concurrency, "workload.max_concurrency", min=1)
                           if max_concurrency is not None else len(self._reqs))

    def requests(self, rng):
        return [Request(r.request_id, r.arrival_s, r.prompt_len, r.output_len,
                        list(r.prompt_ids) if r.prompt_ids else None) for r in self._reqs]


_DATA_BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet", ".txt": "text"}


class Dataset(Workload):
    """Prompts from a dataset, loaded with the `datasets` library: a local JSON/JSONL/CSV/parquet/text file
    (or a directory `datasets` can read), or a hub name (needs the network or the local HF cache).

    `num_requests` prompts (null = every row; more than the rows cycles through them), each generating
    `output_len` tokens (an int or a length distribution). Arrivals: all at t=0 (`rate: null`), or a Poisson
    process of `rate` requests/s. backend=hf tokenizes each prompt; the simulator, which has no tokenizer,
    counts len(text) / chars_per_token tokens.
    """

    def __init__(self, path: str, text_field: str = "text", split: str = "train", num_requests: int | None = None,
                 output_len=128, name: str | None = None, rate: float | None = None,
                 max_concurrency: int | None = None, chars_per_token: float = 4.0):
        if not path:
            raise ConfigError("workload.path: give a local file (json, jsonl, csv, parquet, txt) or a hub dataset name")
        self.path, self.text_field, self.split = str(path), str(text_field), str(split)
        self.output_len = output_len
        lengths(output_len, "workload.output_len", 1, np.random.default_rng(0))
        self.rate = None if rate is None else as_float(rate, "workload.rate", min=0, min_open=True)
        self.chars_per_token = as_float(chars_per_token, "workload.chars_per_token", min=0, min_open=True)
        texts = self._load(name)
        if not texts:
            raise ConfigError(f"workload.path: {self.path} (split {self.split!r}) holds no rows")
        for i, t in enumerate(texts):
            if t is None:
                raise ConfigError(f"workload.text_field: row {i} of {self.path} has no {self.text_field!r}; every "
                                  f"row needs the prompt text there")
            if not isinstance(t, str):
                raise ConfigError(f"workload.text_field: row {i} of {self.path} has a non-text "
                                  f"{self.text_field!r} ({type(t).__name__})")
            if not t.strip():
                raise ConfigError(f"workload.path: row {i} of {self.path} has an empty prompt "
                                  f"({self.text_field!r} is empty)")
        self.num_requests = (len(texts) if num_requests is None
                             else as_int(num_requests, "workload.num_requests", min=1))
        self.texts = texts
        self.batch_size = (as_int(max_concurrency, "workload.max_concurrency", min=1)
                           if max_concurrency is not None else self.num_requests)

    def _load(self, name):
        try:
            import datasets
        except ImportError:
            raise ConfigError("workload=dataset needs the `datasets` package: pip install 'specdepth[hf]'") from None
        p = Path(self.path)
        try:
            if p.is_file():
                if p.stat().st_size < 4096 and not p.read_bytes().strip():   # nothing but blanks
                    raise ConfigError(f"workload.path: {p} is empty (no rows)")
                builder = _DATA_BUILDERS.get(p.suffix.lower())
                if builder is None:
                    raise ConfigError(f"workload.path: {p}: unknown file type {p.suffix!r}; "
                                      f"use one of {sorted(_DATA_BUILDERS)}")
                ds = datasets.load_dataset(builder, data_files=str(p), split=self.split)
            else:
                ds = datasets.load_dataset(self.path, name, split=self.split)
        except ConfigError:
            raise
        except Exception as e:
            where = "file" if p.exists() else "hub dataset (offline? not in the local cache?)"
            raise ConfigError(f"workload.path: cannot load {self.path!r} as a {where} with split {self.split!r}: "
                              f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
        if self.text_field not in ds.column_names:
            raise ConfigError(f"workload.text_field: {self.path} has no column {self.text_field!r}; "
                              f"columns: {ds.column_names}")
        return list(ds[self.text_field])

    def requests(self, rng):
        n = self.num_requests
        o = lengths(self.output_len, "workload.output_len", n, rng)
        if self.rate is None:
            arrivals = np.zeros(n)
        else:
            arrivals = np.cumsum(rng.exponential(1.0 / self.rate, n))
            arrivals -= arrivals[0]
        out = []
        for i in range(n):
            text = self.texts[i % len(self.texts)]
            est = max(1, int(round(len(text) / self.chars_per_token)))
            out.append(Request(i, float(arrivals[i]), est, int(o[i]), text=text))
        return out


# ---- token ids for a real backend -------------------------------------------------------------------------
def prompt_pool(path, tokenizer) -> list[list[int]]:
    """model.prompts: a JSONL file of prompts (one of "text", "prompt" or "prompt_ids" per line),
    tokenized; synthesized prompts are cut from these."""
    pool = []
    for where, rec in inputs.records(path, "model.prompts", inputs.PROMPT_KEYS, "prompts"):
        ids = inputs.prompt_record(where, rec)
        ids = tokenizer(ids)["input_ids"] if isinstance(ids, str) else ids
        if ids:
            pool.append(ids)
    if not pool:
        raise ConfigError(f"model.prompts: {path} holds no prompts")
    return pool


def with_prompt_ids(requests: list[Request], tokenizer, vocab: int, seed: int, pool_path=None) -> list[Request]:
    """New requests carrying token ids (the given ones are not modified): their prompt_ids (checked
    against the vocabulary), their text tokenized, or prompt_len tokens synthesized: cut from the
    model.prompts pool (`pool_path`) when there is one, else random non-special tokens (seeded)."""
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0x9F3]))
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    pool = None
    out = []
    for r in requests:
        where = f"request {r.request_id}"
        if r.prompt_ids is not None:
            ids = [int(x) for x in r.prompt_ids]
            if any(x < 0 or x >= vocab for x in ids):
                raise ConfigError(f"{where}: prompt_ids hold a token id outside the vocabulary [0, {vocab})")
        elif r.text is not None:
            ids = tokenizer(r.text)["input_ids"]
        elif r.prompt_len >= 1:
            if pool is None:
                pool = prompt_pool(pool_path, tokenizer) if pool_path else False
            ids = _synthesize(r, pool, rng, vocab, special)
        else:
            ids = []
        if not ids:
            raise ConfigError(f"{where}: empty prompt (no tokens to condition on)")
        out.append(dataclasses.replace(r, prompt_ids=ids, prompt_len=len(ids)))
    return out


def _synthesize(r: Request, pool, rng, vocab: int, special: set) -> list[int]:
    if pool:
        ids, j = [], r.request_id
        while len(ids) < r.prompt_len:
            ids.extend(pool[j % len(pool)])
            j += 1
        return ids[:r.prompt_len]
    allowed = np.setdiff1d(np.arange(vocab), np.fromiter(special, np.int64, len(special)))
    return rng.choice(allowed if allowed.size else np.arange(vocab), r.prompt_len).tolist()
