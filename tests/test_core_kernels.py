"""The compiled inner loops (src/specdepth/_kernels.py) against the plain numpy they replace."""
import numpy as np
import pytest

from sdtest import engine
from specdepth import _kernels as K
from specdepth.cost import CostModel


@pytest.fixture(scope="module")
def roofline():
    return engine("cost=roofline", "hardware=h100_sxm").cost


def test_ragged_sums_and_draft_positions_match_numpy(roofline):
    rng = np.random.default_rng(0)
    for n in (1, 3, 64, 300):
        ctx = rng.integers(0, 4000, n)
        q = rng.integers(1, 9, n)
        t, pairs, c = K.ragged_sums(ctx, q)
        assert (t, c) == (float(q.sum()), float(ctx.sum()))
        assert pairs == float(np.dot(q, ctx)) + float(np.dot(q, q + 1)) * 0.5
        depths = rng.integers(0, 9, n)
        fast = roofline.draft_positions(ctx, depths)
        base = CostModel.draft_positions(roofline, ctx, depths)           # the generic loop
        loop = [roofline.draft_forward(ctx[depths > p] + p) for p in range(int(depths.max()))]
        assert fast == pytest.approx(base, rel=1e-12)
        assert fast == pytest.approx((sum(x[0] for x in loop), sum(x[1] for x in loop)), rel=1e-12)
    assert roofline.draft_positions(np.array([5, 6]), np.zeros(2, np.int64)) == (0.0, 0.0)


def test_commit_and_compact_match_numpy():
    rng = np.random.default_rng(1)
    n, H, Kd, decay = 40, 8, 6, 0.8
    I = np.column_stack([np.arange(n), rng.integers(1, 50, n), rng.integers(1, 20, n), rng.integers(20, 30, n),
                         np.zeros(n, int), rng.integers(0, 9, n), rng.integers(0, 9, n)]).astype(np.int64)
    F = rng.random((n, 4))
    hacc, hdr = np.full((n, H), -1, np.int64), np.full((n, H), -1, np.int64)
    drafted = rng.integers(0, Kd + 1, n)
    accepted = np.minimum(rng.integers(0, Kd + 1, n), drafted)
    joint = np.zeros((Kd + 1) ** 2, np.int64)
    I2, F2, ha2, hd2, j2 = I.copy(), F.copy(), hacc.copy(), hdr.copy(), joint.copy()
    out = K.commit(I2, F2, ha2, hd2, 3, drafted, accepted, decay, j2, Kd + 1, True)
    # the numpy the engine ran before
    clipped = np.minimum(accepted + 1, I[:, 3] - I[:, 2])
    I[:, 2] += clipped
    F[:, 2:4] *= np.where(drafted > 0, decay, 1.0)[:, None]
    F[:, 2] += accepted
    F[:, 3] += accepted < drafted
    I[:, 5] += drafted
    I[:, 6] += accepted
    joint += np.bincount(drafted * (Kd + 1) + accepted, minlength=joint.size)
    hacc[:, 3], hdr[:, 3] = accepted, drafted
    assert out == (int(accepted.sum()), int(drafted.sum()), int(clipped.sum()), int((I[:, 2] >= I[:, 3]).sum()))
    assert np.array_equal(I2, I) and np.array_equal(F2, F) and np.array_equal(j2, joint)
    assert np.array_equal(ha2, hacc) and np.array_equal(hd2, hdr)
    keep = rng.random(n) < 0.6
    m = K.compact(keep, I2, F2, ha2, hd2)
    assert m == keep.sum()
    assert np.array_equal(I2[:m], I[keep]) and np.array_equal(F2[:m], F[keep]) and np.array_equal(ha2[:m], hacc[keep])


def test_keyed_draws_are_uniform_and_normal():
    """The counter-based hash behind the acceptance field: uniform u, standard normal z (via the
    confidence model with level 0 and spread 1: logit(conf) = z)."""
    from scipy import stats
    ids = np.arange(2000, dtype=np.int64)
    conf, acc = K.keyed_block(12345, ids, np.zeros(2000, np.int64), 16, np.zeros(2000), True, 1.0, 1.0)
    z = np.log(conf / (1 - conf)).ravel()
    assert stats.kstest(z, "norm").pvalue > 0.01
    _, acc = K.keyed_block(12345, ids, np.zeros(2000, np.int64), 16, np.full(2000, 0.3), False, 0.0, 1.0)
    assert acc.mean() == pytest.approx(0.3, abs=0.01)
    assert abs(np.corrcoef(acc[:, :-1].ravel(), acc[:, 1:].ravel())[0, 1]) < 0.02   # positions independent
    b = K.keyed_beta(7, ids, 2.0, 3.0)
    assert stats.kstest(b, stats.beta(2.0, 3.0).cdf).pvalue > 0.01
