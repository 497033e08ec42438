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


def test_uniform_verify_time_is_verify_time_of_rows_alike(roofline):
    """RooflineCost.uniform_verify_time (the compiled verify's integer sums as products) against verify_time on the
    two np.full arrays, and the base class's form, to the bit (past 2^63 too: both wrap alike)."""
    rng = np.random.default_rng(3)
    cases = [(int(rng.integers(1, 400)), int(rng.integers(0, 300000)), int(rng.integers(0, 40))) for _ in range(3000)]
    cases += [(1, 0, 0), (0, 7, 3), (64, 0, 16), (4099, 131072, 63), (2 ** 20, 2 ** 30, 7), (3, 5, -1), (8, 2 ** 61, 0),
              (3, 2 ** 62 + 5, 2)]
    for n, context, drafts in cases:
        want = float(roofline.verify_time(np.full(n, context, np.int64), np.full(n, drafts, np.int64)))
        assert roofline.uniform_verify_time(n, context, drafts) == want
        assert CostModel.uniform_verify_time(roofline, n, context, drafts) == want


def test_padded_verify_time_is_the_padded_shapes_uniform_verify(roofline):
    """RooflineCost.padded_verify_time (one compiled pass) against the batch's longest context and deepest drafts
    priced by uniform_verify_time, to the bit, and whether any row pads; None for arrays it does not take."""
    rng = np.random.default_rng(4)
    for n in (1, 2, 3, 64, 300):
        for _ in range(40):
            ctx, depths = rng.integers(0, 4000, n), rng.integers(-1, 9, n)
            if rng.random() < 0.3:
                ctx[:] = ctx[0]
            if rng.random() < 0.3:
                depths[:] = depths[0]
            top, k = int(ctx.max()), max(int(depths.max()), 0)
            pads = n > 1 and not (int(ctx.min()) == top and int(depths.min()) == k)
            ro = ctx.view()
            ro.setflags(write=False)
            got = roofline.padded_verify_time(ro, depths)
            assert got == (pads, roofline.uniform_verify_time(n, top, k) if pads else 0.0)
    assert roofline.padded_verify_time(np.arange(3.0), np.zeros(3, np.int64)) is None
    assert roofline.padded_verify_time(np.zeros(0, np.int64), np.zeros(0, np.int64)) is None
    assert roofline.padded_verify_time(np.zeros(3, np.int64), np.zeros(2, np.int64)) is None


def test_roofline_step_parts_are_its_verify_time_and_draft_positions(roofline):
    rng = np.random.default_rng(1)
    for n in (1, 3, 64, 300):
        ctx, depths = rng.integers(0, 4000, n), rng.integers(0, 9, n) * (n != 3)
        parts = roofline.step_parts(ctx, depths)
        assert parts == (roofline.verify_time(ctx, depths), roofline.draft_positions(ctx, depths)[0])
    assert roofline.step_parts(np.arange(3.0), np.zeros(3)) is None   # (other dtypes: the two calls)


def test_row_verify_times_are_the_base_class_verifies(roofline):
    """RooflineCost.row_verify_times (one compiled pass after numpy's sums and dot products) against the base
    class's two verify_time calls, to the bit."""
    rng = np.random.default_rng(2)
    for n in (1, 2, 7, 8, 9, 64, 127, 128, 129, 255, 256, 300, 1000, 4099):
        for context in (0.0, 1.0 / 3.0, float(rng.uniform(0, 1e5)), 1234.5678):
            assert roofline.row_verify_times(context, n) == CostModel.row_verify_times(roofline, context, n)


