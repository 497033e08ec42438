"""Draft trees (tree.py, tree_verify.py, tree_acceptance.py) called directly: shapes and their checks, the
verifier's positions and attention mask against a construction by the definition, greedy verification
against a brute-force enumeration and verify.greedy, SpecInfer's rejection rule distributed as the target's
own samples (chi-square, fixed seeds), and the simulator's per-rank model against its closed form."""
from __future__ import annotations

import numpy as np
import pytest

from specdepth import _kernels, acceptance, tree as T, tree_acceptance as TA, tree_verify as TV, verify

torch = pytest.importorskip("torch")
chisquare = pytest.importorskip("scipy.stats").chisquare


def _random_tree(g: np.random.Generator, max_nodes: int = 12) -> T.Tree:
    n = int(g.integers(0, max_nodes + 1))
    return T.from_parents([int(g.integers(-1, i)) for i in range(n)])


# ---- shapes -----------------------------------------------------------------------------------------
def test_widths_build_the_product_tree():
    t = T.from_widths([3, 2, 1])
    assert (t.nodes, t.max_depth, t.widths()) == (15, 3, [3, 2, 1])
    assert T.widths_nodes([3, 2, 1]) == 15 and T.widths_nodes([]) == 0
    assert t.choices()[:5] == ((0,), (1,), (2,), (0, 0), (0, 1))
    assert np.bincount(t.depth).tolist() == [0, 3, 6, 6]
    assert T.from_widths([2, 2, 0, 0]) == T.from_widths([2, 2])
    assert T.from_widths([]).nodes == 0 and T.from_widths([]).widths() == []


def test_a_chain_is_widths_of_ones():
    for k in range(6):
        c = T.chain(k)
        assert c == T.from_widths([1] * k) and c.is_chain and c.nodes == k == c.max_depth
        assert c.widths() == [1] * k and c.parent.tolist() == list(range(-1, k - 1))
    assert not T.from_widths([2, 1]).is_chain and T.chain(3) != T.chain(2)


def test_eagle_default_tree():
    t = T.EAGLE_TREE
    assert (t.nodes, t.max_depth) == (25, 5)
    assert np.bincount(t.depth).tolist() == [0, 4, 8, 8, 3, 2]
    assert (t.parent == -1).sum() == 4 and t.widths() is None
    assert T.from_choices(t.choices()) == t and set(t.choices()) == set(T.EAGLE_CHOICES)


def test_spellings_convert_and_equality_ignores_node_order():
    g = np.random.default_rng(0)
    for _ in range(100):
        t = _random_tree(g)
        assert T.from_parents(t.parent) == t and T.from_choices(t.choices()) == t
        w = t.widths()
        if w is not None:
            assert T.from_widths(w) == t
    # the same shape numbered depth-first instead of by level
    assert T.from_parents([-1, 0, 0, -1, 3]) == T.from_choices([(0,), (1,), (0, 0), (0, 1), (1, 0)])
    assert T.from_parents([-1, 0, 0, -1, 3]) != T.from_parents([-1, 0, 0, -1, 0])


@pytest.mark.parametrize("widths, match", [
    ([2, -1], "must be >= 0"),
    ([2, 0, 1], "level 1 has width 0 but a later level does not"),
    ([1.5], "must be integers"),
    ("ab", "must be a list of integers"),
    ([4, 4, 4], "84 nodes, more than the cap of 60"),
])
def test_bad_widths(widths, match):
    with pytest.raises(ValueError, match=match):
        T.from_widths(widths, max_nodes=60)


def test_bad_parents_and_choices():
    with pytest.raises(ValueError, match="node 1 has parent 1"):
        T.from_parents([-1, 1])
    with pytest.raises(ValueError, match="node 0 has parent -2"):
        T.from_parents([-2])
    with pytest.raises(ValueError, match="1-D list of integers"):
        T.from_parents([[0]])
    with pytest.raises(ValueError, match="3 nodes, more than the cap of 2"):
        T.from_parents([-1, 0, 1], max_nodes=2)
    with pytest.raises(ValueError, match=r"\[1, 0\] has no parent \[1\]"):
        T.from_choices([(0,), (1, 0)])
    with pytest.raises(ValueError, match=r"\[2\] without its sibling \[1\]"):
        T.from_choices([(0,), (2,)])
    with pytest.raises(ValueError, match="not a path of ranks"):
        T.from_choices([(0,), (0, -1)])
    with pytest.raises(ValueError, match="largest node bucket"):
        T.node_bucket(9, [4, 8])
    assert T.node_bucket(5, [16, 8, 4]) == 8
    with pytest.raises(ValueError, match="node bucket 3 is smaller than a row's tree \\(4 verify tokens\\)"):
        T.attention_mask(np.array([0]), T.chain(3), 3)


