"""The static-shape forward path of the real backend (`backend.static_shapes`): every decode-shaped forward of
a run runs the same kernels on the same addresses, so that on CUDA each shape is captured once as a CUDA graph
and replayed (the regime serving engines measure: no per-kernel Python launch cost).

* The KV slots are preallocated once per run: `rows` rows padded up to the largest row bucket, `length` slots
  each (the longest sequence + padded queries + a scratch region), checked against the device's free memory.
* A forward over m rows runs over the row bucket B >= m (1, 2, 4, 8, ... up to the run's rows) and a query
  length Q of 1 .. `max_query` (the engine's max_depth + 1). Rows the caller did not ask for (a draft
  position that only some rows reach, the bucket's padding rows) run a dummy query whose keys go to the
  scratch slots at the end of their row: never read by a real query, overwritten freely.
* Inputs go through fixed device buffers (ids, each row's cached length, each row's last valid query),
  written in place before each forward; positions and the causal mask over all `length` slots are computed
  from them inside the forward. Attention therefore always spans the whole buffer (masked), as gpt-fast's
  static cache does.
* With graphs on, each (bucket, query length, output) forward is warmed up, captured once and replayed; the
  warm-up and capture of every shape are recorded (`StaticRunner.shapes`). On CPU `GraphStandIn` stands in
  for `torch.cuda.CUDAGraph`: it replays the captured callable eagerly over the same buffers and checks that
  they did not move, so the capture/replay code runs (and is tested) on a machine without a GPU.
* Draft-tree forwards (`forward_tree`: the target's verify of root + nodes, the draft's level forwards) pad
  their queries and their tree region to node buckets (tree.node_bucket over 1, 2, 4, ...) and run one
  graph per (row bucket, query bucket, region bucket), reading fixed buffers of ids, positions, slots,
  region starts and ancestor masks. The node buckets start empty and grow to the widest tree seen
  (`reserve_tree`: the slots per row grow with them, the KV kept; captured graphs are dropped and
  recaptured).
* Prefills (variable prompt lengths) and catch-up queries longer than `max_query` run the eager path of
  `Runner` over the same preallocated cache.
"""
from __future__ import annotations

import logging
import time

import numpy as np

from .errors import BackendError, ConfigError
from .hf_runner import Runner, _torch, tree_inputs, tree_mask
from .tree import node_bucket

log = logging.getLogger("specdepth.hf")
MODES = ("auto", "off", "eager", "graphs")


def resolve_mode(mode, device_type: str) -> str:
    """`backend.static_shapes` for a device: auto -> graphs on CUDA, off elsewhere; graphs on a CPU runs the
    stand-in (`GraphStandIn`)."""
    m = str(mode).lower() if mode is not None else "auto"
    if m in ("true", "on"):
        m = "graphs" if device_type == "cuda" else "eager"
    if m == "false":
        m = "off"
    if m not in MODES:
        raise ConfigError(f"backend.static_shapes must be one of {list(MODES)}, got {mode!r}")
    if m == "auto":
        m = "graphs" if device_type == "cuda" else "off"
    return m


def row_bucket(m: int, max_rows: int) -> int:
    """The smallest power of two >= m, capped at the run's row capacity (itself a bucket or the cap)."""
    b = 1 << max(int(m) - 1, 0).bit_length()
    return min(b, max_rows)


class GraphStandIn:
    """`torch.cuda.CUDAGraph`'s protocol on any device: `capture(fn)` runs fn once and keeps its output
    tensor(s); `replay()` runs fn again and copies the result into the kept output, as a graph replay writes
    its outputs in place. Checks that the buffers fn reads stay at their captured addresses (a graph would
    silently read stale memory otherwise)."""

    def __init__(self, buffers):
        self.buffers = list(buffers)
        self.fn = self.out = self._ptrs = None
        self.replays = 0

    def capture(self, fn):
        self.fn = fn
        self._ptrs = [b.data_ptr() for b in self.buffers]
        self.out = fn()
        return self.out

    def replay(self):
        if [b.data_ptr() for b in self.buffers] != self._ptrs:
            raise BackendError("internal: a static buffer moved after its forward was captured")
        out = self.fn()
        if self.out is not None:
            self.out.copy_(out)
        self.replays += 1


