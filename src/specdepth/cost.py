"""Cost models: how long a target or draft forward over a ragged batch takes, and its FLOPs.

Every method takes numpy arrays `ctx` (tokens already in each sequence's KV cache) and `q` (query tokens
each sequence feeds this forward; `None` means one each). They reduce to a handful of sums, so a call
costs a few microseconds whatever the batch size.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import _kernels as _k
from .capacity import Parallel, kv_bytes_per_gpu
from .errors import ConfigError, as_float
from .models import ModelArch

_I64 = np.dtype(np.int64)   # (the native dtype, compared by identity first)


@dataclass(frozen=True)
class Hardware:
    """One accelerator: dense BF16 peak, HBM bandwidth, and the fraction of each a forward reaches."""

    name: str
    peak_tflops: float
    bandwidth_tbs: float
    mfu: float = 0.6
    mbu: float = 0.8
    memory_gb: float | None = None
    source: str = ""
    interconnect_gbs: float | None = None   # GPU-to-GPU bandwidth per direction (NVLink), for tensor parallelism
    interconnect_source: str = ""

    def __post_init__(self):
        as_float(self.peak_tflops, "hardware.peak_tflops", min=0, min_open=True)
        as_float(self.bandwidth_tbs, "hardware.bandwidth_tbs", min=0, min_open=True)
        as_float(self.mfu, "hardware.mfu", min=0, max=1, min_open=True)
        as_float(self.mbu, "hardware.mbu", min=0, max=1, min_open=True)
        if self.memory_gb is not None:
            as_float(self.memory_gb, "hardware.memory_gb", min=0, min_open=True)
        if self.interconnect_gbs is not None:
            as_float(self.interconnect_gbs, "hardware.interconnect_gbs", min=0, min_open=True)

    @property
    def flops_per_s(self) -> float:
        return self.peak_tflops * 1e12 * self.mfu

    @property
    def bytes_per_s(self) -> float:
        return self.bandwidth_tbs * 1e12 * self.mbu

    @property
    def ridge(self) -> float:
        """Arithmetic intensity (FLOP/byte) at which a kernel turns compute-bound, at achieved rates."""
        return self.flops_per_s / self.bytes_per_s


#: the simulator's hardware entry (conf/hardware/<name>.yaml) for a device whose name contains the key
#: (torch.cuda.get_device_name: "NVIDIA H200", "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", ...)
HARDWARE_BY_DEVICE = (("H200", "h200"), ("H100", "h100_sxm"), ("A100", "a100_80g"), ("B200", "b200"))


def hardware_for_device(device_name: str) -> str | None:
    """The conf/hardware entry for a device name, or None when the simulator has no entry for it."""
    return next((hw for key, hw in HARDWARE_BY_DEVICE if key in str(device_name).upper()), None)


def _sums(ctx: np.ndarray, q: np.ndarray | None):
    """(query tokens, attended (query, key) pairs, context tokens read) of a ragged forward."""
    int64 = ctx.dtype == np.int64
    if q is None:  # one query token per sequence: the decode/draft fast path
        n = ctx.shape[0]
        c = float(_k.int_sum(ctx) if int64 else ctx.sum())
        return float(n), c + n, c
    q = np.asarray(q)
    if int64 and q.dtype == np.int64 and q.shape == ctx.shape:
        return _k.ragged_sums(ctx, q)   # the same sums in one compiled pass
    t = float(q.sum())
    c = float(ctx.sum())
    pairs = float(np.dot(q, ctx)) + float(np.dot(q, q + 1)) * 0.5   # causal within the query block
    return t, pairs, c


def expected_experts(experts: int, per_token: int, tokens: float, skew: float = 0.0) -> float:
    """Expected distinct experts a layer touches over `tokens` tokens, each routed to `per_token` of
    `experts`. skew 0: uniform routing, E (1 - (1 - k/E)^T). skew s > 0: expert e's popularity ~ (e + 1)^-s
    (Zipf), each token includes it with probability pi_e = min(1, c (e + 1)^-s), sum pi_e = k, and
    E[distinct] = sum_e 1 - (1 - pi_e)^T."""
    if tokens <= 0:
        return 0.0
    if skew == 0.0:
        return experts * (1.0 - (1.0 - per_token / experts) ** tokens)
    w = np.arange(1, experts + 1, dtype=float) ** -skew
    capped = np.zeros(experts, bool)
    for _ in range(experts):   # water-filling: cap at 1, spread the rest over the uncapped experts
        pi = np.where(capped, 1.0, w * (per_token - capped.sum()) / w[~capped].sum())
        if not (pi > 1.0).any():
            break
        capped |= pi > 1.0
    return float((1.0 - (1.0 - np.minimum(pi, 1.0)) ** tokens).sum())


class MoEWeights:
    """Weight bytes one GPU reads in a forward over `tokens` tokens of a mixture of experts: everything but
    the routed experts once, plus each layer's expected distinct experts (cached per token count)."""

    def __init__(self, arch: ModelArch, tp: int = 1, skew: float = 0.0):
        self.arch, self.skew = arch, skew
        bpp = arch.bytes_per_param
        self.fixed = (arch.weight_bytes - arch.layers * arch.experts * arch.expert_params * bpp) / tp
        self.per_expert = arch.layers * arch.expert_params * bpp / tp   # one expert in every layer
        self._cache: dict[int, float] = {}

    def __call__(self, tokens: float) -> float:
        t = int(tokens)
        b = self._cache.get(t)
        if b is None:
            a = self.arch
            b = self.fixed + self.per_expert * expected_experts(a.experts, a.experts_per_token, t, self.skew)
            self._cache[t] = b
        return b


