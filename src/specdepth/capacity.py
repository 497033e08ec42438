"""Where a deployment's limits live: tensor parallelism (`parallel` config group), GPU memory and the
model's context window.

`Parallel` splits every forward of the target (and of the draft, `draft_tensor`) across a tensor-parallel
group: weights, KV heads and FLOPs divide by the degree, and each layer adds two ring all-reduces of the
activations. `Capacity` holds what must fit on each GPU: the weights of both models plus the KV cache of
every running request, reserved for its whole life (prompt + output + engine.max_depth draft slots), within
hardware.memory_gb x gpu_memory_utilization (vLLM's `gpu_memory_utilization`). It refuses a model pair that
does not fit and a request that never could, and tells the engine how many waiting requests fit now.
Memory sizes are binary, as GPU memory is sold and as vLLM reports it: 1 GB here = 2**30 bytes.
"""
from __future__ import annotations

import numpy as np

from . import _kernels as _k
from .errors import BackendError, ConfigError, as_float, as_int
from .models import ModelArch

GIB = float(1 << 30)


class Parallel:
    """The `parallel` group: tensor-parallel degrees and the memory fraction the engine may use."""

    def __init__(self, tensor: int = 1, draft_tensor: int | None = None, allreduce_latency_s: float = 6e-6,
                 gpu_memory_utilization: float = 0.9):
        self.tensor = as_int(tensor, "parallel.tensor", min=1, max=1024)
        self.draft_tensor = (self.tensor if draft_tensor is None
                             else as_int(draft_tensor, "parallel.draft_tensor", min=1, max=self.tensor))
        self.allreduce_latency_s = as_float(allreduce_latency_s, "parallel.allreduce_latency_s", min=0)
        self.gpu_memory_utilization = as_float(gpu_memory_utilization, "parallel.gpu_memory_utilization",
                                               min=0, max=1, min_open=True)

    def degree(self, which: str) -> int:
        return self.tensor if which == "target" else self.draft_tensor

    def check(self, arch: ModelArch, which: str, model: str) -> None:
        """vLLM's rules: the degree divides the attention heads, and divides (or is a multiple of) the KV heads."""
        tp, key = self.degree(which), "parallel.tensor" if which == "target" else "parallel.draft_tensor"
        if arch.heads % tp:
            raise ConfigError(f"{key}={tp} must divide the {which} model's attention heads ({arch.heads}, "
                              f"model {model})")
        if arch.kv_heads % tp and tp % arch.kv_heads:
            raise ConfigError(f"{key}={tp} must divide the {which} model's KV heads ({arch.kv_heads}, model "
                              f"{model}) or be a multiple of them")

    def check_backend(self, executor, cost) -> None:
        """Tensor parallelism is a simulated deployment: backend=sim, with a cost model that splits each forward
        over the group (one with a `parallel` attribute: the roofline)."""
        if self.tensor == 1:
            return
        if getattr(executor, "clock", "model") != "model":
            raise BackendError(f"parallel.tensor={self.tensor}: backend {executor.name!r} runs on the devices it "
                               "finds; tensor parallelism is simulated only (backend=sim)")
        if getattr(cost, "parallel", None) is None:   # a cost model that splits forwards over the group holds it
            raise ConfigError(f"parallel.tensor={self.tensor} is modelled by cost=roofline only "
                              f"(cost {type(cost).__name__} has no per-GPU split)")

    def comm_s(self, arch: ModelArch, which: str, link_gbs: float | None) -> tuple[float, float]:
        """(seconds per token, seconds per forward) of a forward's all-reduces: two per layer (after the
        attention output and the MLP down projection), ring: 2(tp - 1)/tp x bytes over the link plus a
        fixed latency per collective."""
        tp = self.degree(which)
        if tp == 1:
            return 0.0, 0.0
        if not link_gbs:
            raise ConfigError(f"hardware.interconnect_gbs is not set: parallel.tensor={self.tensor} needs the "
                              "GPU's interconnect bandwidth (GB/s per direction)")
        collectives = 2 * arch.layers
        per_token = 2.0 * (tp - 1) / tp * arch.hidden * arch.bytes_per_param / (link_gbs * 1e9)
        return collectives * per_token, collectives * self.allreduce_latency_s


