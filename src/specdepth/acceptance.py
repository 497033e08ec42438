"""Acceptance models for the simulator: per draft token, a confidence and whether the target accepts it.

Each step the simulator asks for a (rows x K) block of outcomes before drafting (`sample`), so the
outcome of position j does not depend on the depth a policy picks, and the oracle can look ahead.
`commit` tells the model what was verified and emitted.

The parametric models (iid, beta, confidence) key every outcome by (request id, output position): the
draft token proposed for output position m of request r has one confidence and one accept/reject outcome
for the whole run, whichever step drafts it and however deep. That is the structure of greedy speculative
decoding (the prefix before position m is the target's own output, so the draft's proposal for m and its
fate are fixed), and it gives every policy the same acceptance field (common random numbers): policies
compared on one seed differ by their decisions, not by their luck. The draws come from a counter-based
hash of (run seed, request, position), so they cost no state and do not depend on the admission order.

Confidence is what a real draft reports: its probability of the token it proposed.

Tree plans (specdepth.tree) need a per-rank table (`rank_table`: the probability that the target's token is
the draft's rank-r candidate; tree_acceptance.py): `ranked` has one, `iid` the geometric rank_table(alpha);
the other models have none and the simulator refuses tree plans under them.
"""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from . import _kernels as _k
from . import inputs
from .errors import ConfigError, as_float, as_int, as_prob
from .rows import RowTable


@functools.lru_cache(maxsize=1)
def _hermite() -> tuple[np.ndarray, np.ndarray]:
    """Gauss-Hermite nodes and weights (48) for expectations over a normal draw."""
    return np.polynomial.hermite.hermgauss(48)


def _ids(request_ids, first: int) -> np.ndarray:
    """Request ids of newly admitted rows: an array, or a count (ids first, first + 1, ...)."""
    if isinstance(request_ids, (int, np.integer)):
        return np.arange(first, first + int(request_ids), dtype=np.int64)
    return np.asarray(request_ids, dtype=np.int64).reshape(-1)