def forward_flops(arch: ModelArch, ctx: np.ndarray, q: np.ndarray | None = None) -> float:
    t, pairs, _ = _sums(ctx, q)
    return 2.0 * t * arch.matmul_params + arch.attn_flops_coeff * pairs


class CostModel:
    """Base class. Subclasses implement `_time(which, tokens, flops, ctx_tokens, seqs)`; FLOPs are analytic for
    all. docs/plugins.md has the protocol."""

    #: the tensor-parallel group (capacity.Parallel) a model splits each forward over; None: it models one
    #: GPU, and the app refuses parallel.tensor > 1 with it
    parallel = None

    def __init__(self, target: ModelArch, draft: ModelArch | None = None):
        self.target = target
        self.draft = draft if draft is not None else target
        self._tf = (2.0 * target.matmul_params, float(target.attn_flops_coeff))
        self._df = (2.0 * self.draft.matmul_params, float(self.draft.attn_flops_coeff))

    # --- the two primitives executors call --------------------------------------------------------
    def target_forward(self, ctx: np.ndarray, q: np.ndarray | None = None) -> tuple[float, float]:
        t, pairs, c = _sums(ctx, q)
        flops = self._tf[0] * t + self._tf[1] * pairs
        return self._time("target", t, flops, c, ctx.shape[0]), flops

    def draft_forward(self, ctx: np.ndarray, q: np.ndarray | None = None) -> tuple[float, float]:
        t, pairs, c = _sums(ctx, q)
        flops = self._df[0] * t + self._df[1] * pairs
        return self._time("draft", t, flops, c, ctx.shape[0]), flops

    def draft_positions(self, ctx: np.ndarray, depths: np.ndarray) -> tuple[float, float]:
        """Every draft forward of a step in one call: at position p, one token for each row with
        depths > p, at context ctx + p. Same result as calling draft_forward per position."""
        return self._positions("draft", ctx, depths)

    def _positions(self, which: str, ctx: np.ndarray, depths: np.ndarray) -> tuple[float, float]:
        if ctx.dtype == np.int64 and depths.dtype == np.int64:
            cnt, csum = _k.position_counts(ctx, depths)   # rows with depth > p, the sum of their contexts
        else:
            k = int(depths.max(initial=0))
            cnt = np.cumsum(np.bincount(depths, minlength=k + 1)[::-1])[::-1][1:]
            csum = np.cumsum(np.bincount(depths, weights=ctx, minlength=k + 1)[::-1])[::-1][1:]
        seconds = flops = 0.0
        a, b = self._df
        cnt, csum = cnt.tolist(), csum.tolist()
        ns, cs, fs = [], [], []
        for p in range(len(cnt)):
            n = float(cnt[p])
            c = float(csum[p]) + p * n
            ns.append(n)
            cs.append(c)
            fs.append(a * n + b * (c + n))
        for t, f in zip(self._position_times(which, ns, fs, cs), fs):
            seconds += t
            flops += f
        return seconds, flops

    def _position_times(self, which: str, n: list, flops: list, ctx_tokens: list) -> list:
        """_time of each draft position's forward (n[p] rows, one token each): one call per position here;
        TableCost looks them all up at once."""
        return [self._time(which, x, f, c, x) for x, f, c in zip(n, flops, ctx_tokens)]

    def _time(self, which: str, tokens: float, flops: float, ctx_tokens: float, seqs: int) -> float:
        raise NotImplementedError

    # --- conveniences for policies -----------------------------------------------------------------
    def verify_time(self, ctx: np.ndarray, depths: np.ndarray) -> float:
        """Seconds of one target forward verifying `depths[i]` drafts (+1 token) for each sequence."""
        return self.target_forward(np.asarray(ctx), np.asarray(depths) + 1)[0]

    def verify_times(self, ctx: np.ndarray, totals: np.ndarray) -> np.ndarray:
        """verify_time(ctx, depths) for each total number of drafts in `totals`, spread evenly over the
        rows (totals[j] / n drafts each, fractional): a step-time table in one call (policies' StepCost)."""
        n, c = ctx.shape[0], float(np.sum(ctx))
        q = np.asarray(totals, float) / n + 1.0
        t = n * q
        flops = self._tf[0] * t + self._tf[1] * (q * c + n * q * (q + 1.0) * 0.5)   # _sums' pairs, closed form
        return self._times("target", t, flops, np.full(t.size, c), np.full(t.size, n))

    def uniform_verify_time(self, n: int, context: int, drafts: int) -> float:
        """float(verify_time(np.full(n, context), np.full(n, drafts))) (int64): a verify of n rows, each at one
        context with the same drafts (a batch padded to its longest row and its deepest one: policies'
        `kit.pad_extra`)."""
        return float(self.verify_time(np.full(n, context, np.int64), np.full(n, drafts, np.int64)))

    def draft_times(self, context: float, rows: np.ndarray) -> np.ndarray:
        """draft_time of rows[j] rows each at context `context`, for every j (0 rows: 0 seconds)."""
        m = np.asarray(rows, float)
        out = np.zeros(m.size)
        on = np.flatnonzero(m)
        m = m[on]
        c = m * context
        out[on] = self._times("draft", m, self._df[0] * m + self._df[1] * (c + m), c, m)
        return out

    def step_tables(self, ctx: np.ndarray, totals: np.ndarray, context: float, rows: np.ndarray) -> tuple:
        """(verify_times(ctx, totals), draft_times(context, rows)): a step's verify and draft tables in one call
        (policies' StepCost)."""
        return self.verify_times(ctx, totals), self.draft_times(context, rows)

    def draft_forward_times(self, ctx: np.ndarray, qs) -> np.ndarray:
        """draft_forward(ctx, np.full(n, q))[0] for each q in `qs` (one draft forward of q tokens a row: a draft
        tree level's price table, policies.kit.TreePrice) in one `_times` call, each with draft_forward's sums and
        arithmetic (the same bits); a subclass that prices draft_forward itself is called per q."""
        ctx, qs = np.asarray(ctx), np.asarray(qs, np.int64)
        n = ctx.shape[0]
        if type(self).draft_forward is not CostModel.draft_forward or ctx.dtype != np.float64 or ctx.ndim != 1:
            return np.array([self.draft_forward(ctx, np.full(n, q, np.int64))[0] for q in qs.tolist()], float)
        rows = np.empty((qs.size, n))
        rows[:] = qs[:, None]
        if hasattr(np, "vecdot"):   # _sums' np.dot(q, ctx) for every q: vecdot's loop is np.dot's per row
            dots = np.vecdot(rows, ctx)
        else:
            dots = np.array([float(np.dot(r, ctx)) for r in rows])
        t = (qs * n).astype(float)   # float(q.sum()), exact
        pairs = dots + (qs * (qs + 1) * n).astype(float) * 0.5
        flops = self._df[0] * t + self._df[1] * pairs
        return self._times("draft", t, flops, np.full(t.size, float(ctx.sum())), np.full(t.size, n))

    def draft_level_times(self, ctx: np.ndarray, q: np.ndarray) -> np.ndarray:
        """float [D]: a draft tree's level forwards (specdepth.tree.tree_draft), draft_forward(ctx[m] + l,
        q[m, l])[0] for each column l of q [n, D], m the rows with q[:, l] != 0."""
        ctx, q = np.asarray(ctx, np.int64), np.asarray(q, np.int64)
        out = []
        for lvl in range(q.shape[1]):
            m = np.flatnonzero(q[:, lvl])
            out.append(self.draft_forward(ctx[m] + lvl, q[m, lvl])[0])
        return np.array(out, float)

    def tree_tables(self, ctx: np.ndarray, nodes: int, queries: int) -> tuple[np.ndarray, np.ndarray]:
        """A draft tree step's two price tables in one call (policies.kit.TreePrice): verify[x] = verify_times(ctx,
        x n) for x in 0..nodes (x drafts a row) and draft[q] = draft_forward_times(ctx, [q]) for q in 1..queries,
        draft[0] = 0.0 (no forward); the same values as those calls."""
        n = np.asarray(ctx).shape[0]
        verify = np.asarray(self.verify_times(ctx, np.arange(int(nodes) + 1, dtype=float) * n), float)
        more = np.asarray(self.draft_forward_times(ctx, np.arange(1, int(queries) + 1)), float)
        return verify, np.concatenate([np.zeros(1), more])

    def _times(self, which: str, tokens: np.ndarray, flops: np.ndarray, ctx_tokens: np.ndarray,
               seqs: np.ndarray) -> np.ndarray:
        """`_time` of each forward of arrays of them."""
        return np.array([self._time(which, *a) for a in zip(tokens.tolist(), flops.tolist(), ctx_tokens.tolist(),
                                                             seqs.tolist())], dtype=float).reshape(tokens.shape)

    def row_verify_times(self, context: float, n: int) -> tuple[float, float]:
        """(verify_time(c, np.zeros(n)), verify_time(c[1:], np.zeros(n - 1))) for c = np.full(n, context): a verify
        without drafts of n >= 1 rows at one context, and of one row less (0.0 where n is 1): what one more row
        adds to a verify (policies' `kit.row_cost`)."""
        c = np.full(n, float(context))
        one_less = float(self.verify_time(c[1:], np.zeros(n - 1))) if n > 1 else 0.0
        return float(self.verify_time(c, np.zeros(n))), one_less

    def draft_time(self, ctx: np.ndarray) -> float:
        """Seconds of one draft forward (one token for each sequence in `ctx`)."""
        return self.draft_forward(np.asarray(ctx))[0] if len(ctx) else 0.0

    def step_time(self, ctx: np.ndarray, depths: np.ndarray) -> float:
        """Predicted seconds of a whole step: draft positions over the sequences still drafting, then verify."""
        ctx = np.asarray(ctx)
        depths = np.asarray(depths)
        total = self.verify_time(ctx, depths)
        for p in range(int(depths.max(initial=0))):
            total += self.draft_time(ctx[depths > p] + p)
        return total

    def ridge_tokens(self, tolerance: float = 0.05, context: int = 0) -> int:
        """The most tokens one target forward carries at about the cost of one (within `tolerance`)."""
        one = self.target_forward(np.array([context]))[0]
        lo, hi = 1, 1
        while hi < 1 << 22 and self.target_forward(np.full(hi * 2, context))[0] <= one * (1 + tolerance):
            hi *= 2
        hi *= 2
        while hi - lo > 1:  # invariant: lo fits, hi does not
            mid = (lo + hi) // 2
            if self.target_forward(np.full(mid, context))[0] <= one * (1 + tolerance):
                lo = mid
            else:
                hi = mid
        return lo


