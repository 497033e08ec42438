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
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from . import _kernels as _k
from .errors import ConfigError, as_float, as_prob


def _ids(request_ids, first: int) -> np.ndarray:
    """Request ids of newly admitted rows: an array, or a count (ids first, first + 1, ...)."""
    if isinstance(request_ids, (int, np.integer)):
        return np.arange(first, first + int(request_ids), dtype=np.int64)
    return np.asarray(request_ids, dtype=np.int64).reshape(-1)


class AcceptanceModel:
    """Base class. Stateful per run: rows are appended on admission and compacted on retirement."""

    def reset(self, rng: np.random.Generator) -> None:
        self.rng = rng

    def admit(self, request_ids) -> None:
        """New rows at the end, one per request id (an int n means n rows)."""

    def retire(self, keep: np.ndarray) -> None:
        pass

    def sample(self, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(confidence float[n, k], accepted bool[n, k]) for the next k draft positions of every row."""
        raise NotImplementedError

    def commit(self, drafted: np.ndarray, accepted: np.ndarray) -> None:
        """After every verify (also one without drafts): row i had drafted[i] drafts verified, accepted[i]
        of them, and emitted accepted[i] + 1 tokens."""

    def probability(self, conf: np.ndarray) -> np.ndarray:
        """The true acceptance probability of each token of the block `sample` returned with confidences
        `conf` (what the `oracle_expected` policy knows; its outcome stays unknown)."""
        raise ConfigError(f"acceptance model {type(self).__name__} has no per-token acceptance probability "
                          "(oracle_expected needs acceptance=iid, beta, confidence or decay)")


class Keyed(AcceptanceModel):
    """Base of the parametric models: outcomes keyed by (request id, output position); per row a level,
    `row_level` (iid and beta: the acceptance probability; confidence: the logit location)."""

    logit_normal = False
    spread = 0.0
    calibration = 1.0
    decay = 1.0

    def reset(self, rng):
        super().reset(rng)
        self.key = int(rng.integers(0, 1 << 63))
        self.ids = np.empty(0, np.int64)
        self.pos = np.empty(0, np.int64)     # the output position of each row's next token
        self.row_level = np.empty(0)
        self._next = 0

    def levels(self, ids: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def admit(self, request_ids):
        ids = _ids(request_ids, self._next)
        self._next += ids.size
        self.ids = np.concatenate([self.ids, ids])
        self.pos = np.concatenate([self.pos, np.zeros(ids.size, np.int64)])
        self.row_level = np.concatenate([self.row_level, self.levels(ids)])

    def retire(self, keep):
        self.ids, self.pos, self.row_level = self.ids[keep], self.pos[keep], self.row_level[keep]

    def sample(self, n, k):
        return _k.keyed_block(self.key, self.ids, self.pos, k, self.row_level, self.logit_normal, self.spread,
                              self.calibration, self.decay)

    def commit(self, drafted, accepted):
        self.pos += accepted + 1

    def probability(self, conf):
        return conf if self.calibration == 1.0 else conf ** self.calibration


class IID(Keyed):
    """Every draft token accepted independently with probability `alpha` (Leviathan et al.).

    The confidence carries no signal: it equals `alpha` for every token.
    """

    def __init__(self, alpha: float = 0.8):
        self.alpha = as_prob(alpha, "acceptance.alpha")

    def levels(self, ids):
        return np.full(ids.size, self.alpha)


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
        x, w = np.polynomial.hermite.hermgauss(48)
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

    def __init__(self, path: str):
        self.path = Path(str(path))
        if not self.path.is_file():
            raise ConfigError(f"acceptance.path: trace file not found: {self.path}")
        confs, accs, tails = [], [], []
        total = 0   # tokens in the streams read so far (global index of the next stream's first token)
        with self.path.open() as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                    c = np.asarray(rec["confidence"], dtype=float)
                    a = np.asarray(rec["accepted"], dtype=float)
                except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
                    raise ConfigError(f"{self.path}:{lineno}: not a trace record "
                                      f"({{'confidence': [...], 'accepted': [...]}}): {e}") from None
                if c.shape != a.shape or c.ndim != 1:
                    raise ConfigError(f"{self.path}:{lineno}: 'confidence' and 'accepted' must be lists of equal length")
                if len(c) == 0:
                    continue
                if not (np.all((c >= 0) & (c <= 1)) and np.all((a == 0) | (a == 1))):
                    raise ConfigError(f"{self.path}:{lineno}: confidences must be in [0, 1] and accepted 0 or 1")
                try:
                    unv = [(int(j), np.asarray(v, dtype=float)) for j, v in rec.get("unverified") or []]
                except (TypeError, ValueError) as e:
                    raise ConfigError(f"{self.path}:{lineno}: 'unverified' must be [[index, [confidences]], ...]: "
                                      f"{e}") from None
                for j, v in unv:
                    if not (0 <= j < len(c) and not a[j] and v.ndim == 1 and np.all((v >= 0) & (v <= 1))):
                        raise ConfigError(f"{self.path}:{lineno}: 'unverified' entry {j}: index of a rejected "
                                          f"token and confidences in [0, 1] expected")
                    tails.append((total + j, v))
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

    def reset(self, rng):
        super().reset(rng)
        self.stream = np.empty(0, dtype=np.int64)
        self.pos = np.empty(0, dtype=np.int64)
        self._next = 0

    def admit(self, request_ids):
        n = _ids(request_ids, 0).size
        s = (self._next + np.arange(n)) % len(self.lengths)
        self._next += n
        self.stream = np.concatenate([self.stream, s])
        self.pos = np.concatenate([self.pos, np.zeros(n, dtype=np.int64)])

    def retire(self, keep):
        self.stream, self.pos = self.stream[keep], self.pos[keep]

    def sample(self, n, k):
        lens = self.lengths[self.stream][:, None]
        idx = self.offsets[self.stream][:, None] + (self.pos[:, None] + np.arange(k)) % lens
        conf, acc = self.conf[idx], self.acc[idx]
        if self.tail is not None and k > 1:
            run = _k.leading_run(acc)
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
        self.pos += np.minimum(drafted, accepted + 1)