# ---- the verifier's positions and mask ------------------------------------------------------------------
def test_mask_and_positions_match_the_definition():
    g = np.random.default_rng(1)
    for _ in range(50):
        n = int(g.integers(1, 5))
        trees = [_random_tree(g) for _ in range(n)]
        ctx = g.integers(0, 6, n)
        Q = 1 + max(t.nodes for t in trees) + int(g.integers(0, 3))
        mask, pos = T.attention_mask(ctx, trees, Q), T.positions(ctx, trees, Q)
        assert mask.shape == (n, Q, ctx.max() + Q) and pos.shape == (n, Q)
        for i, t in enumerate(trees):
            for j in range(Q):
                line = {j}   # j and its ancestors, as queries
                if 0 < j <= t.nodes:
                    x = j - 1
                    while x >= 0:
                        line.add(x + 1)
                        x = t.parent[x]
                    line.add(0)
                want = [s < ctx[i] or (s - ctx[i]) in line for s in range(mask.shape[2])]
                assert mask[i, j].tolist() == want
                assert pos[i, j] == ctx[i] + (t.depth[j - 1] if 0 < j <= t.nodes else 0)


def test_a_chains_mask_is_the_causal_mask():
    ctx, k = np.array([3, 0, 5]), np.array([2, 4, 0])
    trees = [T.chain(int(x)) for x in k]
    Q = 5
    pos = ctx[:, None] + np.arange(Q)[None, :]              # what the chain forward uses
    causal = np.arange(ctx.max() + Q)[None, None, :] <= pos[:, :, None]
    mask, tpos = T.attention_mask(ctx, trees, Q), T.positions(ctx, trees, Q)
    real = np.arange(Q)[None, :] <= k[:, None]
    assert (mask[real] == causal[real]).all() and (tpos[real] == pos[real]).all()


# ---- greedy ------------------------------------------------------------------------------------------
def test_greedy_by_hand():
    t = T.from_widths([2, 2])   # nodes 0, 1 at depth 1; 2, 3 below 0; 4, 5 below 1
    tokens = np.array([[7, 5, 1, 2, 3, 4], [7, 5, 1, 2, 3, 4], [7, 5, 1, 2, 3, 9]])
    target = np.array([[5, 0, 3, 0, 0, 0, 0],    # root -> 5 (node 1), then 3 (node 4), then its bonus 0
                       [8, 0, 0, 0, 0, 0, 0],    # nothing matches: the correction 8
                       [5, 0, 9, 0, 0, 0, 6]])   # node 1, then 9 (node 5), then 6 after node 5
    a, path, tok = TV.greedy([t] * 3, tokens, target)
    assert a.tolist() == [2, 0, 2] and tok.tolist() == [0, 8, 6]
    assert path.tolist() == [[1, 4], [-1, -1], [1, 5]]
    one = TV.greedy(t, tokens, target)   # one tree for every row
    assert all((x == y).all() for x, y in zip(one, (a, path, tok)))


def _brute_greedy(t: T.Tree, tokens, target):
    best = (0, -1)   # (depth, node)
    for j in range(t.nodes):
        x, ok = j, True
        while x >= 0 and ok:
            ok = tokens[x] == target[t.parent[x] + 1]
            x = t.parent[x]
        if ok and t.depth[j] > best[0]:
            best = (int(t.depth[j]), j)
    path, x = [], best[1]
    while x >= 0:
        path.insert(0, x)
        x = t.parent[x]
    return best[0], path, target[best[1] + 1]


