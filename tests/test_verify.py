"""verify.greedy and verify.rejection called directly: the accepted prefix and the emitted token by hand and
against a reference loop, and the rejection rule's output distributed as the target's own samples
(chi-square tests on 40,000 rows of one batch; fixed seeds, so a run is deterministic)."""
from __future__ import annotations

import numpy as np
import pytest

from specdepth import verify

torch = pytest.importorskip("torch")
chisquare = pytest.importorskip("scipy.stats").chisquare


# ---- greedy --------------------------------------------------------------------------------------
def test_greedy_by_hand():
    drafts = np.array([[5, 6, 7], [5, 9, 7], [1, 2, 3], [4, 4, 4]])
    drafted = np.array([3, 3, 0, 1])
    target = np.array([[5, 6, 7, 8], [5, 6, 7, 8], [9, 2, 3, 4], [4, 4, 4, 4]])
    a, tok = verify.greedy(drafts, drafted, target)
    # all three accepted + the bonus; a mismatch at position 1 + its correction; nothing drafted; only the
    # real draft of a row counts, however its padding matches
    assert a.tolist() == [3, 1, 0, 1] and tok.tolist() == [8, 6, 9, 4]
    a, tok = verify.greedy(np.zeros((2, 0), np.int64), np.zeros(2, np.int64), np.array([[3], [7]]))
    assert a.tolist() == [0, 0] and tok.tolist() == [3, 7]


def test_greedy_matches_a_reference_loop():
    rng = np.random.default_rng(7)
    for _ in range(200):
        n, K = int(rng.integers(1, 6)), int(rng.integers(0, 6))
        target = rng.integers(0, 3, (n, K + 1))
        drafts = np.where(rng.random((n, K)) < 0.7, target[:, :K], rng.integers(0, 3, (n, K)))
        drafted = rng.integers(0, K + 1, n)
        a, tok = verify.greedy(drafts, drafted, target)
        for i in range(n):
            j = 0
            while j < drafted[i] and drafts[i, j] == target[i, j]:
                j += 1
            assert (a[i], tok[i]) == (j, target[i, j])


# ---- rejection sampling ------------------------------------------------------------------------------
V, ROWS = 6, 40_000


def _chains(seed: int):
    """A target and a draft as Markov chains over V tokens (row x: the distribution after token x), the draft
    off the target, and ROWS rows that each drafted 2 tokens from the draft chain after token 0."""
    g = np.random.default_rng(seed)
    T = g.dirichlet(np.ones(V), V)
    Q = 0.5 * T + 0.5 * g.dirichlet(np.ones(V), V)
    gen = torch.Generator().manual_seed(seed)
    x0 = torch.multinomial(torch.tensor(Q[0]).expand(ROWS, V), 1, generator=gen).squeeze(1)
    x1 = torch.multinomial(torch.tensor(Q)[x0], 1, generator=gen).squeeze(1)
    Tt, Qt = torch.tensor(T), torch.tensor(Q)
    p = torch.stack([Tt[0].expand(ROWS, V), Tt[x0], Tt[x1]], dim=1)   # after token 0, x0, x1
    q = torch.stack([Qt[0].expand(ROWS, V), Qt[x0]], dim=1)
    return T, Q, p, q, torch.stack([x0, x1], dim=1), gen


def _outputs(a, tok, drafts):
    """Each row's emitted tokens: its accepted drafts, then the token after them."""
    a, tok, d = a.numpy(), tok.numpy(), drafts.numpy()
    return [list(d[i, :a[i]]) + [int(tok[i])] for i in range(a.shape[0])]


def _fits(counts: np.ndarray, probs: np.ndarray) -> float:
    return chisquare(counts, counts.sum() * probs).pvalue


def test_rejection_output_is_distributed_as_the_target():
    T, Q, p, q, drafts, gen = _chains(3)
    a, tok = verify.rejection(p, q, drafts, np.full(ROWS, 2), gen)
    out = _outputs(a, tok, drafts)
    first = np.bincount([o[0] for o in out], minlength=V)
    assert _fits(first, T[0]) > 1e-3
    assert _fits(first, Q[0]) < 1e-6   # the test tells the draft's distribution from the target's
    # the second token, where a row emitted one: after its first token x, distributed as T[x]
    x = int(np.argmax(first))
    second = np.bincount([o[1] for o in out if len(o) > 1 and o[0] == x], minlength=V)
    assert second.sum() > 2000 and _fits(second, T[x]) > 1e-3
    # the first draft is accepted with probability sum_x min(p(x), q(x))
    rate, want = float((a >= 1).double().mean()), float(np.minimum(T[0], Q[0]).sum())
    assert abs(rate - want) < 5 * np.sqrt(want * (1 - want) / ROWS)


def test_rejection_keeps_to_each_rows_drafts():
    T, Q, p, q, drafts, gen = _chains(5)
    drafted = np.arange(ROWS) % 3   # 0, 1 or 2 real drafts
    a, tok = verify.rejection(p, q, drafts, drafted, gen)
    assert (a.numpy() <= drafted).all()
    none = drafted == 0   # no draft: the emitted token is the target's sample after token 0
    assert _fits(np.bincount(tok.numpy()[none], minlength=V), T[0]) > 1e-3


def test_rejection_accepts_every_draft_of_the_target_itself():
    T, _, p, _, drafts, gen = _chains(11)
    a, tok = verify.rejection(p, p[:, :2], drafts, np.full(ROWS, 2), gen)
    assert (a == 2).all()
    x1 = drafts[:, 1].numpy()   # the bonus token: from the target after the last draft
    pick = x1 == 0
    assert _fits(np.bincount(tok.numpy()[pick], minlength=V), T[0]) > 1e-3