class RooflineCost(CostModel):
    """time = max(FLOPs / (peak x mfu), bytes / (bandwidth x mbu)) + communication + a fixed overhead,
    per GPU of the model's tensor-parallel group (`parallel`; one GPU by default).

    Bytes: every weight once per forward (layers + LM head; a mixture of experts: the experts the forward's
    tokens touch, `moe_skew` shaping the routing) and each sequence's KV cache once, both divided over the
    group, as are the FLOPs. Communication: the group's all-reduces, seconds per token plus a fixed latency
    (capacity.Parallel.comm_s); zero on one GPU, where the formula is the single-GPU roofline exactly.
    """

    def __init__(self, target: ModelArch, draft: ModelArch | None = None, hardware: Hardware | None = None,
                 overhead_s: float = 2e-5, draft_overhead_s: float | None = None, parallel=None,
                 moe_skew: float = 0.0):
        super().__init__(target, draft)
        if hardware is None:
            raise ConfigError("cost=roofline needs a hardware entry (hardware=h100_sxm, ...)")
        self.hardware = hardware
        self.parallel = parallel if parallel is not None else Parallel()
        self.overhead_s = as_float(overhead_s, "cost.overhead_s", min=0)
        self.draft_overhead_s = (self.overhead_s if draft_overhead_s is None
                                 else as_float(draft_overhead_s, "cost.draft_overhead_s", min=0))
        self.moe_skew = as_float(moe_skew, "cost.moe_skew", min=0)
        self._inv_b = 1.0 / hardware.bytes_per_s
        self._inv_f, self._w, self._kv, self._oh, self._ca, self._moe = {}, {}, {}, {}, {}, {}
        for which, arch, oh in (("target", target, self.overhead_s), ("draft", self.draft, self.draft_overhead_s)):
            tp = self.parallel.degree(which)
            per_token, per_forward = self.parallel.comm_s(arch, which, hardware.interconnect_gbs)
            self._inv_f[which] = 1.0 / (hardware.flops_per_s * tp)
            self._w[which] = float(arch.weight_bytes) / tp
            self._kv[which] = float(kv_bytes_per_gpu(arch, tp))
            self._oh[which] = oh + per_forward if tp > 1 else oh
            self._ca[which] = per_token
            self._moe[which] = MoEWeights(arch, tp, self.moe_skew) if arch.is_moe else None
        self._target_terms = (self._tf[0], self._tf[1], self._w["target"], self._kv["target"], self._inv_f["target"],
                              self._inv_b, self._oh["target"], self._ca["target"])
        self._draft_terms = (self._df[0], self._df[1], self._w["draft"], self._kv["draft"], self._inv_f["draft"],
                             self._inv_b, self._oh["draft"], self._ca["draft"])
        # step_parts' one pass: where verify_time and draft_positions are this class's, the terms as arrays
        cls = type(self)
        self._parts = (self._moe["target"] is None and self._moe["draft"] is None
                       and cls.verify_time is RooflineCost.verify_time
                       and cls.draft_positions is RooflineCost.draft_positions)
        self._terms = np.array(self._target_terms, float), np.array(self._draft_terms, float)
        # uniform_verify_time's and padded_verify_time's closed form: where verify_time is this class's (no MoE target)
        self._flat_verify = self._moe["target"] is None and cls.verify_time is RooflineCost.verify_time
        self._tree_rows = {}   # tree_tables' query rows by (queries, rows)
        self._row_arrays = np.empty(0), np.empty(0)   # row_verify_times' contexts and ones (the most rows so far)
        # row_verify_times' arithmetic: where verify_time, target_forward and _time are this class's (no MoE target)
        self._flat = (self._moe["target"] is None and cls.verify_time is RooflineCost.verify_time
                      and cls.target_forward is RooflineCost.target_forward and cls._time is RooflineCost._time)
        # step_tables' one pass: where verify_times and draft_times are this class's compiled tables (no MoE)
        self._table_pass = (self._moe["target"] is None and self._moe["draft"] is None
                            and cls.verify_times is RooflineCost.verify_times
                            and cls.draft_times is RooflineCost.draft_times)

    def _time(self, which, tokens, flops, ctx_tokens, seqs):
        moe = self._moe[which]
        return _k.roofline_seconds(flops, tokens, ctx_tokens, self._w[which] if moe is None else moe(tokens),
                                   self._kv[which], self._inv_f[which], self._inv_b, self._oh[which],
                                   self._ca[which])

    def _times(self, which, tokens, flops, ctx_tokens, seqs):
        if self._moe[which] is not None:
            return super()._times(which, tokens, flops, ctx_tokens, seqs)
        return _k.roofline_many(flops, tokens, ctx_tokens, self._w[which], self._kv[which], self._inv_f[which],
                                self._inv_b, self._oh[which], self._ca[which])   # the same roofline, compiled

    def target_forward(self, ctx, q=None):
        if (q is not None and self._moe["target"] is None and type(q) is np.ndarray and ctx.dtype == np.int64
                and q.dtype == np.int64 and q.shape == ctx.shape):   # the verify's shape: one compiled pass
            return _k.roofline_forward(ctx, q, *self._target_terms)
        return super().target_forward(ctx, q)

    def verify_time(self, ctx, depths):
        if (self._moe["target"] is None and type(ctx) is np.ndarray and type(depths) is np.ndarray
                and ctx.dtype == np.int64 and depths.dtype == np.int64 and ctx.shape == depths.shape
                and ctx.ndim == 1):   # the base class's target_forward(ctx, depths + 1), one compiled pass
            return _k.roofline_verify(ctx, depths, *self._target_terms)
        return super().verify_time(ctx, depths)

    def uniform_verify_time(self, n, context, drafts):
        """verify_time's compiled pass on n rows alike, its sums as products (`_kernels.roofline_uniform_verify`):
        the same value."""
        if self._flat_verify and n >= 0:
            return _k.roofline_uniform_verify(int(n), int(context), int(drafts), self._terms[0])
        return super().uniform_verify_time(n, context, drafts)

    def padded_verify_time(self, ctx, depths):
        """(pads, seconds) of n >= 1 rows (int64 vectors of one shape): whether any row is below the longest context
        or the deepest drafts (n > 1), and where one is, uniform_verify_time(n, ctx.max(), max(depths.max(), 0)), the
        verify of the batch padded to its longest and deepest row (else 0.0), in one compiled pass
        (`_kernels.roofline_padded_verify`); None where it does not apply (the caller prices it)."""
        if (self._flat_verify and type(ctx) is np.ndarray and type(depths) is np.ndarray and ctx.ndim == 1
                and (ctx.dtype is _I64 or ctx.dtype == np.int64) and (depths.dtype is _I64 or depths.dtype == np.int64)
                and ctx.shape == depths.shape and ctx.shape[0]):
            return _k.roofline_padded_verify(ctx, depths, self._terms[0])
        return None

    def verify_times(self, ctx, totals):
        x = np.asarray(totals, float)
        if (self._moe["target"] is None and type(ctx) is np.ndarray and ctx.dtype == np.int64 and ctx.ndim == 1
                and ctx.shape[0] and x.ndim == 1):   # the base class's table, in one compiled pass
            return _k.roofline_verify_table(ctx, x, *self._target_terms)
        if (self._moe["target"] is None and type(ctx) is np.ndarray and ctx.dtype == np.float64 and ctx.ndim == 1
                and ctx.shape[0] and x.ndim == 1):   # a float context vector (TreePrice's): the same, compiled
            return _k.roofline_verify_table_at(float(np.sum(ctx)), float(ctx.shape[0]), x, *self._target_terms)
        return super().verify_times(ctx, totals)

    def row_verify_times(self, context, n):
        """The base class's two verifies with its numpy sums (np.add.reduce: ndarray.sum's) and dot products on the
        same values (n contexts and n ones, each without its first: the first n of two kept arrays, the contexts
        filled per call), their arithmetic in one compiled pass (`_kernels.roofline_flat_verify`): the same values."""
        if not (self._flat and n >= 1):
            return super().row_verify_times(context, n)
        c, q = self._row_arrays
        if c.shape[0] < n:
            c, q = self._row_arrays = np.empty(n), np.ones(n)   # (q: the base class's depths + 1)
        c, q = c[:n], q[:n]
        c.fill(float(context))
        if n == 1:
            return _k.roofline_flat_verify(1, float(np.add.reduce(c)), 0.0, float(np.dot(q, c)), 0.0, self._terms[0])
        add, less = np.add.reduce, c[1:]
        return _k.roofline_flat_verify(n, float(add(c)), float(add(less)), float(np.dot(q, c)),
                                       float(np.dot(q[:n - 1], less)), self._terms[0])

    def draft_level_times(self, ctx, q):
        if (self._moe["draft"] is None and type(self).draft_forward is CostModel.draft_forward
                and type(self)._time is RooflineCost._time and type(ctx) is np.ndarray and type(q) is np.ndarray
                and ctx.dtype == np.int64 and q.dtype == np.int64 and q.ndim == 2 and ctx.shape == q.shape[:1]):
            return _k.roofline_tree_levels(ctx, q, *self._draft_terms)   # the base class's forwards, one pass
        return super().draft_level_times(ctx, q)

    def draft_forward_times(self, ctx, qs):
        c, q = np.asarray(ctx), np.asarray(qs, np.int64)
        if (self._moe["draft"] is None and type(self).draft_forward is CostModel.draft_forward
                and type(self)._time is RooflineCost._time and c.dtype == np.float64 and c.ndim == 1 and q.ndim == 1
                and hasattr(np, "vecdot")):   # the base class's dot products, then its arithmetic in one pass
            rows = np.empty((q.size, c.shape[0]))
            rows[:] = q[:, None]
            return _k.roofline_draft_forward_table(q, c.shape[0], np.vecdot(rows, c), float(c.sum()),
                                                   *self._draft_terms)
        return super().draft_forward_times(ctx, qs)

    def tree_tables(self, ctx, nodes, queries):
        c, X, Q, cls, me = np.asarray(ctx), int(nodes), int(queries), type(self), RooflineCost
        if (cls.verify_times is me.verify_times and cls.draft_forward_times is me.draft_forward_times
                and self._moe["target"] is None and self._moe["draft"] is None
                and cls.draft_forward is CostModel.draft_forward and cls._time is me._time
                and c.dtype == np.float64 and c.ndim == 1 and c.shape[0] and X >= 0 and Q >= 0
                and hasattr(np, "vecdot")):   # both tables' arithmetic in one compiled pass, after the same sums
            rows = self._tree_rows.get((Q, c.shape[0]))   # row j: j + 1 each (kept per shape, read-only)
            if rows is None:
                if len(self._tree_rows) >= 16:
                    self._tree_rows.clear()
                rows = self._tree_rows[Q, c.shape[0]] = np.empty((Q, c.shape[0]))
                rows[:] = np.arange(1, Q + 1)[:, None]
                rows.flags.writeable = False
            out = np.empty(X + Q + 2)
            _k.roofline_tree_tables(float(c.sum()), c.shape[0], X, np.vecdot(rows, c), self._terms[0],
                                    self._terms[1], out)
            return out[:X + 1], out[X + 1:]
        return super().tree_tables(ctx, nodes, queries)

    def draft_times(self, context, rows):
        m = np.asarray(rows, float)
        if self._moe["draft"] is None and m.ndim == 1:   # the base class's table, in one compiled pass
            return _k.roofline_draft_table(float(context), m, *self._draft_terms)
        return super().draft_times(context, rows)

    def step_tables(self, ctx, totals, context, rows):
        """verify_times and draft_times in one compiled pass (`_kernels.roofline_step_tables`, their loops: the same
        values) into one array, for int64 contexts where both are this class's compiled tables; else the two calls."""
        x, m = np.asarray(totals, float), np.asarray(rows, float)
        if (self._table_pass and type(ctx) is np.ndarray and ctx.dtype == np.int64 and ctx.ndim == 1 and ctx.shape[0]
                and x.ndim == 1 and m.ndim == 1):
            out = np.empty(x.size + m.size)
            _k.roofline_step_tables(ctx, x, float(context), m, self._terms[0], self._terms[1], out)
            return out[:x.size], out[x.size:]
        return super().step_tables(ctx, totals, context, rows)

    def step_parts(self, ctx, depths):
        """(verify_time(ctx, depths), draft_positions(ctx, depths)[0]): a step's predicted verify and draft seconds
        in one compiled pass (the same values), for int64 arrays of one shape; None elsewhere (call those two)."""
        if (self._parts and type(ctx) is np.ndarray and type(depths) is np.ndarray and ctx.ndim == 1
                and (ctx.dtype is _I64 or ctx.dtype == np.int64) and (depths.dtype is _I64 or depths.dtype == np.int64)
                and ctx.shape == depths.shape):
            tt, dt = self._terms
            return _k.roofline_step_parts(ctx, depths, tt, dt)
        return None

    def draft_positions(self, ctx, depths):
        if ctx.dtype == np.int64 and depths.dtype == np.int64 and self._moe["draft"] is None:
            # the base class's sum, in one compiled pass
            return _k.roofline_positions(ctx, depths, self._df[0], self._df[1], self._w["draft"],
                                         self._kv["draft"], self._inv_f["draft"], self._inv_b,
                                         self._oh["draft"], self._ca["draft"])
        return super().draft_positions(ctx, depths)


