"""Workloads: the requests a run serves (arrival time, prompt length, output length, optional token ids)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

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


def lengths(spec, key: str, n: int, rng: np.random.Generator, min_value: int = 1) -> np.ndarray:
    """Draw n lengths from `spec`: an int, or {dist: fixed|uniform|lognormal, ...}."""
    if isinstance(spec, (int, float)) and not isinstance(spec, bool):
        return np.full(n, as_int(spec, key, min=min_value), dtype=np.int64)
    try:
        spec = dict(spec)
    except (TypeError, ValueError):
        raise ConfigError(f"{key} must be an integer or a mapping with 'dist', got {spec!r}") from None
    dist = as_choice(spec.get("dist"), f"{key}.dist", {"fixed", "uniform", "lognormal"})
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

    def __init__(self, path: str, max_concurrency: int | None = None):
        self.path = Path(str(path))
        if not self.path.is_file():
            raise ConfigError(f"workload.path: file not found: {self.path}")
        self._reqs = []
        with self.path.open() as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                where = f"{self.path}:{lineno}"
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ConfigError(f"{where}: invalid JSON ({e})") from None
                if not isinstance(rec, dict):
                    raise ConfigError(f"{where}: expected an object, got {rec!r}")
                ids = rec.get("prompt_ids")
                plen = len(ids) if ids is not None else as_int(rec.get("prompt_len"), f"{where}: prompt_len", min=1)
                if plen < 1:
                    raise ConfigError(f"{where}: empty prompt")
                self._reqs.append(Request(len(self._reqs), as_float(rec.get("arrival_s", 0.0), f"{where}: arrival_s", min=0),
                                          plen, as_int(rec.get("output_len"), f"{where}: output_len", min=1),
                                          prompt_ids=list(ids) if ids is not None else None))
        if not self._reqs:
            raise ConfigError(f"workload.path: {self.path} holds no requests")
        self._reqs.sort(key=lambda r: r.arrival_s)
        self.batch_size = (as_int(max_concurrency, "workload.max_concurrency", min=1)
                           if max_concurrency is not None else len(self._reqs))

    def requests(self, rng):
        return [Request(r.request_id, r.arrival_s, r.prompt_len, r.output_len,
                        list(r.prompt_ids) if r.prompt_ids else None) for r in self._reqs]