def test_greedy_matches_a_brute_force_enumeration():
    g = np.random.default_rng(2)
    for _ in range(300):
        n = int(g.integers(1, 5))
        trees = [_random_tree(g) for _ in range(n)]
        Q = 1 + max(t.nodes for t in trees)
        target = g.integers(0, 3, (n, Q))
        tokens = g.integers(0, 3, (n, Q - 1))   # a small vocabulary: equal siblings happen
        a, path, tok = TV.greedy(trees, tokens, target)
        for i, t in enumerate(trees):
            d, p, x = _brute_greedy(t, tokens[i], target[i])
            assert (a[i], path[i, :a[i]].tolist(), tok[i]) == (d, p, x)
            assert (path[i, a[i]:] == -1).all()


def test_greedy_on_chains_is_verify_greedy():
    g = np.random.default_rng(3)
    for _ in range(100):
        n, K = int(g.integers(1, 6)), int(g.integers(0, 6))
        target = g.integers(0, 3, (n, K + 1))
        drafts = np.where(g.random((n, K)) < 0.7, target[:, :K], g.integers(0, 3, (n, K)))
        drafted = g.integers(0, K + 1, n)
        a, path, tok = TV.greedy([T.chain(int(k)) for k in drafted], drafts, target)
        want_a, want_tok = verify.greedy(drafts, drafted, target)
        assert a.tolist() == want_a.tolist() and tok.tolist() == want_tok.tolist()
        assert all(path[i, :a[i]].tolist() == list(range(a[i])) for i in range(n))


# ---- rejection sampling ------------------------------------------------------------------------------
V, ROWS = 6, 40_000


def _markov(seed: int):
    """A target T and a draft Q as Markov chains over V tokens (row x: the distribution after token x)."""
    g = np.random.default_rng(seed)
    Tm = g.dirichlet(np.ones(V), V)
    return Tm, 0.5 * Tm + 0.5 * g.dirichlet(np.ones(V), V)


def _tree_batch(t: T.Tree, Tm, Qm, gen, topk: bool = False):
    """ROWS rows of tree t after token 0: each node's token drawn from Q after its parent's token (or the
    parent's top candidates by Q, with one-hot q, when topk); p at each query T after its token."""
    toks = torch.zeros((ROWS, t.nodes), dtype=torch.long)
    Qt, Tt = torch.tensor(Qm), torch.tensor(Tm)
    q = torch.zeros((ROWS, t.nodes, V), dtype=torch.float64)
    for j in range(t.nodes):
        prev = toks[:, t.parent[j]] if t.parent[j] >= 0 else torch.zeros(ROWS, dtype=torch.long)
        if topk:
            toks[:, j] = torch.argsort(Qt[prev], dim=1, descending=True)[:, int(t.rank[j])]
            q[:, j] = torch.nn.functional.one_hot(toks[:, j], V).double()
        else:
            toks[:, j] = torch.multinomial(Qt[prev], 1, generator=gen).squeeze(1)
            q[:, j] = Qt[prev]
    p = torch.cat([Tt[0].expand(ROWS, 1, V), Tt[toks]], dim=1)
    return p, q, toks


def _emitted(a, path, tok, toks):
    a, path, tok, toks = a.numpy(), path.numpy(), tok.numpy(), toks.numpy()
    return [[int(toks[i, x]) for x in path[i, :a[i]]] + [int(tok[i])] for i in range(a.size)]


def _fits(counts: np.ndarray, probs: np.ndarray) -> float:
    return chisquare(counts, counts.sum() * probs).pvalue