class ConstantCost(CostModel):
    """Leviathan et al.'s setting: every target forward costs `target_step_s`, a draft one `draft_ratio` x that."""

    def __init__(self, target: ModelArch, draft: ModelArch | None = None, target_step_s: float = 0.02,
                 draft_ratio: float = 0.05):
        super().__init__(target, draft)
        self.target_step_s = as_float(target_step_s, "cost.target_step_s", min=0, min_open=True)
        self.draft_ratio = as_float(draft_ratio, "cost.draft_ratio", min=0)
        self._t = {"target": self.target_step_s, "draft": self.target_step_s * self.draft_ratio}

    def _time(self, which, tokens, flops, ctx_tokens, seqs):
        return self._t[which]

    def ridge_tokens(self, tolerance: float = 0.05, context: int = 0) -> int:
        """Flat cost has no ridge: every forward up to the engine's hard cap costs the same."""
        return 1 << 30


class TableCost(CostModel):
    """Forward times interpolated from a profile CSV written by `specdepth-profile` on this machine.

    CSV columns: model (target|draft), batch, query (new tokens per sequence), context (cached tokens per
    sequence), seconds. A forward over n sequences with t new tokens and c cached tokens in total is looked up
    at (batch n, query t/n, context c/n): multilinear interpolation in (log2 batch, log2 query, context) inside
    the grid; beyond the largest batch x query the time scales with the number of tokens, beyond the largest
    context it extrapolates linearly from the last two context points. FLOPs stay analytic (base class).
    """

    COLUMNS = ("model", "batch", "query", "context", "seconds")

    def __init__(self, target, draft=None, path: str | None = None, model_name: str | None = None):
        super().__init__(target, draft)
        if not path:
            raise ConfigError("cost.path: cost=table needs the CSV written by specdepth-profile (cost.path=...)")
        from pathlib import Path
        p = Path(str(path))
        if not p.is_file():
            raise ConfigError(f"cost.path: profile CSV not found: {p}")
        rows, meta = self._read(p)
        if not rows["target"]:
            raise ConfigError(f"cost.path: {p} has no target rows")
        self._check_model(p, meta, model_name)
        if not rows["draft"]:   # a target-only profile prices only a draft that is the target itself
            self._build(rows["target"], p, "target")
            if self.draft.signature != self.target.signature:
                raise ConfigError(f"cost.path: {p} has no draft rows (the file is cut off, or was profiled with "
                                  f"models=[target]); this run's draft is another model: profile both "
                                  f"(specdepth-profile models=[target,draft]) and point cost.path at that CSV")
            rows["draft"] = rows["target"]
        # draft_next rows (specdepth-profile interleave=true): a draft forward that follows another draft
        # forward of the same step (positions >= 1), where the draft rows time the first one, after a target
        # forward; absent = the draft rows serve both
        self.has_draft_next = bool(rows["draft_next"])
        if not self.has_draft_next:
            del rows["draft_next"]
        self.path = str(p)
        self.device = meta.get("device")
        self.model_name = model_name
        self._grid = {w: self._build(rows[w], p, w) for w in rows}
        self._check_cover(p)

    def _read(self, p):
        """({target|draft: {(batch, query, context): seconds}}, the profile's model/device metadata)."""
        import csv
        rows: dict[str, dict] = {"target": {}, "draft": {}, "draft_next": {}}
        meta: dict = {"arch": {}}
        try:
            with p.open(newline="", encoding="utf-8") as f:
                reader = csv.DictReader(f)
                missing = [c for c in self.COLUMNS if c not in (reader.fieldnames or [])]
                if missing:
                    raise ConfigError(f"cost.path: {p} lacks columns {missing} (a specdepth-profile CSV has "
                                      f"{list(self.COLUMNS)})")
                seen: dict = {}
                for lineno, r in enumerate(reader, 2):
                    # cells past the header, or a row that stops before its seconds (a file cut off)
                    if None in r or any(r[c] is None for c in self.COLUMNS):
                        n = sum(v is not None for k, v in r.items() if k is not None) + len(r.get(None) or [])
                        raise ConfigError(f"{p}:{lineno}: {n} cells, the header has {len(reader.fieldnames)} (the "
                                          f"file is cut off or was edited by hand): profile again with "
                                          f"specdepth-profile")
                    which = r["model"]
                    if which not in rows:
                        raise ConfigError(f"{p}:{lineno}: model must be target, draft or draft_next, got "
                                          f"{which!r}")
                    try:
                        key = (int(r["batch"]), int(r["query"]), int(r["context"]))
                        sec = float(r["seconds"])
                    except (TypeError, ValueError) as e:
                        raise ConfigError(f"{p}:{lineno}: {e}") from None
                    if min(key[:2]) < 1 or key[2] < 0 or not 0 < sec < float("inf"):
                        raise ConfigError(f"{p}:{lineno}: batch and query must be >= 1, context >= 0, seconds > 0 "
                                          f"and finite")
                    if (which, key) in seen:
                        raise ConfigError(f"{p}:{lineno}: {which} batch={key[0]} query={key[1]} context={key[2]} "
                                          f"is also on line {seen[which, key]}: one time per point")
                    seen[which, key] = lineno
                    rows[which][key] = sec
                    if r.get("arch"):
                        meta["arch"].setdefault(which, r["arch"])
                    for k in ("name", "device"):
                        if r.get(k):
                            meta.setdefault(k, r[k])
        except UnicodeDecodeError as e:
            raise ConfigError(f"cost.path: {p} is not UTF-8 text ({e.reason} at byte {e.start})") from None
        return rows, meta

    def _check_model(self, p, meta, model_name):
        """Refuse a profile measured for another model: by its `arch` column (specdepth-profile writes it), or
        for older profiles without one, by its `name` column."""
        archs = {"target": self.target.signature, "draft": self.draft.signature, "draft_next": self.draft.signature}
        for which, sig in meta["arch"].items():
            if sig.rsplit("-", 1)[0] != archs[which].rsplit("-", 1)[0]:   # the shape; the dtype may differ
                raise ConfigError(f"cost.path: {p} was profiled for another model ({meta.get('name', '?')}, {which} "
                                  f"{sig}); this run's {which} is {archs[which]}: profile this model with "
                                  f"specdepth-profile and point cost.path at its CSV")
        if not meta["arch"] and model_name and meta.get("name") and meta["name"] != model_name:
            raise ConfigError(f"cost.path: {p} was profiled for model {meta['name']!r}, this run's model is "
                              f"{model_name!r}: profile this model with specdepth-profile and point cost.path at "
                              f"its CSV")

    def _check_cover(self, p):
        """specdepth-profile times every model at the same grid points: draft (and draft_next) rows that stop
        short of the target's batches or contexts mean a file cut off (they would be extrapolated)."""
        tb, _, tc, _ = self._grid["target"]
        for which, (b, _, c, _) in self._grid.items():
            if which != "target" and (b[-1] < tb[-1] or c[-1] < tc[-1]):
                raise ConfigError(f"cost.path: {p}: the {which} rows stop at batch {2 ** b[-1]:g} and context "
                                  f"{c[-1]:g}, the target rows at batch {2 ** tb[-1]:g} and context {tc[-1]:g} (the "
                                  f"file is cut off?): profile again with specdepth-profile")

    @staticmethod
    def _build(points: dict, p, which):
        B = np.array(sorted({k[0] for k in points}), float)
        Q = np.array(sorted({k[1] for k in points}), float)
        C = np.array(sorted({k[2] for k in points}), float)
        T = np.full((B.size, Q.size, C.size), np.nan)
        for (b, q, c), s in points.items():
            T[np.searchsorted(B, b), np.searchsorted(Q, q), np.searchsorted(C, c)] = s
        if np.isnan(T).any():
            raise ConfigError(f"cost.path: {p}: the {which} rows do not form a full batch x query x context grid "
                              f"({int(np.isnan(T).sum())} of {T.size} points missing)")
        return np.log2(B), np.log2(Q), C, T

    def lookup(self, which: str, batch: float, query: float, context: float) -> float:
        """Seconds of one forward of `which` at (batch, query, context), interpolated (see the class)."""
        return float(self.lookups(which, np.array([batch], float), np.array([query], float),
                                  np.array([context], float))[0])

    def lookups(self, which: str, batch: np.ndarray, query: np.ndarray, context: np.ndarray) -> np.ndarray:
        """lookup() of many points at once (1-d float arrays of one length): the policies' step-time tables."""
        out = np.empty(len(context))
        _k.table_lookup(*self._grid[which], batch, query, context, out)
        return out

    def _time(self, which, tokens, flops, ctx_tokens, seqs):
        n = max(float(seqs), 1.0)
        return self.lookup(which, n, tokens / n, ctx_tokens / n)

    def _position_times(self, which, n, flops, ctx_tokens):
        """_time of every position in one lookups() call, with _time's arithmetic per point (the same bits)."""
        nf = np.maximum(np.array(n, float), 1.0)
        return self.lookups(which, nf, np.array(n, float) / nf, np.array(ctx_tokens, float) / nf).tolist()

    def verify_times(self, ctx: np.ndarray, totals: np.ndarray) -> np.ndarray:
        """The base class's table, every point looked up in one call. The arithmetic is the base class's
        (tokens n x (totals / n + 1), then _time's per-sequence division), so the values are the same to the bit."""
        n, c = ctx.shape[0], float(np.sum(ctx))
        t = n * (np.asarray(totals, float) / n + 1.0)
        nf = max(float(n), 1.0)
        return self.lookups("target", np.full(t.shape, nf), t / nf, np.full(t.shape, c / nf))

    def draft_times(self, context: float, rows: np.ndarray) -> np.ndarray:
        """The base class's table, every point looked up in one call (0 rows: 0 seconds); context per row as
        _time computes it, (m x context) / m, for the same bits."""
        m = np.asarray(rows, float)
        mf = np.maximum(m, 1.0)
        return np.where(m > 0, self.lookups("draft", mf, m / mf, (m * context) / mf), 0.0)

    # --- the draft forwards after the first of a step (the draft_next rows; the draft rows without them) ---
    def next_draft_forward(self, ctx: np.ndarray, q: np.ndarray | None = None) -> tuple[float, float]:
        """draft_forward for a draft forward that follows another one of the same step (positions >= 1)."""
        if not self.has_draft_next:
            return self.draft_forward(ctx, q)
        t, pairs, c = _sums(ctx, q)
        flops = self._df[0] * t + self._df[1] * pairs
        return self._time("draft_next", t, flops, c, ctx.shape[0]), flops

    def next_draft_positions(self, ctx: np.ndarray, depths: np.ndarray) -> tuple[float, float]:
        """draft_positions for draft forwards that each follow another one of the same step."""
        return self._positions("draft_next" if self.has_draft_next else "draft", ctx, depths)