def test_commit_and_compact_match_numpy():
    from specdepth.engine import engine_rows
    rng = np.random.default_rng(1)
    n, H, Kd, decay = 40, 8, 6, 0.8
    rows = engine_rows(H, capacity=4)   # grows past its capacity
    rows.grow(n)
    rows.request_id[:] = np.arange(n)
    rows.generated[:] = rng.integers(1, 20, n)
    rows.output_len[:] = rng.integers(20, 30, n)
    rows.drafted_total[:] = rng.integers(0, 9, n)
    rows.accepted_total[:] = rng.integers(0, 9, n)
    rows.accepted_w[:] = rng.random(n)
    rows.rejected_w[:] = rng.random(n)
    rows.last_depth[:] = rng.integers(-1, 3, n)
    before = {c: getattr(rows, c).copy() for c in rows.columns}
    drafted = rng.integers(0, Kd + 1, n)
    accepted = np.minimum(rng.integers(0, Kd + 1, n), drafted)
    joint = np.zeros((Kd + 1) ** 2, np.int64)
    out = K.commit(rows.generated, rows.output_len, rows.accepted_w, rows.rejected_w, rows.drafted_total,
                   rows.accepted_total, rows.last_depth, rows.depth_changes, rows.ring_accepted, rows.ring_drafted,
                   3, drafted, accepted, decay, joint, Kd + 1, True)
    # the numpy the engine ran before
    b = before
    clipped = np.minimum(accepted + 1, b["output_len"] - b["generated"])
    gen = b["generated"] + clipped
    scale = np.where(drafted > 0, decay, 1.0)
    assert np.array_equal(rows.generated, gen)
    assert np.array_equal(rows.accepted_w, b["accepted_w"] * scale + accepted)
    assert np.array_equal(rows.rejected_w, b["rejected_w"] * scale + (accepted < drafted))
    assert np.array_equal(rows.drafted_total, b["drafted_total"] + drafted)
    assert np.array_equal(rows.accepted_total, b["accepted_total"] + accepted)
    changed = (b["last_depth"] >= 0) & (b["last_depth"] != drafted)
    assert np.array_equal(rows.depth_changes, changed.astype(np.int64)) and np.array_equal(rows.last_depth, drafted)
    assert np.array_equal(joint, np.bincount(drafted * (Kd + 1) + accepted, minlength=joint.size))
    assert np.array_equal(rows.ring_accepted[:, 3], accepted) and np.array_equal(rows.ring_drafted[:, 3], drafted)
    assert out == (int(accepted.sum()), int(drafted.sum()), int(clipped.sum()), int((gen >= b["output_len"]).sum()))
    after = {c: getattr(rows, c).copy() for c in rows.columns}
    keep = rng.random(n) < 0.6
    left = []
    rows.on_retire(lambda k: left.append(rows.request_id[~k].tolist()))
    rows.keep(keep)
    assert rows.n == keep.sum() and left == [np.flatnonzero(~keep).tolist()]   # the hook saw the rows leave
    for c in rows.columns:
        assert np.array_equal(getattr(rows, c), after[c][keep]), c


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


def test_row_table_columns_are_built_once_and_read_by_name_before_and_after_rows_exist():
    """Columns declared on an empty table read as empty views at first use; a column added after such a
    read still gets its fill; rows appended read their fills; retirement keeps order; gather reads tuples."""
    from specdepth.rows import RowTable
    rows = RowTable(capacity=2)
    rows.add("a", np.int64, fill=-1)
    rows.add("x", np.float64, fill=0.5)
    assert rows.a.shape == (0,) and rows.x.dtype == np.float64      # built on first read
    rows.add("b", np.int64, fill=7)
    rows.add("ring", np.int64, fill=-1, width=3)
    new = rows.grow(3)                                                 # past the capacity of 2: resized
    assert rows.a.tolist() == [-1, -1, -1] and rows.b.tolist() == [7, 7, 7] and rows.x.tolist() == [0.5] * 3
    assert rows.ring.shape == (3, 3) and (rows.ring == -1).all()
    rows.a[new] = [10, 11, 12]
    rows.keep(np.array([True, False, True]))
    assert rows.a.tolist() == [10, 12]
    assert rows.gather(np.array([1, 0]), ("b", "x", "a")) == [(7, 0.5, 12), (7, 0.5, 10)]
    with pytest.raises(AttributeError, match="nope"):
        rows.nope
    with pytest.raises(ValueError, match="before any row"):
        rows.add("late")


def test_row_table_views_reused_per_row_count_follow_the_storage():
    """The views of a row count are built once and reused: after the rows change (retire, grow back to the
    same count) and after the storage moves (a resize), every column reads the table's current values."""
    from specdepth.rows import RowTable
    rows = RowTable(capacity=4)
    rows.add("a", np.int64)
    rows.add("x", np.float64, fill=1.5)
    rows.add("ring", np.int64, fill=-1, width=2)
    rows.grow(3)
    rows.a[:] = [1, 2, 3]
    rows.ring[:, 0] = [4, 5, 6]
    rows.keep(np.array([False, True, True]))
    rows.grow(1)                                      # back to 3 rows: the cached views of n = 3
    assert rows.a.tolist() == [2, 3, 0] and rows.x.tolist() == [1.5] * 3
    assert rows.ring[:, 0].tolist() == [5, 6, -1]
    rows.a[2] = 9                                      # a write through a reused view reaches the storage
    assert rows.gather(np.array([2]), ("a", "x")) == [(9, 1.5)]
    rows.grow(3)                                      # past the capacity: the storage moves
    rows.a[5] = 8
    rows.keep(np.array([True, True, True, False, False, True]))
    assert rows.a.tolist() == [2, 3, 9, 8] and rows.ring[:, 0].tolist() == [5, 6, -1, -1]