@pytest.mark.parametrize("shape, topk, seed", [
    (T.from_widths([3, 2]), False, 3),                                          # i.i.d. children
    (T.from_choices([(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]), False, 8),
    (T.from_widths([2, 2]), True, 5),                                           # top-k, one-hot q
    (T.EAGLE_TREE, False, 9),
])
def test_tree_rejection_output_is_distributed_as_the_target(shape, topk, seed):
    Tm, Qm = _markov(seed)
    gen = torch.Generator().manual_seed(seed)
    p, q, toks = _tree_batch(shape, Tm, Qm, gen, topk)
    a, path, tok = TV.rejection(p, q, toks, [shape] * ROWS, gen)
    out = _emitted(a, path, tok, toks)
    first = np.bincount([o[0] for o in out], minlength=V)
    assert _fits(first, Tm[0]) > 1e-3
    assert _fits(first, Qm[0]) < 1e-6   # the test tells the draft's distribution from the target's
    x = int(np.argmax(first))
    second = np.bincount([o[1] for o in out if len(o) > 1 and o[0] == x], minlength=V)
    assert second.sum() > 2000 and _fits(second, Tm[x]) > 1e-3
    assert (a.numpy() <= shape.max_depth).all() and a.float().mean() > 0.5


def test_topk_children_need_one_hot_q():
    """Top-k children verified with q the draft's distribution (not one-hot) are not the target's samples."""
    Tm, Qm = _markov(5)
    t = T.from_widths([2, 2])
    gen = torch.Generator().manual_seed(5)
    p, q, toks = _tree_batch(t, Tm, Qm, gen, topk=True)
    q[:, :2] = torch.tensor(Qm[0])   # the root's children: q the draft's distribution after token 0
    a, path, tok = TV.rejection(p, q, toks, [t] * ROWS, gen)
    first = np.bincount([o[0] for o in _emitted(a, path, tok, toks)], minlength=V)
    assert _fits(first, Tm[0]) < 1e-6


def test_kept_slots():
    src, dst = TV.kept_slots(np.array([4, 0, 2]), np.array([[1, 4], [-1, -1], [0, 1]]))
    assert src.tolist() == [[6, 9], [-1, -1], [3, 4]] and dst.tolist() == [[5, 6], [-1, -1], [3, 4]]


def test_tree_rejection_accepts_the_first_child_of_the_target_itself():
    Tm, _ = _markov(6)
    gen = torch.Generator().manual_seed(6)
    t = T.from_widths([2, 2])
    p, q, toks = _tree_batch(t, Tm, Tm, gen)
    a, path, tok = TV.rejection(p, q, toks, [t] * ROWS, gen)
    assert (a == 2).all() and (path.numpy() == [0, 2]).all()
    pick = toks[:, 2].numpy() == 0   # the bonus token: from the target after the leaf
    assert _fits(np.bincount(tok.numpy()[pick], minlength=V), Tm[0]) > 1e-3


def test_tree_rejection_on_chains_is_verify_rejection():
    g = np.random.default_rng(7)
    n, K = 4000, 3
    p = torch.tensor(g.dirichlet(np.ones(V), (n, K + 1)))
    q = torch.tensor(g.dirichlet(np.ones(V), (n, K)))
    drafts = torch.multinomial(q.reshape(-1, V), 1, generator=torch.Generator().manual_seed(0)).reshape(n, K)
    drafted = g.integers(0, K + 1, n)
    a, tok = verify.rejection(p, q, drafts, drafted, torch.Generator().manual_seed(1))
    ta, path, ttok = TV.rejection(p, q, drafts, [T.chain(int(k)) for k in drafted], torch.Generator().manual_seed(1))
    # the same uniforms and samples in the same order: the same outcome, row by row
    assert (a == ta).all() and (tok == ttok).all()
    assert all(path[i, :a[i]].tolist() == list(range(a[i])) for i in range(n))


# ---- the simulator's per-rank model --------------------------------------------------------------------
def test_keyed_uniforms_are_the_kernels():
    ids, pos = np.array([0, 3, 12345, 7]), np.array([0, 9, 2, 100000])
    want = [_kernels.keyed_uniform(99, int(r), int(m), 0) for r, m in zip(ids, pos)]
    assert TA.keyed_uniforms(99, ids, pos).tolist() == want


def test_a_chain_accepts_where_acceptance_iid_does():
    m = acceptance.IID(0.7)
    m.reset(np.random.default_rng(0))
    m.admit(500)
    m.rows.acc_pos[:] = np.arange(500) % 37
    tm = TA.TreeAcceptance(TA.rank_table(0.7))
    tm.key = m.key
    for k in range(5):
        want = m.leading(np.full(500, k))
        assert tm.accepted(T.chain(k), np.arange(500), m.rows.acc_pos).tolist() == want.tolist()


def test_ranks_are_one_field_for_every_tree():
    tm = TA.TreeAcceptance(TA.rank_table(0.5, ranks=4))
    tm.reset(np.random.default_rng(1))
    ids, pos = np.arange(200), np.arange(200) * 3
    r = tm.ranks(ids, pos, 4)
    assert (r[:, 1:] == tm.ranks(ids, pos + 1, 3)).all()   # position m's rank, whichever step reaches it
    assert set(np.unique(r)) <= {-1, 0, 1, 2, 3}
    trees = [T.EAGLE_TREE, T.from_widths([3, 2, 1]), T.chain(4)] * 70
    g = np.random.default_rng(2)
    trees = [trees[i] for i in g.permutation(200)]
    mixed = tm.accepted(trees, ids, pos)
    for t in set(map(id, trees)):
        rowsof = np.array([i for i in range(200) if id(trees[i]) == t])
        assert (mixed[rowsof] == tm.accepted(trees[rowsof[0]], ids[rowsof], pos[rowsof])).all()


def test_expected_accepted_closed_form_and_monte_carlo():
    alpha = 0.6
    table = TA.rank_table(alpha)
    for k in range(6):
        assert TA.expected_accepted(T.chain(k), table) == pytest.approx(sum(alpha ** j for j in range(1, k + 1)))
    # [2, 1]: two roots (alpha + alpha (1 - alpha)), each followed by its top candidate (x alpha)
    assert TA.expected_accepted(T.from_widths([2, 1]), table) == pytest.approx((alpha + alpha * 0.4) * (1 + alpha))
    tm = TA.TreeAcceptance(table)
    tm.reset(np.random.default_rng(3))
    n = 400_000
    for t in (T.EAGLE_TREE, T.from_widths([3, 2, 1]), T.chain(4)):
        mc = tm.accepted(t, np.arange(n), np.zeros(n, np.int64)).mean()
        want = TA.expected_accepted(t, table)
        assert abs(mc / want - 1) < 0.01, (t, mc, want)


def test_bad_rank_tables():
    with pytest.raises(ValueError, match="sums to 1.2 > 1"):
        TA.check_table([0.6, 0.6])
    with pytest.raises(ValueError, match="probabilities in"):
        TA.check_table([-0.1])
    with pytest.raises(ValueError, match="alpha and decay"):
        TA.rank_table(0.5, decay=1.5)
    assert TA.rank_table(0.5, ranks=3).tolist() == [0.5, 0.25, 0.125]


def test_a_transformer_reads_each_tree_path_as_its_own_sequence():
    """A random Llama run once over prefix + root + every row's padded tree, with `positions` and
    `attention_mask`, gives each node the logits of a plain causal forward over prefix + root + its path."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    model = transformers.LlamaForCausalLM(cfg).eval()
    g = np.random.default_rng(4)
    trees, ctx = [T.EAGLE_TREE, T.from_widths([2, 2]), T.chain(3)], 7
    n, Q = len(trees), 28   # a bucket wider than the biggest tree
    context = np.full(n, ctx)
    seq = g.integers(0, 50, (n, ctx + Q))                    # prefix, root, nodes (and padding)
    tree_mask = T.attention_mask(context, trees, Q)           # [n, Q, ctx + Q]
    mask = np.concatenate([np.broadcast_to(np.tril(np.ones((ctx, ctx + Q), bool)), (n, ctx, ctx + Q)),
                           tree_mask], axis=1)
    pos = np.concatenate([np.broadcast_to(np.arange(ctx), (n, ctx)), T.positions(context, trees, Q)], axis=1)
    with torch.inference_mode():
        logits = model(input_ids=torch.from_numpy(seq), attention_mask=torch.from_numpy(mask)[:, None],
                       position_ids=torch.from_numpy(pos)).logits
        for i, t in enumerate(trees):
            for leaf in sorted(set(range(t.nodes)) - set(t.parent.tolist())):   # every node is on a leaf's path
                path, x = [], leaf
                while x >= 0:
                    path.insert(0, ctx + 1 + x)
                    x = t.parent[x]
                alone = model(input_ids=torch.from_numpy(seq[i, list(range(ctx + 1)) + path])[None]).logits
                torch.testing.assert_close(logits[i, path], alone[0, ctx + 1:], rtol=1e-4, atol=1e-4)
