"""Accept/reject outcomes drawn from an acceptance model, for any executor: the simulator always, and the real
backend in timing mode (`backend=hf backend.acceptance=simulated`).

`SimulatedOutcomes` wraps the run's acceptance model (acceptance.py) the way the simulator drives it: the
model is reset from the run's seed (one stream, so the same seed gives the same outcomes on every backend),
keeps its per-row state in the run's RowTable, and before the first draft position of a step yields a
(rows x k) block of (confidence, accepted) outcomes; verification then accepts each row's leading run of
accepted outcomes, at most its drafts, and the model advances by what was emitted. The parametric models key
the outcomes by (request id, output position), so a timing-mode run of backend=hf and a backend=sim run with
the same seed, workload and acceptance model face the same accept/reject field: with a policy that decides
the same way on both, their tokens per step and step counts are identical.

Timing mode (the real backend): the target and draft models, their KV caches, the batched forwards and the
wall clock are real; only the decision of how many drafts to keep comes from here (see hf.py). The committed
tokens are the drafted tokens of the accepted run plus the target's own token at the next position, so the
caches and lengths evolve as in a real run with that acceptance. The confidences policies see are this
block's (the acceptance model's, as in the simulator), consistent with the outcomes they predict; the draft's
own probabilities are computed (their cost is real) but not shown.
"""
from __future__ import annotations

import numpy as np

from . import _kernels as _k
from . import protocols
from .acceptance import AcceptanceModel
from .errors import ConfigError, as_choice
from .tree_acceptance import TreeAcceptance

#: the acceptance model's stream within a run's seed (the simulator's, kept for identical outcomes)
STREAM = 0x51D


class SimulatedOutcomes:
    def __init__(self, model: AcceptanceModel, seed: int = 0):
        self.model = model = protocols.checked_acceptance(model)
        model.reset(np.random.default_rng(np.random.SeedSequence([int(seed), STREAM])))
        # tree plans: the model's per-rank table (None: chain plans only), walked with the model's own key
        table = getattr(model, "rank_table", lambda: None)()
        self.table = None if table is None else np.asarray(table, np.float64)
        self.tree = None
        if self.table is not None:
            self.tree = TreeAcceptance(self.table)
            self.tree.key = model.key
        self.conf = self.acc = None      # this step's (confidence, accepted) block, [rows, k]
        self.rows = None
        self.k, self.lazy = 0, False     # this step's deepest plan; drawing (row, position) by position

    def attach(self, rows) -> None:
        self.model.attach(rows)
        self.rows = rows

    def admit(self, request_ids, new: slice) -> None:
        self.model.admit(np.asarray(request_ids, np.int64).reshape(-1), new)

    def sample(self, k: int) -> None:
        self.conf, self.acc = self.model.sample(self.rows.n, k)

    def peek(self, k: int) -> np.ndarray:
        """How many of the next k positions each row will have accepted (oracle policies)."""
        self.sample(k)
        return _k.leading_runs(self.acc)

    def peek_prob(self, k: int) -> np.ndarray:
        """The true acceptance probability of each of the next k draft tokens (oracle_expected)."""
        self.sample(k)
        return self.model.probability(self.conf)

    def peek_expected_prob(self, k: int) -> np.ndarray:
        """Each row's acceptance probability at its next k draft positions before the draft proposes them
        (oracle_causal): `model.expected_probability`."""
        return self.model.expected_probability(k)

    def begin_step(self, kmax: int) -> None:
        """Outcomes are drawn when first needed: while drafting position by position, each drafted (row,
        position) alone (models that offer `draw`); drafting in one block, at `decide`, each row only up to
        its first rejection (models that offer `leading`); else the whole block. An oracle's peek draws the
        block before the plan (drawn again here if the plan is deeper)."""
        self.k, self.lazy = kmax, False
        if self.acc is not None and self.acc.shape[1] < kmax:
            self.sample(kmax)

    def confidence(self, rows: np.ndarray, position: int) -> np.ndarray:
        if self.acc is None:
            n = self.rows.n
            self.conf, self.acc = np.empty((n, self.k)), np.empty((n, self.k), np.bool_)
            self.lazy = self.model.draw(rows[:0], 0, self.conf, self.acc)
            if not self.lazy:
                self.sample(self.k)
        if self.lazy:
            self.model.draw(rows, position, self.conf, self.acc)
        return self.conf[rows, position]

    def decide(self, drafted: np.ndarray, ctx: np.ndarray | None = None) -> np.ndarray:
        """Accepted drafts per row (the leading accepted run, at most drafted[i]); the model advances by
        those plus the bonus/correction token. ctx, when given, advances by the same."""
        if not self.k:   # nothing drafted this step (drafted is all zeros): one token each
            accepted = drafted
        elif self.acc is None and (accepted := self.model.leading(drafted)) is not None:
            pass
        else:
            if self.acc is None:
                self.sample(self.k)
            accepted = _k.leading_run(self.acc, drafted)
        self.commit(drafted, accepted, ctx)
        return accepted

    def commit(self, drafted: np.ndarray, accepted: np.ndarray, ctx: np.ndarray | None = None) -> None:
        """The step's outcome decided: the block is spent, ctx (where given) advances, the model records it."""
        self.conf = self.acc = None
        if ctx is not None:
            _k.advance(ctx, accepted)   # ctx += accepted + 1
        self.model.commit(drafted, accepted)


def timing_outcomes(mode, model: AcceptanceModel | None, seed: int) -> SimulatedOutcomes | None:
    """backend.acceptance of a real backend: "model" (lossless verification, None) or "simulated" (timing
    mode: the outcomes of the run's acceptance model)."""
    mode = as_choice(mode, "backend.acceptance", ("model", "simulated"))
    if mode == "model":
        return None
    if model is None:
        raise ConfigError("backend.acceptance=simulated needs the run's acceptance model (acceptance=iid, beta, "
                          "confidence or trace)")
    return SimulatedOutcomes(model, seed)