class AcceptanceModel:
    """Base class. Per-row state lives in columns of a RowTable (rows.py): the run's table once the
    simulator attaches the model (`attach`), so rows follow the engine's admission and retirement with no
    call of their own; a private table of its own when the model is used alone (then `admit` appends rows
    and `retire` drops them)."""

    COLUMNS: tuple = ()   # (name, dtype) of the per-row columns

    def reset(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self._use(RowTable(), own=True)

    def attach(self, rows: RowTable) -> None:
        """Keep per-row state in the run's table from now on (before any row is admitted)."""
        self._use(rows, own=False)

    def _use(self, rows: RowTable, own: bool) -> None:
        for name, dtype in self.COLUMNS:
            rows.add(name, dtype)
        self.rows, self._own = rows, own

    def _new_rows(self, m: int, new: slice | None) -> slice:
        if new is None:
            if not self._own:
                raise ValueError("admit(..., new=rows) is required once the model shares the run's RowTable")
            return self.rows.grow(m)
        return new

    def admit(self, request_ids, new: slice | None = None) -> None:
        """Fill the rows `new` (the table's newest rows), one per request id (an int n means n rows);
        standalone (new=None), append them first."""

    def retire(self, keep: np.ndarray) -> None:
        """Standalone use only: drop the rows where keep is False (the run's table retires by itself)."""
        if self._own:
            self.rows.keep(keep)

    def sample(self, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(confidence float[n, k], accepted bool[n, k]) for the next k draft positions of every row."""
        raise NotImplementedError

    def leading(self, drafted: np.ndarray) -> np.ndarray | None:
        """Optional shortcut when nobody looks at confidences: per row, how many of its drafted[i] next
        drafts are accepted (the leading run of `sample`'s outcomes). None: not offered (use sample)."""
        return None

    def draw(self, rows: np.ndarray, offset: int, conf: np.ndarray, acc: np.ndarray) -> bool:
        """Optional: fill conf[rows, offset] and acc[rows, offset] with `sample`'s outcomes at draft position
        `offset` of those rows only (a step's drafting reaches few positions of most rows). False: not
        offered (use sample)."""
        return False

    def commit(self, drafted: np.ndarray, accepted: np.ndarray) -> None:
        """After every verify (also one without drafts): row i had drafted[i] drafts verified, accepted[i]
        of them, and emitted accepted[i] + 1 tokens."""

    def rank_table(self) -> np.ndarray | None:
        """The per-rank acceptance table tree plans are accepted by (tree_acceptance.TreeAcceptance, keyed by
        (request, output position) with this model's key), float [R]; None: this model runs chain plans only."""
        return None

    def probability(self, conf: np.ndarray) -> np.ndarray:
        """The true acceptance probability of each token of the block `sample` returned with confidences
        `conf` (what the `oracle_expected` policy knows; its outcome stays unknown)."""
        raise ConfigError(f"acceptance model {type(self).__name__} has no per-token acceptance probability "
                          "(oracle_expected needs acceptance=iid, beta, confidence or decay)")

    def expected_probability(self, k: int) -> np.ndarray:
        """Each row's acceptance probability at each of its next k draft positions as known before the draft
        proposes them: averaged over the confidences the draft may report there (what `oracle_causal` knows;
        float [rows, k]). Equal to `probability` of the block where a token's probability does not depend on
        its own draw (iid, beta, decay)."""
        raise ConfigError(f"acceptance model {type(self).__name__} has no per-token acceptance probability "
                          "(oracle_causal needs acceptance=iid, beta, confidence or decay)")


class Keyed(AcceptanceModel):
    """Base of the parametric models: outcomes keyed by (request id, output position); per row a level,
    `row_level` (iid and beta: the acceptance probability; confidence: the logit location)."""

    logit_normal = False
    spread = 0.0
    calibration = 1.0
    decay = 1.0
    COLUMNS = (("acc_request", np.int64), ("acc_pos", np.int64), ("acc_level", np.float64))

    def reset(self, rng):
        super().reset(rng)
        self.key = int(rng.integers(0, 1 << 63))
        self._next = 0

    def levels(self, ids: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    ids = property(lambda self: self.rows.acc_request)
    pos = property(lambda self: self.rows.acc_pos, doc="the output position of each row's next token")
    row_level = property(lambda self: self.rows.acc_level)

    def admit(self, request_ids, new=None):
        ids = _ids(request_ids, self._next)
        self._next += ids.size
        new = self._new_rows(ids.size, new)
        r = self.rows
        r.acc_request[new] = ids
        r.acc_level[new] = self.levels(ids)

    def sample(self, n, k):
        r = self.rows
        return _k.keyed_block(self.key, r.acc_request, r.acc_pos, k, r.acc_level, self.logit_normal, self.spread,
                              self.calibration, self.decay)

    def draw(self, rows, offset, conf, acc):
        r = self.rows
        _k.keyed_at(self.key, r.acc_request, r.acc_pos, rows, offset, r.acc_level, self.logit_normal, self.spread,
                    self.calibration, self.decay, conf, acc)
        return True

    def leading(self, drafted):
        r = self.rows
        return _k.keyed_leading(self.key, r.acc_request, r.acc_pos, drafted, r.acc_level, self.logit_normal,
                                self.spread, self.calibration, self.decay)

    def commit(self, drafted, accepted):
        _k.advance(self.rows.acc_pos, accepted)   # pos += accepted + 1

    def probability(self, conf):
        return conf if self.calibration == 1.0 else conf ** self.calibration

    def expected_probability(self, k):
        level = self.row_level
        if not self.logit_normal:   # level x decay ** j, the same products as the block's
            f = np.empty((level.size, k))
            f[:, :1] = level[:, None]
            f[:, 1:] = self.decay
            return np.cumprod(f, axis=1)
        # E[sigmoid(level + spread z) ** calibration], z ~ N(0, 1), by Gauss-Hermite quadrature
        x, w = _hermite()
        c = 1.0 / (1.0 + np.exp(-(level[:, None] + np.sqrt(2.0) * self.spread * x[None, :])))
        e = (c if self.calibration == 1.0 else c ** self.calibration) @ (w / np.sqrt(np.pi))
        return np.repeat(e[:, None], k, axis=1)


class IID(Keyed):
    """Every draft token accepted independently with probability `alpha` (Leviathan et al.).

    The confidence carries no signal: it equals `alpha` for every token.
    """

    def __init__(self, alpha: float = 0.8):
        self.alpha = as_prob(alpha, "acceptance.alpha")

    def levels(self, ids):
        return np.full(ids.size, self.alpha)

    def rank_table(self):
        """The geometric table tree_acceptance.rank_table(alpha): rank 0 accepted with alpha, as a chain's draft."""
        from .tree_acceptance import rank_table
        return rank_table(self.alpha)


class Ranked(Keyed):
    """Per-rank acceptance for draft trees: at every (request, output position) the target's token is the
    draft's rank-r candidate with probability table[r] (tree_acceptance.py), independently across positions;
    `table` as given, or the geometric alpha x decay ** r for r < ranks (decay null: 1 - alpha).

    A chain plan drafts the rank-0 candidates: it runs exactly as acceptance=iid with alpha = table[0] (the
    same keyed uniforms, the same outcomes); its confidence is table[0]. A tree node's confidence is the table
    entry of its rank (sim.SimExecutor.draft_tree).
    """

    def __init__(self, table=None, alpha: float = 0.8, decay: float | None = None, ranks: int = 8):
        from .tree_acceptance import check_table, rank_table
        if table is not None:
            try:
                self.table = check_table(list(table))
            except (TypeError, ValueError) as e:
                raise ConfigError(f"acceptance.table: {e}") from None
        else:
            a = as_prob(alpha, "acceptance.alpha")
            d = None if decay is None else as_float(decay, "acceptance.decay", min=0, max=1)
            n = as_int(ranks, "acceptance.ranks", min=1, max=4096)
            self.table = rank_table(a, d, n)
        self.table.flags.writeable = False
        self.alpha = float(self.table[0])   # a chain's acceptance probability

    def levels(self, ids):
        return np.full(ids.size, self.alpha)

    def rank_table(self):
        return self.table


class Beta(Keyed):
    """Per sequence alpha_i ~ Beta(mean x concentration, (1 - mean) x concentration), i.i.d. within it.

    Some prompts are easy, some hard. The confidence equals the sequence's alpha_i (a per-sequence
    signal, no per-token signal).
    """

    def __init__(self, mean: float = 0.7, concentration: float = 10.0):
        self.mean = as_float(mean, "acceptance.mean", min=0, max=1, min_open=True)
        if self.mean >= 1:
            raise ConfigError("acceptance.mean must be < 1 for a Beta distribution, got 1.0")
        self.concentration = as_float(concentration, "acceptance.concentration", min=0, min_open=True)

    def levels(self, ids):
        c = self.concentration
        return _k.keyed_beta(self.key, ids, self.mean * c, (1 - self.mean) * c)


class Decay(Keyed):
    """Acceptance that falls with the draft position within a step: the step's first draft is accepted
    with probability `first`, the j-th (0-based) with `first` x `decay` ** j (a draft that conditions on
    its own earlier guesses drifts away from the target, as EAGLE-style and small drafts do).

    The uniforms are keyed by (request, output position) as in the other models (paired across policies),
    but whether a token is accepted also depends on the draft position it was proposed at, i.e. on the
    policy's depths. The confidence equals the token's acceptance probability (a calibrated draft).
    """

    def __init__(self, first: float = 0.9, decay: float = 0.8):
        self.first = as_prob(first, "acceptance.first")
        self.decay = as_float(decay, "acceptance.decay", min=0, max=1)

    def levels(self, ids):
        return np.full(ids.size, self.first)


class Confidence(Keyed):
    """Each draft token gets a confidence c and is accepted with probability c ** calibration.

    logit(c) ~ Normal(mu_i, spread): a logit-normal confidence around a per-sequence level, where mu_i is
    set so that E[c] = m_i, and m_i ~ Beta(mean x seq_concentration, (1 - mean) x seq_concentration)
    (easy and hard prompts; m_i = mean for all when seq_concentration is null).
    calibration = 1 is a perfectly calibrated draft; > 1 over-confident; < 1 under-confident.
    """

    logit_normal = True

    def __init__(self, mean: float = 0.75, spread: float = 2.0, seq_concentration: float | None = 20.0,
                 calibration: float = 1.0):
        self.mean = as_float(mean, "acceptance.mean", min=0, max=1, min_open=True)
        if self.mean >= 1:
            raise ConfigError("acceptance.mean must be < 1, got 1.0")
        self.spread = as_float(spread, "acceptance.spread", min=0)
        self.seq_concentration = (None if seq_concentration is None else
                                  as_float(seq_concentration, "acceptance.seq_concentration", min=0, min_open=True))
        self.calibration = as_float(calibration, "acceptance.calibration", min=0, min_open=True)
        # E[sigmoid(mu + spread * z)] on a grid of mu (Gauss-Hermite), inverted by interpolation
        x, w = _hermite()
        self._mu = np.linspace(-16, 16, 3201)
        self._means = (w / np.sqrt(np.pi)) @ (1 / (1 + np.exp(-(self._mu[None, :] + np.sqrt(2) * self.spread * x[:, None]))))

    def level(self, m: np.ndarray) -> np.ndarray:
        """The logit location mu giving mean confidence m."""
        return np.interp(m, self._means, self._mu)

    def levels(self, ids):
        if self.seq_concentration is None:
            m = np.full(ids.size, self.mean)
        else:
            s = self.seq_concentration
            m = np.clip(_k.keyed_beta(self.key, ids, self.mean * s, (1 - self.mean) * s), 1e-3, 1 - 1e-3)
        return self.level(m)


class Trace(AcceptanceModel):
    """Replays (confidence, accepted) event streams recorded by the real backend.

    File format (JSONL, what `backend=hf` writes as acceptance_trace.jsonl): one line per request,
        {"request_id": 3, "confidence": [0.91, 0.42, ...], "accepted": [1, 0, ...],
         "unverified": [[1, [0.37, 0.30]], ...]}
    the verified draft tokens of that request in order: each accepted token, and the rejected token
    that ended a step. Tokens drafted after a rejection were never verified; optional "unverified" pairs
    [index of the rejected token in the lists, [their confidences]] keep what a policy's keep_drafting saw
    of them, so that a replay shows a policy the same confidences as the recorded run did.
    Row i of the simulation replays stream i mod (number of streams), wrapping around at its end; each
    step consumes the tokens the simulated verify looked at (accepted + 1 on rejection). Within a step,
    positions after the first rejected token read that token's recorded "unverified" confidences where the
    recording has them (their outcomes never matter: verification stops at the first rejection).
    """

    KEYS = ("request_id", "confidence", "accepted", "unverified")

    def __init__(self, path: str):
        self.path = Path(str(path))
        confs, accs, tails = [], [], []
        total = 0   # tokens in the streams read so far (global index of the next stream's first token)
        for where, rec in inputs.records(self.path, "acceptance.path", self.KEYS, "trace"):
            c, a, unv = self._record(where, rec)
            if len(c) == 0:
                continue
            tails += [(total + j, v) for j, v in unv]
            total += len(c)
            confs.append(c)
            accs.append(a.astype(bool))
        if not confs:
            raise ConfigError(f"acceptance.path: {self.path} holds no draft tokens")
        self.lengths = np.array([len(c) for c in confs])
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths)[:-1]])
        self.conf = np.concatenate(confs)
        self.acc = np.concatenate(accs)
        self.mean_acceptance = float(self.acc.mean())
        # the "unverified" tails, sparse: tail_at[e] = global index of a rejected token (sorted), tail[e, t] =
        # confidence of the t-th token drafted after it (NaN past its end)
        width = max((v.size for _, v in tails), default=0)
        self.tail = None
        if width:
            tails.sort(key=lambda gv: gv[0])
            self.tail_at = np.array([g for g, _ in tails], np.int64)
            self.tail = np.full((len(tails), width), np.nan)
            for e, (_, v) in enumerate(tails):
                self.tail[e, :v.size] = v

    @staticmethod
    def _record(where: str, rec: dict):
        """(confidences, accepted, [(index, unverified confidences)]) of one trace line, validated."""
        if "confidence" not in rec or "accepted" not in rec:
            raise ConfigError(f"{where}: not a trace record ({{'confidence': [...], 'accepted': [...]}})")
        c = np.asarray(inputs.number_list(rec["confidence"], where, "confidence"), dtype=float)
        a = np.asarray(inputs.number_list(rec["accepted"], where, "accepted"), dtype=float)
        if c.shape != a.shape:
            raise ConfigError(f"{where}: 'confidence' and 'accepted' must be lists of equal length")
        if not (np.all((c >= 0) & (c <= 1)) and np.all((a == 0) | (a == 1))):
            raise ConfigError(f"{where}: confidences must be in [0, 1] and accepted 0 or 1")
        try:
            unv = [(int(j), np.asarray(v, dtype=float)) for j, v in rec.get("unverified") or []]
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{where}: 'unverified' must be [[index, [confidences]], ...]: {e}") from None
        for j, v in unv:
            if not (0 <= j < len(c) and not a[j] and v.ndim == 1 and np.all((v >= 0) & (v <= 1))):
                raise ConfigError(f"{where}: 'unverified' entry {j}: index of a rejected token and confidences "
                                  f"in [0, 1] expected")
        return c, a, unv

    COLUMNS = (("acc_stream", np.int64), ("acc_pos", np.int64))

    def reset(self, rng):
        super().reset(rng)
        self._next = 0

    stream = property(lambda self: self.rows.acc_stream)
    pos = property(lambda self: self.rows.acc_pos)

    def admit(self, request_ids, new=None):
        n = _ids(request_ids, 0).size
        new = self._new_rows(n, new)
        self.rows.acc_stream[new] = (self._next + np.arange(n)) % len(self.lengths)
        self._next += n

    def sample(self, n, k):
        lens = self.lengths[self.stream][:, None]
        idx = self.offsets[self.stream][:, None] + (self.pos[:, None] + np.arange(k)) % lens
        conf, acc = self.conf[idx], self.acc[idx]
        if self.tail is not None and k > 1:
            run = _k.leading_runs(acc)
            rows = np.flatnonzero(run < k - 1)   # rows with positions after their first rejection
            if rows.size:
                j = run[rows]
                g = idx[rows, j]
                e = np.minimum(np.searchsorted(self.tail_at, g), self.tail_at.size - 1)
                t = np.where((self.tail_at[e] == g)[:, None], self.tail[e], np.nan)   # [m, width]
                cols = j[:, None] + 1 + np.arange(t.shape[1])[None, :]
                ok = (cols < k) & ~np.isnan(t)
                conf[np.broadcast_to(rows[:, None], cols.shape)[ok], cols[ok]] = t[ok]
        return conf, acc

    def commit(self, drafted, accepted):
        self.rows.acc_pos += np.minimum(drafted, accepted + 1)