def kv_bytes_per_gpu(arch: ModelArch, tp: int) -> int:
    """KV bytes per token on one GPU of a tp-way group: the KV heads split (replicated when tp > kv_heads)."""
    if tp == 1:
        return arch.kv_bytes_per_token
    return arch.layers * 2 * max(arch.kv_heads // tp, 1) * arch.hd * arch.bytes_per_param


class Capacity:
    """Context and memory limits of one run (built by the app from the model pair, hardware and parallel
    config; the engine asks it at admission). `memory=False` (a real backend, or hardware without
    memory_gb): the context window is still checked, admission is not limited."""

    def __init__(self, model, hardware, parallel: Parallel, max_depth: int, memory: bool = True):
        self.name = model.name
        self.target, self.draft = model.target_arch, model.draft_arch
        self.parallel, self.max_depth = parallel, int(max_depth)
        tp, dtp = parallel.tensor, parallel.draft_tensor
        self.kv_per_token = kv_bytes_per_gpu(self.target, tp) + (
            kv_bytes_per_gpu(self.draft, dtp) if self.draft is not None else 0)
        self.weights = self.target.resident_bytes / tp + (
            self.draft.resident_bytes / dtp if self.draft is not None else 0.0)
        self.memory = bool(memory) and hardware is not None and hardware.memory_gb is not None
        self.peak_tokens = 0
        self._cum = np.zeros(1, np.int64)
        if not self.memory:
            self.budget = self.free = float("inf")
            return
        self.budget = float(hardware.memory_gb) * GIB * parallel.gpu_memory_utilization
        self.free = self.budget - self.weights
        if self.free <= 0:
            raise ConfigError(
                f"model {self.name} does not fit: {self.weights / GIB:.1f} GB of weights per GPU (target / "
                f"parallel.tensor={tp}{'' if self.draft is None else f' + draft / parallel.draft_tensor={dtp}'}) "
                f"> {self.budget / GIB:.1f} GB = hardware.memory_gb {hardware.memory_gb:g} ({hardware.name}) x "
                f"parallel.gpu_memory_utilization {parallel.gpu_memory_utilization:g}; raise parallel.tensor")
        self.kv_tokens = int(self.free // self.kv_per_token)   # tokens of KV that fit beside the weights

    @property
    def max_context(self) -> int | None:
        limits = [a.max_context for a in (self.target, self.draft) if a is not None and a.max_context]
        return min(limits) if limits else None

    def check(self, requests) -> None:
        """Refuse requests longer than the context window or than the KV memory (engine order)."""
        need = np.fromiter((r.prompt_len + r.output_len for r in requests), np.int64, len(requests))
        self._cum = np.concatenate([[0], np.cumsum(need + self.max_depth)])
        self.peak_tokens = 0
        if not len(requests):
            return
        i = int(np.argmax(need))
        r, longest = requests[i], int(need[i]) + self.max_depth
        ctx = self.max_context
        if ctx is not None and longest > ctx:
            raise ConfigError(
                f"workload.prompt_len + workload.output_len + engine.max_depth = {r.prompt_len} + {r.output_len} + "
                f"{self.max_depth} = {longest} tokens (request {r.request_id}) exceed the context of model "
                f"{self.name} ({ctx} tokens, max_context)")
        if self.memory and longest > self.kv_tokens:
            raise ConfigError(
                f"workload.prompt_len + workload.output_len + engine.max_depth = {longest} tokens (request "
                f"{r.request_id}) can never fit: the KV cache of model {self.name} holds {self.kv_tokens} tokens "
                f"per GPU ({self.free / GIB:.1f} GB beside the weights); raise parallel.tensor or shorten it")

    def room(self, plen: np.ndarray, olen: np.ndarray, nxt: int, limit: int) -> int:
        """How many of the waiting requests nxt, nxt+1, ... fit (in order, at most `limit`) beside the
        running ones (their prompt and output lengths), each reserving prompt + output + max_depth tokens."""
        if not self.memory:
            return limit
        cum = self._cum
        top = cum[nxt] + self.kv_tokens - (_k.int_sum(plen) + _k.int_sum(olen) + plen.shape[0] * self.max_depth)
        last = min(nxt + limit, cum.shape[0] - 1)
        if cum[last] <= top:   # the common case: every candidate fits
            return last - nxt
        return max(0, min(int(np.searchsorted(cum, top, side="right")) - 1 - nxt, limit))

    def observe(self, plen: np.ndarray, gen: np.ndarray) -> None:
        """Record the KV the running requests hold (prompt + generated tokens); the engine calls it before
        retiring rows, when the total is at a local peak."""
        tokens = _k.int_sum(plen) + _k.int_sum(gen)
        if tokens > self.peak_tokens:
            self.peak_tokens = int(tokens)

    @property
    def peak_kv_gb(self) -> float:
        """The most KV cache (target + draft) one GPU held, in GB (2**30 bytes)."""
        return self.peak_tokens * self.kv_per_token / GIB
