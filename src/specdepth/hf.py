"""The real backend (`backend=hf`): batched, ragged, lossless speculative decoding on HF transformers.

One `HFExecutor` serves the engine's step loop (src/specdepth/engine.py) with a target and a draft model
loaded by `AutoModelForCausalLM.from_pretrained`. Each model runs through a `Runner` over its own slot KV
cache (hf_runner.py: rejected drafts are never recomputed or cropped, a row's cache length is a number).
Per row the executor keeps, as columns of the run's RowTable, the known tokens (`hf_ids`), the prompt and
output lengths, the tokens known (`hf_length`) and the tokens in each model's cache (`hf_tlen`, `hf_dlen`).

Verification (decode.temperature, decode.top_p) is the pure functions of verify.py: greedy, the target's
argmax (output = target greedy); sampling, the lossless rejection rule with residual and bonus sampling.
The confidence reported to policies is the draft's probability of the token it proposed (under q when
sampling, under the plain softmax when greedy). Prompts (token ids for text, the model.prompts pool, or
random tokens) come from the workload side (`workload.with_prompt_ids`); no request is modified.

Draft trees (a policy's tree plan; backend.acceptance=model only): `draft_tree` proposes each row's tree level
by level, one draft forward a level (the children of a node are the draft's top-w tokens there when greedy,
w i.i.d. samples of its distribution when sampling); `verify_tree` runs every row's root and nodes through
one target forward (tree positions, ancestor masks: Runner.forward_tree), tree_verify.greedy / rejection
decide, and the accepted path's KV moves to the slots after the root in both caches (tree_verify.kept_slots):
node i of a row sits at slot root + 1 + i in both models' caches. The path and the correction/bonus token
then join the known tokens as a chain's accepted drafts do. Timing mode runs tree plans with an acceptance
model that has a per-rank table (the simulator's keyed ranks decide the path).

EOS is ignored: each request generates exactly output_len tokens (the benchmark convention of vLLM's
`ignore_eos`). Timing is wall clock; on CUDA each phase ends with a synchronize and model forwards are
timed with CUDA events (`forward_s`, used for the overhead figure).
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from . import tree_verify as TV
from . import verify as V
from .checks import one_line
from .cost import CostModel, forward_flops
from .errors import BackendError, ConfigError, as_bool, as_float, as_int
from .executor import Executor, prefill_groups, prefill_price
from .hf_runner import MODELS, Runner, SlotCache, _torch, random_causal_lm  # noqa: F401  (Runner, SlotCache: API)
from .gpuinfo import snapshot
from .hf_static import StaticRunner, resolve_mode
from .inputs import too_large_draft_vocab
from .timing import timing_outcomes
from .tree import children_table, pack
from .workload import Request, with_prompt_ids

_TORCH_DTYPES = ("float32", "float16", "bfloat16")


class HFExecutor(Executor):
    name = "hf"
    clock = "wall"
    supports_oracle = False
    record_trace = True

    def __init__(self, cost: CostModel, model, seed: int = 0, decode=None, engine=None,
                 attn_implementation: str = "sdpa", num_threads: int | None = None, pad_token_id: int = 0,
                 acceptance: str = "model", acceptance_model=None, group_prefill: bool = True,
                 static_shapes: str = "auto"):
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
        # the admitted prompts prefill in groups of similar length, one padded forward a group, where the run's
        # cost model prices that cheaper than one padded forward for all (executor.prefill_groups)
        self.group_prefill = as_bool(group_prefill, "backend.group_prefill")
        # timing mode (backend.acceptance=simulated): accept/reject from the acceptance model (timing.py)
        self.timing = timing_outcomes(acceptance, acceptance_model, self.seed)
        self.lossless = self.timing is None
        self.supports_oracle = not self.lossless   # timing mode can reveal its outcomes (oracle policies)
        # draft trees: lossless verification, or timing mode with an acceptance model that has a per-rank table
        self._tree_acc = None if self.timing is None else self.timing.tree   # the simulator's keyed ranks
        self.supports_trees = self.lossless or self._tree_acc is not None
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
        # model.tokenizer defaults to model.target: a failure is then the target's
        self.tokenizer = self._load_tokenizer(model.tokenizer, "model.tokenizer" if model.tokenizer != model.target
                                              else "model.target (its tokenizer; or set model.tokenizer)")
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
        # backend.static_shapes: auto = CUDA graphs over fixed buffers on CUDA, the dynamic path elsewhere
        self.static = resolve_mode(static_shapes, self.device.type)
        self.tr = self.dr = None           # Runners, built in prepare() once the workload's sizes are known
        self.rows = None
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
                               f"{one_line(e)}") from None

    def _load(self, path, key, attn, device_map):
        ident = (str(path), key, self.pair.init, str(self.dtype), attn, str(self.device), str(device_map),
                 self.seed if self.pair.init == "random" else None)
        return MODELS.get(ident, lambda: self._load_model(path, key, attn, device_map))

    def _load_model(self, path, key, attn, device_map):
        if self.pair.init == "random":   # random weights from the checkpoint's config.json, built on the device
            return random_causal_lm(path, key, self.dtype, attn, self.device, self.seed + (key == "model.draft"))
        from transformers import AutoModelForCausalLM
        kw = dict(dtype=self.dtype, attn_implementation=attn)
        if device_map is not None:
            kw["device_map"] = device_map
        try:
            m = AutoModelForCausalLM.from_pretrained(str(path), **kw)
        except Exception as e:
            raise BackendError(f"{key}: cannot load {path!r} with AutoModelForCausalLM: {type(e).__name__}: "
                               f"{one_line(e)}") from None
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

    # ---- the workload ----------------------------------------------------------------------------------
    def prepare(self, requests: list[Request]) -> list[Request]:
        for r in requests:
            if not isinstance(r.output_len, (int, np.integer)) or r.output_len < 1:
                raise ConfigError(f"request {r.request_id}: output_len must be >= 1, got {r.output_len}")
        vocab = min(len(self.tokenizer), self.vt, self.vd)
        requests = with_prompt_ids(requests, self.tokenizer, vocab, self.seed, self.pair.prompts)
        for r in requests:
            need = r.prompt_len + int(r.output_len) + self.max_depth
            if r.prompt_len >= self.ctx_limit or need > self.ctx_limit:
                raise ConfigError(
                    f"request {r.request_id}: prompt ({r.prompt_len} tokens) + output_len ({r.output_len}) + "
                    f"engine.max_depth ({self.max_depth}) = {need} exceeds the model's context ({self.ctx_limit} "
                    "tokens)" + ("; the prompt alone is longer than the context" if r.prompt_len >= self.ctx_limit
                                 else ""))
        if requests:
            rows = min(self.max_batch, len(requests))
            self.width = max(r.prompt_len + r.output_len for r in requests) + self.max_depth + 2
            self.tr, self.dr = self._runner(self.target_model, rows), self._runner(self.draft_model, rows)
        self._gpu_before = snapshot(self.device)
        return requests

    def _runner(self, model, rows: int):
        """The forward path of one model for this run. Inside `MODELS.keep()` a static runner (its buffers and
        captured graphs) is kept with the model and reused by later runs it fits, as a serving engine keeps
        its graphs from start-up."""
        if self.static == "off":
            return Runner(model, rows, self.width)
        graphs = None if self.static == "eager" else ("cuda" if self.cuda else "standin")
        key = ("static", id(model), graphs, self.max_depth + 1)
        held = MODELS.held(key)
        if held is not None and held.fits(rows, self.width):
            held.new_run()
            return held
        MODELS.drop(key)   # free its buffers before allocating the larger ones
        return MODELS.get(key, lambda: StaticRunner(model, rows, self.width, self.max_depth + 1, graphs))

    def summary_fields(self) -> dict:
        """summary.json's `static_shapes`: the mode that ran and, on the static path, per model what it
        captured and how often it replayed (hf_static.StaticRunner.stats)."""
        out = dict(mode=self.static)
        for name, r in (("target", self.tr), ("draft", self.dr)):
            if isinstance(r, StaticRunner):
                out[name] = r.stats()
        fields = dict(static_shapes=out)
        if self.cuda:   # the GPU's clocks, power and temperature before and after the run (NVML)
            fields["gpu_state"] = dict(before=self._gpu_before, after=snapshot(self.device))
        return fields

    def attach(self, rows):
        for name in ("hf_request", "hf_plen", "hf_olen", "hf_length", "hf_tlen", "hf_dlen"):
            rows.add(name)   # request id, prompt and output length, tokens known, in the target's / draft's cache
        rows.add("hf_ids", np.int64, width=getattr(self, "width", 1))   # known tokens: prompt + generated
        rows.on_retire(self._retire)
        self.rows = rows
        if self.timing is not None:
            self.timing.attach(rows)

    def _sync(self):
        if self.cuda:
            self.torch.cuda.synchronize(self.device)
            self.tr.collect()
            self.dr.collect()

    @property
    def forward_s(self) -> float:
        """Seconds spent inside model forwards so far (both models)."""
        return (self.tr.forward_s + self.dr.forward_s) if self.tr is not None else 0.0

    def _first_token(self, logits):
        return logits.argmax(-1) if self.greedy else V.sample(V.distribution(logits, self.temperature, self.top_p),
                                                              self.gen)

    # ---- the step ------------------------------------------------------------------------------------
    def prefill(self, requests, new):
        t0 = time.perf_counter()
        r, m = self.rows, len(requests)
        P = np.array([q.prompt_len for q in requests], np.int64)
        with self.torch.inference_mode():
            toks = np.full((m, int(P.max())), self.pad, np.int64)
            for j, q in enumerate(requests):
                toks[j, :P[j]] = q.prompt_ids
                r.hf_ids[new.start + j, :P[j]] = q.prompt_ids
            zeros = np.zeros(m, np.int64)
            groups = (prefill_groups(P, prefill_price(self.cost)) if self.group_prefill
                      else [np.arange(m)])
            if len(groups) == 1:
                logits = self.tr.forward(new, toks, zeros, P, "last")
                self.dr.forward(new, toks, zeros, P, "none")
            else:   # one padded forward per group of similar prompt lengths; the first tokens drawn in row order
                logits = None
                for g in groups:
                    w, rows = int(P[g].max()), new.start + g
                    out = self.tr.forward(rows, toks[g, :w], zeros[g], P[g], "last")
                    if logits is None:
                        logits = out.new_empty((m,) + tuple(out.shape[1:]))
                    logits[self.torch.as_tensor(g, device=out.device)] = out
                    self.dr.forward(rows, toks[g, :w], zeros[g], P[g], "none")
            first = self._first_token(logits)
            r.hf_ids[new.start + np.arange(m), P] = first.cpu().numpy()
            r.hf_request[new] = [q.request_id for q in requests]
            r.hf_plen[new], r.hf_tlen[new], r.hf_dlen[new] = P, P, P
            r.hf_olen[new] = [q.output_len for q in requests]
            r.hf_length[new] = P + 1
            if self.timing is not None:
                self.timing.admit(r.hf_request[new], new)
            self._sync()
        return (time.perf_counter() - t0, forward_flops(self.cost.target, zeros, P),
                forward_flops(self.cost.draft, zeros, P))

    def begin_step(self, depths, kmax):
        n, K = self.rows.n, int(kmax)
        self._depths = depths
        self.drafts = np.zeros((n, max(K, 1)), np.int64)
        self.q = (self.torch.zeros((n, K, self.vt), dtype=self.torch.float32, device=self.device)
                  if K and not self.greedy else None)
        if self.timing is not None:
            self.timing.begin_step(K)

    def draft_lag(self):
        r = self.rows
        return r.hf_length - r.hf_dlen   # known tokens the draft's cache lacks (_draft_tokens feeds them)

    def peek_accepted(self, k):
        return super().peek_accepted(k) if self.timing is None else self.timing.peek(k)

    def peek_accept_prob(self, k):
        return super().peek_accept_prob(k) if self.timing is None else self.timing.peek_prob(k)

    def peek_expected_prob(self, k):
        return super().peek_expected_prob(k) if self.timing is None else self.timing.peek_expected_prob(k)

    def _draft_tokens(self, rows, position):
        """The draft's input at `position`: at 0 every known token not yet in its cache (usually 1 or 2,
        right-padded), later the token it drafted last. Returns (tokens [m, Q], valid tokens per row)."""
        r = self.rows
        lens = r.hf_dlen[rows]
        if position:
            return self.drafts[rows, position - 1][:, None], np.ones(rows.size, np.int64)
        ql = r.hf_length[rows] - lens
        Q = int(ql.max())
        cols = lens[:, None] + np.arange(Q)[None, :]
        toks = r.hf_ids[rows[:, None], np.minimum(cols, r.hf_ids.shape[1] - 1)]
        if Q > 1:
            toks = np.where(np.arange(Q)[None, :] < ql[:, None], toks, self.pad)
        return toks, ql

    def draft(self, rows, position):
        torch = self.torch
        t0 = time.perf_counter()
        with torch.inference_mode():
            lens = self.rows.hf_dlen[rows]
            toks, ql = self._draft_tokens(rows, position)
            logits = self.dr.forward(rows, toks, lens, None if position else ql, "last")
            if self.greedy:
                conf, tok = torch.softmax(logits.float(), dim=-1).max(dim=-1)
            else:
                q = V.distribution(logits, self.temperature, self.top_p)
                tok = V.sample(q, self.gen)
                conf = q.gather(-1, tok[:, None]).squeeze(-1)
                self.q[torch.as_tensor(rows, device=self.device), position, :q.shape[-1]] = q
            self.drafts[rows, position] = tok.cpu().numpy()
            conf = conf.double().cpu().numpy()
            if self.timing is not None:   # policies see the acceptance model's confidences (timing.py)
                conf = self.timing.confidence(rows, position)
            self.rows.hf_dlen[rows] = lens + ql
            self._sync()
        return conf, time.perf_counter() - t0, forward_flops(self.cost.draft, lens, ql)

    def verify(self, drafted):
        t0 = time.perf_counter()
        r, n = self.rows, self.rows.n
        k = np.asarray(drafted, np.int64)
        K = int(k.max(initial=0))
        with self.torch.inference_mode():
            toks = np.empty((n, K + 1), np.int64)
            toks[:, 0] = r.hf_ids[np.arange(n), r.hf_length - 1]
            if K:
                toks[:, 1:] = np.where(np.arange(K)[None, :] < k[:, None], self.drafts[:, :K], self.pad)
            lens = r.hf_tlen.copy()
            logits = self.tr.forward(slice(0, n), toks, lens, k + 1, "all")
            if self.timing is not None:
                a, out = self._simulated(logits, k)
            elif self.greedy:
                a, out = V.greedy(toks[:, 1:], k, logits.argmax(-1).cpu().numpy())
            else:
                p = V.distribution(logits, self.temperature, self.top_p)                  # [n, K + 1, Vt]
                d = self.torch.from_numpy(toks[:, 1:]).to(self.device)
                a, out = V.rejection(p, self.q, d, k, self.gen)
                a, out = a.cpu().numpy().astype(np.int64), out.cpu().numpy()
            self._commit(toks, a, out)
            self._sync()
        return a, time.perf_counter() - t0, forward_flops(self.cost.target, lens, k + 1)

    def _simulated(self, logits, k):
        """Timing mode: the accepted drafts from the acceptance model, then the target's own token after them
        (its argmax, or a sample of its distribution), at the cost of the lossless rule's target-side work."""
        a = self.timing.decide(k)
        ar = np.arange(a.size)
        if self.greedy:
            return a, logits.argmax(-1).cpu().numpy()[ar, a]
        p = V.distribution(logits, self.temperature, self.top_p)
        return a, V.sample(p[self.torch.from_numpy(ar), self.torch.from_numpy(a)], self.gen).cpu().numpy()

    def _commit(self, toks, a, out):
        """The accepted drafts and the correction/bonus token of every row into hf_ids; cache lengths."""
        r = self.rows
        n, Q = toks.shape
        ar = np.arange(n)
        length = r.hf_length.copy()
        vals = toks.copy()
        vals[:, :Q - 1] = toks[:, 1:]
        vals[ar, a] = out
        keep = np.arange(Q)[None, :] <= a[:, None]
        cols = length[:, None] + np.arange(Q)[None, :]
        rr = np.broadcast_to(ar[:, None], (n, Q))
        r.hf_ids[rr[keep], cols[keep]] = vals[keep]
        r.hf_tlen[:] = length + a
        r.hf_dlen[:] = np.minimum(r.hf_dlen, length + a)
        r.hf_length[:] = length + a + 1

    # ---- draft trees -------------------------------------------------------------------------------
    def tree_refusal(self) -> str:
        model = type(getattr(self.timing, "model", None)).__name__
        return (f"backend=hf in timing mode runs tree plans only with an acceptance model that has a per-rank "
                f"table (acceptance=ranked or iid); {model} runs chain plans only")

    def draft_tree(self, trees):
        """Every row's tree, level by level (one draft forward a level over the rows with nodes there). Level 1
        feeds what the row's draft cache lacks up to the root (as a chain's first position does); level d > 1
        feeds the depth-(d - 1) nodes that have children, node i at slot root + 1 + i of the draft's cache
        (the verifier's layout), attending to the prefix, the root and its ancestors. A node's children are
        the draft's top-w tokens after its path (greedy), or w i.i.d. samples of its distribution q there
        (sampling: tree_verify.rejection is then lossless with q the children's q). Confidence: the draft's
        probability of the node's token (q's when sampling, the plain softmax's when greedy); in timing mode
        the rank table's entry of its rank, as the simulator's."""
        torch = self.torch
        t0 = time.perf_counter()
        r, n = self.rows, self.rows.n
        trees = list(trees)
        N = np.array([t.nodes for t in trees], np.int64)
        Nmax = int(N.max(initial=0))
        Q = 1 + Nmax
        par, depth, real = pack(trees, Q)
        kids = children_table(trees, Q)
        anc = np.broadcast_to(np.eye(Q, dtype=bool), (n, Q, Q)).copy()   # ancestor-or-self, over queries
        for j in range(1, Q):
            has = real[:, j] & (par[:, j] >= 0)
            anc[has, j] |= anc[has, par[has, j]]
        ctx = r.hf_length - 1                          # the root's slot and position
        fed = np.zeros((n, Q), bool)                   # queries fed to the draft: parents of some node
        fed[:, 0] = N > 0
        fed[:, 1:] = kids[:, 1:, 0] >= 0
        if int(kids.shape[2]) > self.vd:
            raise BackendError(f"a tree node has {kids.shape[2]} children, more than the draft's vocabulary "
                               f"({self.vd} tokens)")
        tokens = np.zeros((n, Nmax), np.int64)
        conf = np.full((n, Nmax), np.nan)
        qn = (torch.zeros((n, Nmax, self.vt), dtype=torch.float32, device=self.device)
              if not self.greedy else None)
        dev = lambda x: torch.from_numpy(x).to(self.device)   # noqa: E731
        flops = 0.0
        D = int(depth.max(initial=0))
        with torch.inference_mode():
            for d in range(1, D + 1):
                if d == 1:
                    rows_d = np.flatnonzero(N > 0)
                    lens = r.hf_dlen[rows_d]
                    toks, ql = self._draft_tokens(rows_d, 0)
                    logits = self.dr.forward(rows_d, toks, lens, ql, "last")
                    r.hf_dlen[rows_d] = lens + ql
                    prow, pq = rows_d, np.zeros(rows_d.size, np.int64)
                    flops += forward_flops(self.cost.draft, lens, ql)
                else:
                    feed = fed & (depth == d - 1) & (np.arange(Q)[None, :] > 0)
                    rows_d = np.flatnonzero(feed.any(axis=1))
                    cnt = feed[rows_d].sum(axis=1)
                    F = int(cnt.max())
                    # each row's fed queries in node order, padded with query 0 (ignored: qn = cnt)
                    order = np.argsort(~feed[rows_d], axis=1, kind="stable")[:, :F]
                    on = np.arange(F)[None, :] < cnt[:, None]
                    qj = np.where(on, order, 0)
                    rr = rows_d[:, None]
                    c = ctx[rows_d]
                    logits = self.dr.forward_tree(
                        rows_d, np.where(on, tokens[rr, np.maximum(qj - 1, 0)], 0), c[:, None] + qj,
                        np.broadcast_to(c[:, None] + d - 1, qj.shape), c, anc[rr, qj] & on[:, :, None], cnt)
                    nz = np.nonzero(on)
                    oi, ot = (torch.from_numpy(x).to(logits.device) for x in nz)
                    logits = logits[oi, ot]
                    prow, pq = rows_d[nz[0]], qj[nz]
                    flops += forward_flops(self.cost.draft, c + d - 1, cnt)
                ch = kids[prow, pq]                                            # [P, W] child queries, -1 none
                W = int((ch >= 0).sum(axis=1).max())
                if self.greedy:
                    val, tok = torch.softmax(logits.float(), dim=-1).topk(W, dim=-1)
                else:
                    q = V.distribution(logits, self.temperature, self.top_p)
                    tok = torch.multinomial(q, W, replacement=True, generator=self.gen)
                    val = q.gather(-1, tok)
                tok, val = tok.cpu().numpy(), val.double().cpu().numpy()
                has = ch[:, :W] >= 0
                pi, ri = np.nonzero(has)
                node = ch[pi, ri] - 1
                tokens[prow[pi], node] = tok[pi, ri]
                conf[prow[pi], node] = val[pi, ri]
                if qn is not None:
                    qn[dev(prow[pi]), dev(node), :q.shape[-1]] = q[dev(pi)]
            self._sync()
        if self._tree_acc is not None:   # timing mode: policies see the rank table's confidences (sim.py's)
            conf = self._tree_acc.confidences(trees)
        self.tree_step = (trees, N, par, depth, anc, fed, tokens, qn)
        return conf, time.perf_counter() - t0, flops, D

    def verify_tree(self, trees):
        """One target forward over every row's root and tree nodes (tree positions and ancestor masks over its
        cache); tree_verify.greedy / tree_verify.rejection decide; the accepted path's KV moves to the slots
        after the root in both caches (tree_verify.kept_slots), the other nodes' slots are free; the path and
        the correction/bonus token join the row's known tokens as a chain's accepted drafts do. Timing mode:
        the path from the acceptance model's keyed ranks (tree_acceptance.TreeAcceptance, as the simulator
        walks it), then the target's own token after it."""
        torch = self.torch
        t0 = time.perf_counter()
        r, n = self.rows, self.rows.n
        trees, N, par, depth, anc, fed, tokens, qn = self.tree_step
        self.tree_step = None
        Q = par.shape[1]
        ar = np.arange(n)
        ctx = r.hf_length - 1
        with torch.inference_mode():
            toks = np.zeros((n, Q), np.int64)
            toks[:, 0] = r.hf_ids[ar, ctx]
            toks[:, 1:] = tokens
            logits = self.tr.forward_tree(slice(0, n), toks, ctx[:, None] + np.arange(Q)[None, :],
                                          ctx[:, None] + depth, ctx, anc, N + 1)
            if self._tree_acc is not None:
                a, path, out = self._tree_simulated(trees, logits)
            elif self.greedy:
                a, path, out = TV.greedy(trees, tokens, logits.argmax(-1).cpu().numpy())
            else:
                p = V.distribution(logits, self.temperature, self.top_p)
                a, path, out = TV.rejection(p, qn, torch.from_numpy(tokens).to(self.device), trees, self.gen)
                a, path, out = a.cpu().numpy().astype(np.int64), path.cpu().numpy(), out.cpu().numpy()
            src, dst = TV.kept_slots(ctx, path)
            mv = (src >= 0) & (src != dst)
            rr = np.broadcast_to(ar[:, None], src.shape)[mv]
            self.tr.cache.move(rr, src[mv], dst[mv])
            self.dr.cache.move(rr, src[mv], dst[mv])
            # the known tokens: the path's tokens, then the emitted token
            D = path.shape[1]
            length = r.hf_length.copy()
            on = path >= 0
            cols = length[:, None] + np.arange(D)[None, :]
            pr = np.broadcast_to(ar[:, None], path.shape)
            r.hf_ids[pr[on], cols[on]] = tokens[pr[on], path[on]]
            r.hf_ids[ar, length + a] = out
            r.hf_tlen[:] = length + a
            # the draft's cache: the root and the path's nodes it was fed (all but maybe the last)
            last = path[ar, np.maximum(a - 1, 0)] if D else np.zeros(n, np.int64)
            unfed = (a > 0) & ~fed[ar, np.maximum(last, 0) + 1]
            r.hf_dlen[:] = np.where(N > 0, length + a - unfed, np.minimum(r.hf_dlen, length))
            r.hf_length[:] = length + a + 1
            self._sync()
        return a, time.perf_counter() - t0, forward_flops(self.cost.target, ctx, N + 1)

    def _tree_simulated(self, trees, logits):
        """Timing mode's tree decision: at each depth the child whose rank the keyed ranks draw (none past the
        node's children or the table: the path ends), then the target's argmax (or a sample of its
        distribution) after the path's end; the acceptance model advances as the simulator's does."""
        r, n = self.rows, self.rows.n
        a, path, cur = self._tree_acc.accepted(trees, r.acc_request, r.acc_pos, path=True)
        dev = logits.device
        at = logits[self.torch.arange(n, device=dev), self.torch.from_numpy(cur).to(dev)]
        if self.greedy:
            out = at.argmax(-1).cpu().numpy()
        else:
            out = V.sample(V.distribution(at, self.temperature, self.top_p), self.gen).cpu().numpy()
        self.timing.commit(self._depths, a)
        return a, path, out

    def _retire(self, keep):
        """Before the table drops finished rows: keep their outputs, move the KV cache rows that follow."""
        r = self.rows
        keep = np.asarray(keep, bool)
        drop = np.flatnonzero(~keep)
        if drop.size == 0:
            return
        for i in drop.tolist():
            p, o = int(r.hf_plen[i]), int(r.hf_olen[i])
            self.outputs[int(r.hf_request[i])] = dict(prompt_ids=r.hf_ids[i, :p].tolist(),
                                                      output_ids=r.hf_ids[i, p:p + o].tolist())
        idx = np.flatnonzero(keep)
        start = int(drop[0])
        moved = idx[idx > start]
        if moved.size:
            used = int(r.hf_length[moved].max()) + 1
            src = self.torch.as_tensor(moved)
            with self.torch.inference_mode():
                self.tr.cache.compact(src, start, min(used, self.tr.cache.cap_len))
                self.dr.cache.compact(src, start, min(used, self.dr.cache.cap_len))

    def cache_state(self) -> dict:
        """For tests and debugging: per row, the cached lengths of both models and the known length."""
        r = self.rows
        return dict(length=r.hf_length.copy(), target=r.hf_tlen.copy(), draft=r.hf_dlen.copy(),
                    allocated_target=self.tr.cache.allocated_len, allocated_draft=self.dr.cache.allocated_len,
                    rows_allocated=max((K.shape[0] for K in self.tr.cache.k.values()), default=0))

    def finish(self):
        if self.timing is not None:   # timing mode: the outputs are not the target's decoding
            return {}
        recs = []
        for rid in sorted(self.outputs):
            o = self.outputs[rid]
            recs.append(dict(request_id=rid, prompt_ids=o["prompt_ids"], output_ids=o["output_ids"],
                             text=self.tokenizer.decode(o["output_ids"])))
        return {"generations.jsonl": recs}
