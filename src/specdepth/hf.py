"""The real backend (`backend=hf`): batched, ragged, lossless speculative decoding on HF transformers.

One `HFExecutor` serves the engine's step loop (src/specdepth/engine.py) with a target and a draft model
loaded by `AutoModelForCausalLM.from_pretrained`.

KV caches. Each model keeps its keys/values in a `SlotCache`: per layer one preallocated buffer
[rows, kv_heads, length, head_dim], row i = the engine's row i. Every forward writes its new keys at each
row's own positions (`lens[i] + t`) and attends through an explicit 4D boolean mask, with explicit
position_ids. A row's cache length is a number, not a tensor shape: rejecting drafts just lowers the
number, and the next forward overwrites the stale slots. So the prefix is never recomputed, nothing is
cropped or copied per step, and the buffers never grow past the longest sequence plus max_depth + 1.
Rows move only when the engine retires finished sequences (the rows after the first retired one are
compacted, as the engine does with its own arrays). Ragged batches (different prompt lengths, different
draft depths, a draft lagging after depth-0 steps) are right-padded; padded queries attend to finite
values and their outputs are ignored.

Verification (decode.temperature, decode.top_p):
  temperature = 0: draft and target greedy; accept the longest prefix where draft == target argmax, then
                   the target's token at the first mismatch (or the bonus token). Output = target greedy.
  temperature > 0: p, q = the target's and draft's temperature/top-p distributions; accept draft token x
                   with probability min(1, p(x)/q(x)); on rejection sample from norm(max(0, p - q));
                   a bonus token from p when every draft is accepted (Leviathan et al.; Chen et al.).
The confidence reported to policies is the draft's probability of the token it proposed (under q when
sampling, under the plain softmax when greedy).

EOS is ignored: each request generates exactly output_len tokens (the benchmark convention of vLLM's
`ignore_eos`). Timing is wall clock; on CUDA each phase ends with a synchronize and model forwards are
timed with CUDA events (`forward_s`, used for the overhead figure).
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from .cost import CostModel, forward_flops
from .errors import BackendError, ConfigError, as_float, as_int
from .executor import Executor
from .inputs import PROMPT_KEYS, prompt_record, records, too_large_draft_vocab
from .workload import Request

_TORCH_DTYPES = ("float32", "float16", "bfloat16")


def _torch():
    try:
        import torch
    except ImportError:  # pragma: no cover - depends on the install
        raise BackendError("backend=hf needs torch and transformers: pip install 'specdepth[hf]'") from None
    return torch


# ---------------------------------------------------------------------------------------------------------
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
        """Make room for `rows` rows of `length` slots (grown by doubling, never beyond the maxima)."""
        if rows > self.cap_rows:
            self.cap_rows = min(self.max_rows, max(rows, 2 * self.cap_rows))
        if length > self.cap_len:
            self.cap_len = min(self.max_len, max(length, 2 * self.cap_len, 64))
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
        if self.cuda:
            ev0 = torch.cuda.Event(enable_timing=True)
            ev1 = torch.cuda.Event(enable_timing=True)
            ev0.record()
        else:
            t0 = time.perf_counter()
        kw = dict(input_ids=tokens, attention_mask=mask[:, None], position_ids=pos, cache=self.cache,
                  use_cache=True)
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
        self.calls += 1
        if self.cuda:
            ev1.record()
            self._events.append((ev0, ev1))
        else:
            self.forward_s += time.perf_counter() - t0
        return out

    def collect(self) -> None:
        """After a synchronize: add the CUDA-event times of the forwards since the last call."""
        for a, b in self._events:
            self.forward_s += a.elapsed_time(b) / 1e3
        self._events.clear()


def _rows_arg(torch, rows: np.ndarray, device):
    """A slice when `rows` is a contiguous block (views into the cache), else an index tensor."""
    if rows.size and int(rows[-1]) - int(rows[0]) + 1 == rows.size:
        return slice(int(rows[0]), int(rows[-1]) + 1)
    return torch.as_tensor(rows, device=device)


# ---------------------------------------------------------------------------------------------------------
class HFExecutor(Executor):
    name = "hf"
    clock = "wall"
    supports_oracle = False
    record_trace = True

    def __init__(self, cost: CostModel, model, seed: int = 0, decode=None, engine=None,
                 attn_implementation: str = "sdpa", num_threads: int | None = None, pad_token_id: int = 0):
        torch = _torch()
        self.torch = torch
        self.cost = cost
        self.pair = model
        self.seed = int(seed)
        decode = dict(decode or {})
        self.temperature = as_float(decode.get("temperature", 0.0), "decode.temperature", min=0)
        self.top_p = as_float(decode.get("top_p", 1.0), "decode.top_p", min=0, max=1, min_open=True)
        self.greedy = self.temperature == 0.0
        self.max_depth = engine.max_depth if engine is not None else 16
        self.max_batch = engine.max_batch_size if engine is not None else 512
        self.pad = as_int(pad_token_id, "backend.pad_token_id", min=0)
        if num_threads is not None:
            torch.set_num_threads(as_int(num_threads, "backend.num_threads", min=1))
        if not model.draft:
            raise ConfigError("model.draft: backend=hf needs a draft model (a hub id or a local directory)")
        if model.dtype not in _TORCH_DTYPES:
            raise ConfigError(f"model.dtype: backend=hf supports {list(_TORCH_DTYPES)}, got {model.dtype!r}")
        self.dtype = getattr(torch, model.dtype)
        dev = model.device
        if dev == "auto":
            dev = "cuda" if torch.cuda.is_available() else "cpu"
        if dev.startswith("cuda") and not torch.cuda.is_available():
            raise BackendError(f"model.device={model.device}: CUDA is not available on this machine")
        self.device = torch.device(dev)
        self.tokenizer = self._load_tokenizer(model.tokenizer, "model.tokenizer")
        self.target_model = self._load(model.target, "model.target", attn_implementation, model.device_map)
        first = self.target_model.get_input_embeddings().weight.device
        if model.device_map is not None:
            self.device = first
        self.draft_model = self._load(model.draft, "model.draft", attn_implementation, None)
        self._check_vocab()
        self.ctx_limit = int(getattr(self.target_model.config, "max_position_embeddings", 0) or 1 << 30)
        dctx = int(getattr(self.draft_model.config, "max_position_embeddings", 0) or 1 << 30)
        self.ctx_limit = min(self.ctx_limit, dctx)
        self.vt = int(self.target_model.get_output_embeddings().weight.shape[0])
        self.vd = int(self.draft_model.get_output_embeddings().weight.shape[0])
        self.gen = torch.Generator(device=self.device)
        self.gen.manual_seed(self.seed * 1000003 + 0x5D)
        self.cuda = self.device.type == "cuda"
        self.tr = self.dr = None           # Runners, built in check() once the workload's sizes are known
        self.n = 0
        self.outputs: dict[int, dict] = {}

    def machine(self) -> str:
        if self.device.type == "cuda":
            return f"{self.device} {self.torch.cuda.get_device_name(self.device)}"
        return str(self.device)

    # ---- loading -------------------------------------------------------------------------------------
    def _load_tokenizer(self, path, key):
        from transformers import AutoTokenizer
        try:
            return AutoTokenizer.from_pretrained(str(path))
        except Exception as e:
            raise BackendError(f"{key}: cannot load a tokenizer from {path!r}: {type(e).__name__}: "
                               f"{str(e).splitlines()[0] if str(e) else ''}") from None

    def _load(self, path, key, attn, device_map):
        from transformers import AutoModelForCausalLM
        kw = dict(dtype=self.dtype, attn_implementation=attn)
        if device_map is not None:
            kw["device_map"] = device_map
        try:
            m = AutoModelForCausalLM.from_pretrained(str(path), **kw)
        except Exception as e:
            raise BackendError(f"{key}: cannot load {path!r} with AutoModelForCausalLM: {type(e).__name__}: "
                               f"{str(e).splitlines()[0] if str(e) else ''}") from None
        if device_map is None:
            m = m.to(self.device)
        return m.eval()

    def _check_vocab(self):
        tok_vocab = self.tokenizer.get_vocab()
        ntok = len(tok_vocab)
        draft_dir = Path(str(self.pair.draft))
        has_tok = any((draft_dir / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.json"))
        if has_tok and str(self.pair.draft) != str(self.pair.tokenizer):
            dtok = self._load_tokenizer(self.pair.draft, "model.draft")
            if dtok.get_vocab() != tok_vocab:
                raise BackendError(
                    f"model.draft: {self.pair.draft} has a different vocabulary ({len(dtok.get_vocab())} tokens) "
                    f"from the tokenizer of model.target ({self.pair.tokenizer}, {ntok} tokens); speculative "
                    "decoding needs one tokenizer for both models")
        for key, m in (("model.target", self.target_model), ("model.draft", self.draft_model)):
            v = int(m.get_output_embeddings().weight.shape[0])
            if key == "model.draft" and v > int(self.target_model.get_output_embeddings().weight.shape[0]):
                raise BackendError(too_large_draft_vocab(self.pair, v, self.target_model))
            if v < ntok:
                raise BackendError(f"{key}: its vocabulary has {v} rows but the tokenizer ({self.pair.tokenizer}) "
                                   f"has {ntok} tokens; target and draft must share one vocabulary")

    # ---- the workload --------------------------------------------------------------------------------
    def _prompt_pool(self):
        path = self.pair.prompts
        if not path:
            return None
        p = Path(str(path))
        pool = []
        for where, rec in records(p, "model.prompts", PROMPT_KEYS, "prompts"):
            ids = prompt_record(where, rec)
            ids = self.tokenizer(ids)["input_ids"] if isinstance(ids, str) else ids
            if ids:
                pool.append(ids)
        if not pool:
            raise ConfigError(f"model.prompts: {p} holds no prompts")
        return pool

    def check(self, requests: list[Request]) -> None:
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, 0x9F3]))
        pool = None
        vocab = min(len(self.tokenizer), self.vt, self.vd)
        special = set(getattr(self.tokenizer, "all_special_ids", []) or [])
        for r in requests:
            where = f"request {r.request_id}"
            if not isinstance(r.output_len, (int, np.integer)) or r.output_len < 1:
                raise ConfigError(f"{where}: output_len must be >= 1, got {r.output_len}")
            if r.prompt_ids is not None:
                ids = [int(x) for x in r.prompt_ids]
                if any(x < 0 or x >= vocab for x in ids):
                    raise ConfigError(f"{where}: prompt_ids hold a token id outside the vocabulary [0, {vocab})")
            elif r.text is not None:
                ids = self.tokenizer(r.text)["input_ids"]
            elif r.prompt_len >= 1:
                if pool is None:
                    pool = self._prompt_pool() or False
                if pool:
                    ids, j = [], r.request_id
                    while len(ids) < r.prompt_len:
                        ids.extend(pool[j % len(pool)])
                        j += 1
                    ids = ids[:r.prompt_len]
                else:
                    allowed = np.setdiff1d(np.arange(vocab), np.fromiter(special, np.int64, len(special)))
                    ids = rng.choice(allowed if allowed.size else np.arange(vocab), r.prompt_len).tolist()
            else:
                ids = []
            if not ids:
                raise ConfigError(f"{where}: empty prompt (no tokens to condition on)")
            need = len(ids) + int(r.output_len) + self.max_depth
            if len(ids) >= self.ctx_limit or need > self.ctx_limit:
                raise ConfigError(
                    f"{where}: prompt ({len(ids)} tokens) + output_len ({r.output_len}) + engine.max_depth "
                    f"({self.max_depth}) = {need} exceeds the model's context ({self.ctx_limit} tokens)"
                    + ("; the prompt alone is longer than the context" if len(ids) >= self.ctx_limit else ""))
            r.prompt_ids = ids
            r.prompt_len = len(ids)
        if not requests:
            return
        rows = min(self.max_batch, len(requests))
        width = max(r.prompt_len + r.output_len for r in requests) + self.max_depth + 2
        self.width = width
        self.tr = Runner(self.target_model, rows, width)
        self.dr = Runner(self.draft_model, rows, width)
        self.ids = np.zeros((0, width), np.int64)
        self.rid = np.zeros(0, np.int64)
        self.plen = np.zeros(0, np.int64)
        self.olen = np.zeros(0, np.int64)
        self.length = np.zeros(0, np.int64)   # tokens known (prompt + generated)
        self.tlen = np.zeros(0, np.int64)     # tokens in the target's cache (= length - 1 between steps)
        self.dlen = np.zeros(0, np.int64)     # tokens in the draft's cache (lags after depth-0 steps)
        self.cap = 0

    # ---- sampling helpers ----------------------------------------------------------------------------
    def _dist(self, logits):
        """Temperature + top-p distribution, float32, over the last dim."""
        torch = self.torch
        x = logits.float() / self.temperature
        if self.top_p < 1.0:
            srt, idx = torch.sort(x, dim=-1, descending=True)
            pr = torch.softmax(srt, dim=-1)
            cum = torch.cumsum(pr, dim=-1)
            drop = (cum - pr) >= self.top_p   # keep the smallest prefix reaching top_p (at least one)
            srt = srt.masked_fill(drop, float("-inf"))
            x = torch.full_like(x, float("-inf")).scatter(-1, idx, srt)
        return torch.softmax(x, dim=-1)

    def _sample(self, probs):
        return self.torch.multinomial(probs, 1, generator=self.gen).squeeze(-1)

    def _sync(self):
        if self.cuda:
            self.torch.cuda.synchronize(self.device)
            self.tr.collect()
            self.dr.collect()

    @property
    def forward_s(self) -> float:
        """Seconds spent inside model forwards so far (both models)."""
        return (self.tr.forward_s + self.dr.forward_s) if self.tr is not None else 0.0

    # ---- rows ----------------------------------------------------------------------------------------
    def _grow(self, rows: int):
        if rows <= self.ids.shape[0]:
            return
        new = min(max(rows, 2 * self.ids.shape[0], 8), max(rows, self.max_batch))
        ids = np.zeros((new, self.width), np.int64)
        ids[:self.ids.shape[0]] = self.ids
        self.ids = ids

    def prefill(self, requests):
        torch = self.torch
        t0 = time.perf_counter()
        with torch.inference_mode():
            m, n0 = len(requests), self.n
            P = np.array([r.prompt_len for r in requests], np.int64)
            self._grow(n0 + m)
            Pm = int(P.max())
            toks = np.full((m, Pm), self.pad, np.int64)
            for j, r in enumerate(requests):
                toks[j, :P[j]] = r.prompt_ids
                self.ids[n0 + j, :P[j]] = r.prompt_ids
            rows = slice(n0, n0 + m)
            zeros = np.zeros(m, np.int64)
            logits = self.tr.forward(rows, toks, zeros, P, "last")
            first = logits.argmax(-1) if self.greedy else self._sample(self._dist(logits))
            self.dr.forward(rows, toks, zeros, P, "none")
            first = first.cpu().numpy()
            self.ids[n0 + np.arange(m), P] = first
            self.rid = np.concatenate([self.rid, [r.request_id for r in requests]])
            self.plen = np.concatenate([self.plen, P])
            self.olen = np.concatenate([self.olen, [r.output_len for r in requests]])
            self.length = np.concatenate([self.length, P + 1])
            self.tlen = np.concatenate([self.tlen, P])
            self.dlen = np.concatenate([self.dlen, P])
            self.n = n0 + m
            self._sync()
        z = np.zeros(m, np.int64)
        return (time.perf_counter() - t0, forward_flops(self.cost.target, z, P),
                forward_flops(self.cost.draft, z, P))

    def begin_step(self, depths):
        n = self.n
        K = int(depths.max(initial=0))
        self._K = K
        self.drafts = np.zeros((n, max(K, 1)), np.int64)
        if K and not self.greedy:
            self.q = self.torch.zeros((n, K, self.vt), dtype=self.torch.float32, device=self.device)
        else:
            self.q = None

    def draft(self, rows, position):
        torch = self.torch
        t0 = time.perf_counter()
        with torch.inference_mode():
            lens = self.dlen[rows]
            if position == 0:   # catch up: every known token not yet in the draft's cache (usually 1 or 2)
                ql = self.length[rows] - lens
                Q = int(ql.max())
                cols = lens[:, None] + np.arange(Q)[None, :]
                toks = self.ids[rows[:, None], np.minimum(cols, self.width - 1)]
                if Q > 1:
                    toks = np.where(np.arange(Q)[None, :] < ql[:, None], toks, self.pad)
            else:
                ql = np.ones(rows.size, np.int64)
                toks = self.drafts[rows, position - 1][:, None]
            logits = self.dr.forward(rows, toks, lens, None if position else ql, "last")
            if self.greedy:
                pr = torch.softmax(logits.float(), dim=-1)
                conf, tok = pr.max(dim=-1)
            else:
                q = self._dist(logits)
                tok = self._sample(q)
                conf = q.gather(-1, tok[:, None]).squeeze(-1)
                ridx = torch.as_tensor(rows, device=self.device)
                self.q[ridx, position, :q.shape[-1]] = q
            self.drafts[rows, position] = tok.cpu().numpy()
            conf = conf.double().cpu().numpy()
            self.dlen[rows] = lens + ql
            self._sync()
        return conf, time.perf_counter() - t0, forward_flops(self.cost.draft, lens, ql)

    def verify(self, drafted):
        torch = self.torch
        t0 = time.perf_counter()
        n = self.n
        with torch.inference_mode():
            k = np.asarray(drafted, np.int64)
            K = int(k.max(initial=0))
            Q = K + 1
            ar = np.arange(n)
            length = self.length
            toks = np.empty((n, Q), np.int64)
            toks[:, 0] = self.ids[ar, length - 1]
            if K:
                toks[:, 1:] = np.where(np.arange(K)[None, :] < k[:, None], self.drafts[:, :K], self.pad)
            lens = self.tlen
            logits = self.tr.forward(slice(0, n), toks, lens, k + 1, "all")
            valid = np.arange(K)[None, :] < k[:, None]
            if self.greedy:
                t = logits.argmax(-1).cpu().numpy()
                match = (toks[:, 1:] == t[:, :K]) & valid
                a = np.cumprod(match, axis=1).sum(axis=1) if K else np.zeros(n, np.int64)
                out = t[ar, a]
            else:
                p = self._dist(logits)                                     # [n, Q, Vt]
                a_t = torch.zeros(n, dtype=torch.long, device=self.device)
                qa = None
                if K:
                    d = torch.from_numpy(toks[:, 1:]).to(self.device)
                    pd = p[:, :K].gather(-1, d[..., None]).squeeze(-1)
                    qd = self.q[:, :K].gather(-1, d[..., None]).squeeze(-1)
                    u = torch.rand((n, K), generator=self.gen, device=self.device)
                    vt = torch.from_numpy(valid).to(self.device)
                    acc = (u * qd < pd) & vt
                    a_t = torch.cumprod(acc.long(), dim=1).sum(dim=1)
                    kt = torch.from_numpy(k).to(self.device)
                    rr = torch.arange(n, device=self.device)
                    qa = self.q[rr, a_t.clamp(max=K - 1)] * (a_t < kt)[:, None].float()
                pa = p[torch.arange(n, device=self.device), a_t]
                if qa is not None:
                    r = (pa - qa).clamp_(min=0)
                    s = r.sum(-1, keepdim=True)
                    r = torch.where(s > 0, r, pa)   # p == q exactly: the residual is empty, p is the answer
                else:
                    r = pa
                out = self._sample(r).cpu().numpy()
                a = a_t.cpu().numpy()
            a = a.astype(np.int64)
            # commit: the accepted drafts and the correction/bonus token, all rows at once
            vals = toks.copy()
            vals[:, :K] = toks[:, 1:]
            vals[ar, a] = out
            keep = np.arange(Q)[None, :] <= a[:, None]
            cols = length[:, None] + np.arange(Q)[None, :]
            rr = np.broadcast_to(ar[:, None], (n, Q))
            self.ids[rr[keep], cols[keep]] = vals[keep]
            self.tlen = length + a
            self.dlen = np.minimum(self.dlen, length + a)
            self.length = length + a + 1
            self._sync()
        return a, time.perf_counter() - t0, forward_flops(self.cost.target, lens, k + 1)

    def retire(self, keep):
        keep = np.asarray(keep, bool)
        drop = np.flatnonzero(~keep)
        if drop.size == 0:
            return
        for i in drop:
            p, o = int(self.plen[i]), int(self.olen[i])
            self.outputs[int(self.rid[i])] = dict(prompt_ids=self.ids[i, :p].tolist(),
                                                  output_ids=self.ids[i, p:p + o].tolist())
        idx = np.flatnonzero(keep)
        start = int(drop[0])
        moved = idx[idx > start]
        if moved.size:
            used = int(self.length[moved].max()) + 1
            src = self.torch.as_tensor(moved)
            with self.torch.inference_mode():
                self.tr.cache.compact(src, start, min(used, self.tr.cache.cap_len))
                self.dr.cache.compact(src, start, min(used, self.dr.cache.cap_len))
            self.ids[start:start + moved.size] = self.ids[moved]
        for name in ("rid", "plen", "olen", "length", "tlen", "dlen"):
            setattr(self, name, getattr(self, name)[keep])
        self.n = int(idx.size)

    def cache_state(self) -> dict:
        """For tests and debugging: per row, the cached lengths of both models and the known length."""
        return dict(length=self.length.copy(), target=self.tlen.copy(), draft=self.dlen.copy(),
                    allocated_target=self.tr.cache.allocated_len, allocated_draft=self.dr.cache.allocated_len,
                    rows_allocated=max((K.shape[0] for K in self.tr.cache.k.values()), default=0))

    def finish(self):
        recs = []
        for rid in sorted(self.outputs):
            o = self.outputs[rid]
            recs.append(dict(request_id=rid, prompt_ids=o["prompt_ids"], output_ids=o["output_ids"],
                             text=self.tokenizer.decode(o["output_ids"])))
        return {"generations.jsonl": recs}