class CudaGraph:
    """One captured CUDA graph (shared memory pool across the run's graphs, as vLLM does)."""

    def __init__(self, torch, pool, warmup: int = 2):
        self.torch, self.pool, self.warmup = torch, pool, warmup
        self.g = torch.cuda.CUDAGraph()
        self.out = None
        self.replays = 0

    def capture(self, fn):
        torch = self.torch
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(self.warmup):   # allocator and kernel selection settle before capture
                fn()
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(self.g, pool=self.pool):
            self.out = fn()
        return self.out

    def replay(self):
        self.g.replay()
        self.replays += 1


class _Eager:
    """The output of one eager forward, where a capture failed."""

    def __init__(self, out):
        self.out = out


class StaticRunner(Runner):
    """A `Runner` whose decode-shaped forwards (query <= max_query) run over fixed buffers and row buckets,
    captured as graphs when `graphs` is set ("cuda" or "standin"); other forwards run the eager path over
    the same preallocated cache. Same `forward` contract as `Runner`."""

    def __init__(self, model, max_rows: int, max_len: int, max_query: int, graphs: str | None = None,
                 warmup: int = 2):
        super().__init__(model, max_rows, max_len)
        torch = self.torch
        self.max_query = int(max_query)
        self.rows_cap = row_bucket(max_rows, 1 << 30)            # the largest bucket: a power of two
        self.max_len = int(max_len)
        self.tree_q = 0                      # the largest node bucket tree forwards may use (grown on demand)
        self._size()
        self.cache.max_rows, self.cache.max_len = self.rows_cap, self.length
        self.cache.cap_rows, self.cache.cap_len = self.rows_cap, self.length   # allocated at the first update
        self._check_memory()
        dev = self.device
        B, Q = self.rows_cap, self.max_query
        self.ids = torch.zeros((B, Q), dtype=torch.long, device=dev)
        self.lens = torch.full((B,), self.scratch, dtype=torch.long, device=dev)
        self.last = torch.zeros((B,), dtype=torch.long, device=dev)
        pin = self.cuda
        self.h_ids = torch.zeros((B, Q), dtype=torch.long, pin_memory=pin)
        self.h_lens = torch.full((B,), self.scratch, dtype=torch.long, pin_memory=pin)
        self.h_last = torch.zeros((B,), dtype=torch.long, pin_memory=pin)
        self.slot_ar = torch.arange(self.length, device=dev)
        self.graphs_kind = graphs
        self.warmup = int(warmup)
        self._pool = torch.cuda.graph_pool_handle() if graphs == "cuda" else None
        self._graphs: dict = {}
        self.shapes: list[dict] = []       # per captured shape: bucket, query, want, warm-up + capture seconds
        self.static_calls = self.eager_calls = 0
        self.tree_calls = self.resizes = 0
        self.capture_error = None
        self._copied = None
        self.t_ids = None                  # the tree forwards' fixed buffers (_tree_buffers)

    def _size(self) -> None:
        """scratch: real and padded query slots lie below it (a tree's padding queries write past its region,
        up to 2 node buckets above the row's context); dummy queries write at scratch .. length - 1."""
        self.scratch = self.max_len + max(self.max_query, 2 * self.tree_q)
        self.length = self.scratch + max(self.max_query, self.tree_q)

    def fits(self, max_rows: int, max_len: int) -> bool:
        """Whether a later run of `max_rows` rows and `max_len` slots can reuse this runner (and its graphs)."""
        return row_bucket(max_rows, 1 << 30) <= self.rows_cap and int(max_len) <= self.max_len

    def new_run(self) -> None:
        """Counters from zero for the next run over the same buffers and graphs (what stats() reports)."""
        self.forward_s, self.calls, self.static_calls, self.eager_calls = 0.0, 0, 0, 0
        self.tree_calls = self.resizes = 0
        self._events.clear()
        self._run_shapes = len(self.shapes)

    # ---- sizing --------------------------------------------------------------------------------------
    def kv_bytes(self) -> int:
        cfg = self.model.config
        cfg = getattr(cfg, "get_text_config", lambda: cfg)()
        layers = int(cfg.num_hidden_layers)
        heads = int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads)
        hd = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
        item = self.model.get_input_embeddings().weight.element_size()
        return 2 * layers * self.rows_cap * heads * self.length * hd * item

    def _check_memory(self) -> None:
        need = self.kv_bytes()
        if self.cuda:
            free, _ = self.torch.cuda.mem_get_info(self.device)
        else:
            import os
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        if need > 0.9 * free:
            raise BackendError(
                f"backend.static_shapes: the preallocated KV cache ({self.rows_cap} rows x {self.length} slots, "
                f"{need / 2**30:.2f} GiB) exceeds 90% of the free memory ({free / 2**30:.2f} GiB); lower "
                "engine.max_batch_size, workload.output_len or the prompt length, or set backend.static_shapes=off")

    # ---- the forward ---------------------------------------------------------------------------------
    def forward(self, rows, tokens: np.ndarray, lens: np.ndarray, qlens: np.ndarray | None = None,
                want: str = "last"):
        m, Q = tokens.shape
        if Q > self.max_query or m == 0:
            self.eager_calls += 1
            return super().forward(rows, tokens, lens, qlens, want)
        idx = (np.arange(rows.start, rows.stop) if isinstance(rows, slice)
               else np.asarray(rows, np.int64))
        B = row_bucket(int(idx[-1]) + 1, self.rows_cap)
        self._stage(idx, tokens, lens, qlens, B, Q)
        out = self._run(B, Q, want)
        self.static_calls += 1
        if out is None:
            return None
        if not (idx.size == B and idx[0] == 0):
            out = out[self.torch.as_tensor(idx, device=out.device)]
        if want == "all":
            return out[:, :Q]
        return out

    def _stage(self, idx, tokens, lens, qlens, B: int, Q: int) -> None:
        """The host side of a forward: this step's inputs into the pinned staging buffers, then one copy each
        into the fixed device buffers (rows outside `idx` get a dummy query over the scratch slots)."""
        if self._copied is not None:   # the last copies out of the pinned buffers are done before we overwrite them
            self._copied.synchronize()
        hi, hl, hq = self.h_ids[:B, :Q], self.h_lens[:B], self.h_last[:B]
        hi.zero_()
        hl.fill_(self.scratch)
        hq.zero_()
        t = self.torch.from_numpy
        hi[idx] = t(np.ascontiguousarray(tokens, np.int64))
        hl[idx] = t(np.ascontiguousarray(lens, np.int64))
        hq[idx] = t((np.full(idx.size, Q, np.int64) if qlens is None else np.asarray(qlens, np.int64)) - 1)
        self.ids[:B, :Q].copy_(hi, non_blocking=True)
        self.lens[:B].copy_(hl, non_blocking=True)
        self.last[:B].copy_(hq, non_blocking=True)
        if self.cuda:
            self._copied = self._copied or self.torch.cuda.Event()
            self._copied.record()

    # ---- tree forwards (node buckets) ------------------------------------------------------------
    def reserve_tree(self, queries: int) -> None:
        """Room for tree forwards of up to `queries` queries and region slots (rounded up to a power of two):
        the first tree wider than the runner's node buckets grows the slots per row (the KV kept), its fixed
        tree buffers and the scratch region; every captured graph is dropped then (addresses and the span
        changed) and recaptured at its next use (`resizes` counts these)."""
        q = row_bucket(int(queries), 1 << 30)
        if q <= self.tree_q:
            return
        self.tree_q = q
        self._size()
        self._check_memory()
        torch, dev, B = self.torch, self.device, self.rows_cap
        self.cache.grow_len(self.length)
        self.slot_ar = torch.arange(self.length, device=dev)
        pin = self.cuda
        self.t_ids, self.t_pos, self.t_slot = (torch.zeros((B, q), dtype=torch.long, device=dev) for _ in range(3))
        self.t_ctx = torch.zeros((B,), dtype=torch.long, device=dev)
        self.t_anc = torch.zeros((B, q, q), dtype=torch.bool, device=dev)
        self.th_ids, self.th_pos, self.th_slot = (torch.zeros((B, q), dtype=torch.long, pin_memory=pin)
                                                  for _ in range(3))
        self.th_ctx = torch.zeros((B,), dtype=torch.long, pin_memory=pin)
        self.th_anc = torch.zeros((B, q, q), dtype=torch.bool, pin_memory=pin)
        if self._graphs:
            self.resizes += 1
        self._graphs = {}

    def node_buckets(self) -> list[int]:
        """The query counts tree forwards pad to: 1, 2, 4, ... up to the runner's tree capacity."""
        return [1 << i for i in range(max(self.tree_q, 1).bit_length())]

    def forward_tree(self, rows, tokens: np.ndarray, slots: np.ndarray, pos: np.ndarray, ctx: np.ndarray,
                     anc: np.ndarray, qn: np.ndarray):
        """Runner.forward_tree over fixed buffers: rows padded to a row bucket, queries and the tree region to
        node buckets (tree.node_bucket over powers of two); one graph per (row bucket, query bucket, region
        bucket). Rows not asked for run dummy queries over their scratch slots."""
        m, Q = tokens.shape
        R = anc.shape[2]
        self.reserve_tree(max(Q, R))
        Qb, Rb = node_bucket(Q, self.node_buckets()), node_bucket(R, self.node_buckets())
        if Qb > Q or Rb > R:
            tokens = np.pad(tokens, ((0, 0), (0, Qb - Q)))
            slots = np.pad(slots, ((0, 0), (0, Qb - Q)))
            pos = np.pad(pos, ((0, 0), (0, Qb - Q)))
            anc = np.pad(anc, ((0, 0), (0, Qb - Q), (0, Rb - R)))
        tokens, slots, pos, anc = tree_inputs(tokens, slots, pos, ctx, anc, qn, Rb)
        idx = (np.arange(rows.start, rows.stop) if isinstance(rows, slice)
               else np.asarray(rows, np.int64))
        B = row_bucket(int(idx[-1]) + 1, self.rows_cap)
        if self._copied is not None:
            self._copied.synchronize()
        hi, hp, hs, hc, ha = (self.th_ids[:B, :Qb], self.th_pos[:B, :Qb], self.th_slot[:B, :Qb], self.th_ctx[:B],
                              self.th_anc[:B, :Qb, :Rb])
        hi.zero_()
        hp.zero_()
        hs.copy_(self.torch.arange(Qb)[None, :] + self.scratch)   # dummy rows: their scratch slots
        hc.fill_(self.scratch)
        ha.zero_()
        t = self.torch.from_numpy
        hi[idx], hp[idx], hs[idx] = t(tokens), t(pos), t(slots)
        hc[idx] = t(np.ascontiguousarray(ctx, np.int64))
        ha[idx] = t(np.ascontiguousarray(anc))
        for d, h in ((self.t_ids[:B, :Qb], hi), (self.t_pos[:B, :Qb], hp), (self.t_slot[:B, :Qb], hs),
                     (self.t_ctx[:B], hc), (self.t_anc[:B, :Qb, :Rb], ha)):
            d.copy_(h, non_blocking=True)
        if self.cuda:
            self._copied = self._copied or self.torch.cuda.Event()
            self._copied.record()
        out = self._run_key(("tree", B, Qb, Rb), lambda: self._tree_body(B, Qb, Rb))
        self.static_calls += 1
        self.tree_calls += 1
        if not (idx.size == B and idx[0] == 0):
            out = out[self.torch.as_tensor(idx, device=out.device)]
        return out[:, :Q]

    def _tree_body(self, B: int, Q: int, R: int):
        """The tree forward over bucket B, Q queries and an R-slot region, reading only the fixed buffers."""
        slots, ctx = self.t_slot[:B, :Q], self.t_ctx[:B]
        mask = tree_mask(self.slot_ar, ctx, slots, self.t_anc[:B, :Q, :R])
        self.cache.bind(slice(0, B), slots, self.length)
        kw = {"input_ids": self.t_ids[:B, :Q], "attention_mask": mask[:, None], "position_ids": self.t_pos[:B, :Q],
              self.cache_kw: self.cache, "use_cache": True}
        return self.model(**kw).logits

    def _body(self, B: int, Q: int, want: str):
        """The forward over bucket B and query length Q reading only the fixed buffers (capturable)."""
        torch = self.torch
        ids, lens = self.ids[:B, :Q], self.lens[:B]
        pos = lens[:, None] + self._q(Q)[None, :]
        mask = self.slot_ar[None, None, :] <= pos[:, :, None]
        self.cache.bind(slice(0, B), pos, self.length)
        kw = {"input_ids": ids, "attention_mask": mask[:, None], "position_ids": pos, self.cache_kw: self.cache,
              "use_cache": True}
        if self._decoder is None:
            logits = self.model(**kw).logits
            return None if want == "none" else (logits[self._q(B), self.last[:B]] if want == "last" else logits)
        h = self._decoder(**kw).last_hidden_state
        if want == "none":
            return h[:, :1, :1]   # a token output keeps the forward's work alive under capture
        if want == "last":
            h = h[self._q(B), self.last[:B]]
        return self._head(h)

    def _run(self, B: int, Q: int, want: str):
        out = self._run_key((B, Q, want), lambda: self._body(B, Q, want))
        return None if want == "none" else out

    def _run_key(self, key, body):
        with self._timed():
            if self.graphs_kind is None:
                return body()
            g = self._graphs.get(key)
            if g is None:
                g = self._capture(key, body)
            else:
                g.replay()
            return g.out

    def _capture(self, key, body):
        torch = self.torch
        if self.cuda:
            torch.cuda.synchronize(self.device)
        t0 = time.perf_counter()
        buffers = [self.ids, self.lens, self.last, self.slot_ar]
        if key[0] == "tree":
            buffers += [self.t_ids, self.t_pos, self.t_slot, self.t_ctx, self.t_anc]
        g = (CudaGraph(torch, self._pool, self.warmup) if self.graphs_kind == "cuda"
             else GraphStandIn(buffers))
        try:
            g.capture(body)
            if self.graphs_kind == "cuda":
                g.replay()   # the capture itself ran nothing: this call's outputs come from its first replay
                torch.cuda.synchronize(self.device)
        except Exception as e:   # noqa: BLE001  (a model that cannot be captured still runs, eagerly)
            if self.graphs_kind != "cuda":
                raise
            self.capture_error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            log.warning("backend.static_shapes=graphs: capturing %s failed (%s); static shapes run eagerly",
                        type(self.model).__name__, self.capture_error)
            self.graphs_kind, self._graphs = None, {}
            torch.cuda.synchronize(self.device)
            return _Eager(body())
        self._graphs[key] = g
        shape = (dict(bucket=key[1], query=key[2], region=key[3], want="tree") if key[0] == "tree"
                 else dict(bucket=key[0], query=key[1], want=key[2]))
        self.shapes.append(dict(shape, capture_s=time.perf_counter() - t0,
                                warmup=self.warmup if self.graphs_kind == "cuda" else 0))
        return g

    def stats(self) -> dict:
        """What the run's summary records about the static path: the graphs in use, those this run captured
        (each after its warm-up) and the seconds that took, the forwards replayed or run eagerly."""
        new = self.shapes[getattr(self, "_run_shapes", 0):]
        out = dict(graphs=self.graphs_kind or "none", graphs_held=len(self._graphs), captured=len(new),
                   capture_s=round(sum(s["capture_s"] for s in new), 6), warmup_per_capture=self.warmup if self.graphs_kind == "cuda" else 0,
                   static_forwards=self.static_calls, eager_forwards=self.eager_calls,
                   tree_forwards=self.tree_calls, tree_resizes=self.resizes,
                   kv_cache_gib=round(self.kv_bytes() / 2**30, 4), rows=self.rows_cap, slots=self.length)
        if self.capture_error:
            out["capture_error"] = self.capture_error
        return out
