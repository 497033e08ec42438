"""One causal LM behind the real backend's forward path: `Runner` (a forward over some rows, each with its
own cache length and number of new tokens) over a `SlotCache` (a transformers-compatible KV cache of
preallocated per-layer buffers). Used by the hf executor, specdepth-profile and the perf experiments.

KV caches. Each model keeps its keys/values in a `SlotCache`: per layer one preallocated buffer
[rows, kv_heads, length, head_dim], row i = the engine's row i. Every forward writes its new keys at each
row's own positions (`lens[i] + t`) and attends through an explicit 4D boolean mask, with explicit
position_ids. A row's cache length is a number, not a tensor shape: rejecting drafts just lowers the
number, and the next forward overwrites the stale slots. So the prefix is never recomputed, nothing is
cropped or copied per step, and the buffers grow by doubling (`slots`), to at most twice
(the longest sequence + max_depth + 2).
Rows move only when the engine retires finished sequences (the rows after the first retired one are
compacted, as the engine's row table does with its columns). Ragged batches (different prompt lengths,
different draft depths, a draft lagging after depth-0 steps) are right-padded; padded queries attend to
finite values and their outputs are ignored. Draft trees run through `forward_tree`: explicit slots,
positions and an ancestor mask over each row's tree region (tree_inputs, tree_mask); `SlotCache.move`
then keeps the accepted path.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import time

import numpy as np

from .errors import BackendError
from .versions import require_hf


@functools.cache
def _torch():
    """torch, once torch and transformers are installed and not older than specdepth.versions.MINIMUM (else a
    one-line BackendError)."""
    require_hf()
    import torch
    return torch


# ---------------------------------------------------------------------------------------------------------
def slots(length: int) -> int:
    """The buffer length a cache grows to when it must hold `length` slots: the smallest power-of-two multiple
    of 64 (doubling). A function of the length alone, not of the order the cache grew in, so specdepth-profile's
    forward at a context runs over the buffer the executor's cache has at that context: the buffer's length,
    not only the slots a forward reads, changes its time (5-9 % on a CPU at batch 4-8 between a buffer of
    the context's length and one twice as long; experiments/fidelity/README.md, issue 15)."""
    n = -(-int(length) // 64)
    return 64 << (n - 1).bit_length()


class SlotCache:
    """A transformers-compatible KV cache (duck-typed: `update` and `get_seq_length`) over preallocated
    per-layer buffers. Before each forward, `bind(rows, pos, kv_len)` says which rows run, where each
    query token's key goes (pos [m, Q]) and how many key slots attention reads (kv_len)."""

    is_compileable = False

    def __init__(self, max_rows: int, max_len: int):
        self.max_rows, self.max_len = max_rows, max_len
        self.cap_rows, self.cap_len = 0, 0      # the capacity the buffers must have at the next update
        self.k: dict[int, object] = {}
        self.v: dict[int, object] = {}
        self._bound = None
        self._dev: dict = {}
        self._ar: dict = {}

    def reserve(self, rows: int, length: int) -> None:
        """Make room for `rows` rows of `length` slots (rows grown by doubling; lengths to `slots(length)`;
        never beyond the maxima)."""
        if rows > self.cap_rows:
            self.cap_rows = min(self.max_rows, max(rows, 2 * self.cap_rows))
        if length > self.cap_len:
            self.cap_len = min(self.max_len, slots(length))
        if rows > self.cap_rows or length > self.cap_len:
            raise BackendError(f"internal: cache too small ({rows} x {length} > {self.cap_rows} x {self.cap_len})")

    def bind(self, rows, pos, kv_len: int) -> None:
        self._bound = (rows, pos, kv_len)
        self._dev = {}

    def _index(self, device):
        d = self._dev.get(device)
        if d is None:
            rows, pos, _ = self._bound
            pos = pos.to(device, non_blocking=True)
            if isinstance(rows, slice):
                b = rows.stop - rows.start
                d = (None, self._arange(b, device), pos)
            else:
                rows = rows.to(device, non_blocking=True)
                d = (rows, rows[:, None], pos)
            self._dev[device] = d
        return d

    def _arange(self, b, device):
        torch = _torch()
        key = (device, b)
        a = self._ar.get(key)
        if a is None:
            a = self._ar[key] = torch.arange(b, device=device)[:, None]
        return a

    def _buffers(self, layer: int, k):
        K = self.k.get(layer)
        if K is None or K.shape[0] < self.cap_rows or K.shape[2] < self.cap_len:
            torch = _torch()
            shape = (self.cap_rows, k.shape[1], self.cap_len, k.shape[3])
            nk = torch.zeros(shape, dtype=k.dtype, device=k.device)
            nv = torch.zeros(shape, dtype=k.dtype, device=k.device)
            if K is not None:
                r, l = K.shape[0], K.shape[2]
                nk[:r, :, :l] = K
                nv[:r, :, :l] = self.v[layer]
            self.k[layer], self.v[layer] = nk, nv
        return self.k[layer], self.v[layer]

    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        K, V = self._buffers(layer_idx, key_states)
        rows, pos_rows, pos = self._index(key_states.device)
        kv_len = self._bound[2]
        kt, vt = key_states.transpose(1, 2), value_states.transpose(1, 2)   # [m, Q, H, d]
        if rows is None:   # a contiguous block of rows: views, no copy
            s = self._bound[0]
            Kb, Vb = K[s], V[s]
            Kb[pos_rows, :, pos] = kt
            Vb[pos_rows, :, pos] = vt
            return Kb[:, :, :kv_len], Vb[:, :, :kv_len]
        K[pos_rows, :, pos] = kt
        V[pos_rows, :, pos] = vt
        return K[rows, :, :kv_len], V[rows, :, :kv_len]

    def get_seq_length(self, *args, **kwargs) -> int:
        return 0

    def compact(self, src, start: int, used_len: int) -> None:
        """Rows start.. take the contents of rows `src` (a LongTensor of indices >= start, ascending)."""
        for layer in list(self.k):
            K, V = self.k[layer], self.v[layer]
            idx = src.to(K.device)
            m = idx.shape[0]
            K[start:start + m, :, :used_len] = K[idx, :, :used_len]
            V[start:start + m, :, :used_len] = V[idx, :, :used_len]

    def move(self, rows, src, dst) -> None:
        """Slot src[j] of row rows[j] into slot dst[j] (int64 arrays of one length), every layer: a draft tree's
        accepted path to the slots right after its root (tree_verify.kept_slots). The sources are read before
        any destination is written."""
        if not len(rows):
            return
        torch = _torch()
        for layer in list(self.k):
            K, V = self.k[layer], self.v[layer]
            r, s, d = (torch.as_tensor(np.asarray(a, np.int64), device=K.device) for a in (rows, src, dst))
            K[r, :, d] = K[r, :, s]
            V[r, :, d] = V[r, :, s]

    def grow_len(self, length: int) -> None:
        """Room for `length` slots a row now (the buffers reallocated, their contents kept)."""
        self.max_len = max(self.max_len, int(length))
        self.cap_len = max(self.cap_len, int(length))
        for layer in list(self.k):
            K, V = self.k[layer], self.v[layer]
            if K.shape[2] < self.cap_len:
                torch = _torch()
                shape = (K.shape[0], K.shape[1], self.cap_len, K.shape[3])
                nk = torch.zeros(shape, dtype=K.dtype, device=K.device)
                nv = torch.zeros(shape, dtype=K.dtype, device=K.device)
                nk[:, :, :K.shape[2]] = K
                nv[:, :, :K.shape[2]] = V
                self.k[layer], self.v[layer] = nk, nv

    @property
    def allocated_len(self) -> int:
        return max((K.shape[2] for K in self.k.values()), default=0)


# ---------------------------------------------------------------------------------------------------------
class Runner:
    """One causal LM plus its SlotCache: a forward over some rows, each with its own cache length and its
    own number of new tokens. Also used by specdepth-profile."""

    def __init__(self, model, max_rows: int, max_len: int):
        torch = _torch()
        self.torch = torch
        self.model = model
        # padded queries of a ragged forward may reach past the longest sequence: twice the room
        self.cache = SlotCache(max_rows, 2 * max_len)
        self.device = model.get_input_embeddings().weight.device
        self.cuda = self.device.type == "cuda"
        cfg = model.config
        self.vocab = int(model.get_output_embeddings().weight.shape[0])
        # the decoder + LM head split lets us compute logits only where needed (last valid position)
        self._decoder = getattr(model, "model", None)
        self._head = model.get_output_embeddings()
        if getattr(cfg, "final_logit_softcapping", None) or getattr(cfg, "logit_scale", None) \
                or self._decoder is None or not callable(self._head):
            self._decoder = None
        self.cache_kw = cache_kwarg(model)
        self.forward_s = 0.0
        self.calls = 0
        self._events: list = []
        self._qar: dict = {}

    def _q(self, Q: int):
        a = self._qar.get(Q)
        if a is None:
            a = self._qar[Q] = self.torch.arange(Q, device=self.device)
        return a

    def forward(self, rows, tokens: np.ndarray, lens: np.ndarray, qlens: np.ndarray | None = None,
                want: str = "last"):
        """rows: np.ndarray of row indices (ascending) or a slice; tokens [m, Q] int (right-padded);
        lens [m] tokens already cached per row; qlens [m] valid new tokens per row (None = all Q).
        want: "last" -> logits [m, V] at each row's last valid token; "all" -> [m, Q, V]; "none" -> None."""
        torch = self.torch
        m, Q = tokens.shape
        kv_len = int(lens.max()) + Q
        if isinstance(rows, np.ndarray):
            rows = _rows_arg(torch, rows, self.device)
        end = rows.stop if isinstance(rows, slice) else int(rows.max()) + 1
        self.cache.reserve(end, kv_len)
        lens = torch.from_numpy(np.ascontiguousarray(lens)).to(self.device, non_blocking=True)
        tokens = torch.from_numpy(np.ascontiguousarray(tokens)).to(self.device, non_blocking=True)
        pos = lens[:, None] + self._q(Q)[None, :]                               # [m, Q]
        mask = self._q(kv_len)[None, None, :] <= pos[:, :, None]               # causal over each row's slots
        self.cache.bind(rows, pos, kv_len)
        kw = {"input_ids": tokens, "attention_mask": mask[:, None], "position_ids": pos, self.cache_kw: self.cache,
              "use_cache": True}
        with self._timed():
            return self._logits(kw, want, qlens, m)

    def _logits(self, kw: dict, want: str, qlens, m: int):
        torch = self.torch
        if want == "last" and self._decoder is not None:
            h = self._decoder(**kw).last_hidden_state
            if qlens is None:
                h = h[:, -1]
            else:
                h = h[self._q(m), torch.from_numpy(qlens - 1).to(self.device)]
            out = self._head(h)
        elif want == "none" and self._decoder is not None:
            self._decoder(**kw)
            out = None
        else:
            out = self.model(**kw).logits
            if want == "last":
                out = (out[:, -1] if qlens is None
                       else out[self._q(m), torch.from_numpy(qlens - 1).to(self.device)])
            elif want == "none":
                out = None
        return out

    @contextlib.contextmanager
    def _timed(self):
        """Time one forward: CUDA events (read by collect after a synchronize), or the wall clock on CPU."""
        if self.cuda:
            ev0, ev1 = self.torch.cuda.Event(enable_timing=True), self.torch.cuda.Event(enable_timing=True)
            ev0.record()
            yield
            ev1.record()
            self._events.append((ev0, ev1))
        else:
            t0 = time.perf_counter()
            yield
            self.forward_s += time.perf_counter() - t0
        self.calls += 1

    def forward_tree(self, rows, tokens: np.ndarray, slots: np.ndarray, pos: np.ndarray, ctx: np.ndarray,
                     anc: np.ndarray, qn: np.ndarray):
        """A forward over draft-tree queries (the target's verify of root + nodes, or a draft level feeding
        nodes): tokens, slots (the cache slot each query's KV goes to), pos (its position id) int [m, Q];
        ctx [m] each row's tree region start (its root's slot: prefix slots below it are attended by every
        query); anc bool [m, Q, R]: query t attends to region slot ctx + r where anc[., t, r]; qn [m] the
        real queries per row (the rest are padding: see tree_inputs). Returns logits [m, Q, V]."""
        torch = self.torch
        m, Q = tokens.shape
        R = anc.shape[2]
        tokens, slots, pos, anc = tree_inputs(tokens, slots, pos, ctx, anc, qn, R)
        kv_len = int(max(slots.max() + 1, ctx.max() + R))
        if isinstance(rows, np.ndarray):
            rows = _rows_arg(torch, rows, self.device)
        end = rows.stop if isinstance(rows, slice) else int(rows.max()) + 1
        if kv_len > self.cache.max_len:   # a wide tree reaches past the chain's room: the buffers grow
            self.cache.max_len = kv_len
        self.cache.reserve(end, kv_len)
        dev = self.device
        t = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(dev, non_blocking=True)   # noqa: E731
        tokens, slots, pos, ctx_t, anc = t(tokens), t(slots), t(pos), t(np.asarray(ctx, np.int64)), t(anc)
        mask = tree_mask(self._q(kv_len), ctx_t, slots, anc)
        self.cache.bind(rows, slots, kv_len)
        with self._timed():
            return self.model(input_ids=tokens, attention_mask=mask[:, None], position_ids=pos,
                              use_cache=True, **{self.cache_kw: self.cache}).logits

    def collect(self) -> None:
        """After a synchronize: add the CUDA-event times of the forwards since the last call."""
        for a, b in self._events:
            self.forward_s += a.elapsed_time(b) / 1e3
        self._events.clear()


def tree_inputs(tokens, slots, pos, ctx, anc, qn, R: int):
    """A tree forward's host inputs with its padding queries filled in: query t >= qn[i] of row i feeds token
    0 at position ctx[i] and writes its KV at slot ctx[i] + R + t, past the row's tree region [ctx, ctx + R),
    where no real query of the step reads (the region holds the root and the nodes); it attends to the
    prefix and itself only, so every query attends to finite values."""
    m, Q = tokens.shape
    ctx = np.asarray(ctx, np.int64)
    pad = np.arange(Q)[None, :] >= np.asarray(qn, np.int64)[:, None]
    tokens = np.where(pad, 0, tokens).astype(np.int64)
    slots = np.where(pad, ctx[:, None] + R + np.arange(Q)[None, :], slots).astype(np.int64)
    pos = np.where(pad, ctx[:, None], pos).astype(np.int64)
    anc = anc & ~pad[:, :, None]
    return tokens, slots, pos, anc


def tree_mask(ar, ctx, slots, anc):
    """bool [m, Q, L] (L = ar's length, ar = arange(L) on the device): query t of row i attends to key slot s
    iff s < ctx[i] (the prefix), or s = ctx[i] + r with anc[i, t, r] (the root and the query's ancestors in
    the tree region, R = anc's last dim), or s is its own slot. Tensors; no host sync (capturable)."""
    R = anc.shape[2]
    rel = ar[None, :] - ctx[:, None]                                           # [m, L]
    inside = (rel >= 0) & (rel < R)
    tree = anc.gather(2, rel.clamp(0, R - 1)[:, None, :].expand(-1, anc.shape[1], -1))
    return (rel < 0)[:, None, :] | (inside[:, None, :] & tree) | (ar[None, None, :] == slots[:, :, None])


def cache_kwarg(model) -> str:
    """The keyword the model's forward takes its KV cache by: `cache`, or `past_key_values` before transformers
    renamed it. Passing the other name is not an error there: the model would silently build its own cache."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _rows_arg(torch, rows: np.ndarray, device):
    """A slice when `rows` is a contiguous block (views into the cache), else an index tensor."""
    if rows.size and int(rows[-1]) - int(rows[0]) + 1 == rows.size:
        return slice(int(rows[0]), int(rows[-1]) + 1)
    return torch.as_tensor(rows, device=device)


class ModelCache:
    """Opt-in, process-wide reuse of loaded models: inside `with MODELS.keep():` every model the real backend
    loads is loaded once per identity (path, weights, dtype, device, attention, seed) and shared by later runs
    (a script running hundreds of runs over one pair, experiments/gpu/). Outside it, every run loads its own."""

    def __init__(self):
        self._store: dict | None = None

    @contextlib.contextmanager
    def keep(self):
        prev = self._store
        self._store = {} if prev is None else prev
        try:
            yield self
        finally:
            self._store = prev

    def get(self, ident: tuple, load):
        if self._store is None:
            return load()
        if ident not in self._store:
            self._store[ident] = load()
        return self._store[ident]

    def held(self, ident: tuple):
        """What `get` stored under `ident` (None outside `keep()` or if nothing is)."""
        return None if self._store is None else self._store.get(ident)

    def drop(self, ident: tuple) -> None:
        if self._store is not None:
            self._store.pop(ident, None)


MODELS = ModelCache()


def random_causal_lm(path, key: str, dtype, attn: str, device, seed: int):
    """A causal LM with random weights from `path`'s config.json (a directory or a cached hub id), allocated
    and initialised directly on `device` in `dtype` (no weights read, none written). Seeded: the same seed
    gives the same weights on the same device."""
    torch = _torch()
    from transformers import AutoConfig, AutoModelForCausalLM
    try:
        cfg = AutoConfig.from_pretrained(str(path))
    except Exception as e:
        raise BackendError(f"{key}: model.init=random needs a config.json at {path!r}: {type(e).__name__}: "
                           f"{str(e).splitlines()[0] if str(e) else ''}") from None
    torch.manual_seed(int(seed))
    with torch.device(device):
        m = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation=attn)
    return m.to(device).eval()   # a no-op when the weights were created there
