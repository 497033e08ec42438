"""backend=hf, draft trees: the draft proposes each row's tree level by level, the target verifies every row's
root and nodes in one forward (tree positions, ancestor masks), tree_verify decides and the accepted path's KV
moves to the slots after the root. Greedy, the output is the target's own greedy decoding (tree_fixed, and a
policy giving each row its own tree, chains and chain(0) included), on the dynamic and the static path
(node buckets, graphs through the CPU stand-in), ragged batches and continuous batching; sampled, the static
path emits the dynamic path's tokens and the emitted tokens follow the target's distribution (chi-square)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from conftest import build_tiny_pair, compose, hf_overrides  # noqa: E402
from specdepth import tree as T  # noqa: E402
from specdepth.app import run  # noqa: E402
from specdepth.cost import ConstantCost  # noqa: E402
from specdepth.engine import Engine, EngineConfig  # noqa: E402
from specdepth.errors import PolicyError  # noqa: E402
from specdepth.hf import HFExecutor  # noqa: E402
from specdepth.models import ModelPair  # noqa: E402
from specdepth.policy import Policy  # noqa: E402
from specdepth.workload import Request  # noqa: E402
from test_hf_lossless import _check_greedy, _greedy  # noqa: E402
from test_hf_static import RAGGED, _gens  # noqa: E402

SHIPPED = Path(__file__).resolve().parents[1] / "src" / "specdepth" / "assets" / "tiny_pair"


class PerRowTrees(Policy):
    """Row i drafts its own tree, changing with the step: product trees, EAGLE's tree, a wide tree (past the
    chain's cache room), chains and chain(0)."""
    name = "per_row_trees"
    SHAPES = (T.from_widths([2, 2, 1]), T.chain(3), T.chain(0), T.EAGLE_TREE, T.from_widths([3]),
              T.from_widths([8, 4]), T.from_choices([(0,), (1,), (0, 0), (0, 0, 0), (1, 0)]))

    def reset(self):
        self.step = 0

    def plan(self, view):
        self.step += 1
        k = len(self.SHAPES)
        return [self.SHAPES[(i + self.step) % k] for i in range(view.batch_size)]


@pytest.fixture(scope="module")
def random_pair(tmp_path_factory):
    """A target and an unrelated random draft (it rarely agrees: rank > 0 candidates matter)."""
    return build_tiny_pair(tmp_path_factory.mktemp("tree_random"), vocab=64, draft_noise=None, seed=4)


def _executor(pair, cfg, static="off", temperature=0.0, seed=0):
    mp = ModelPair(target=str(pair["target"]), draft=str(pair["draft"]), dtype="float32", device="cpu")
    cost = ConstantCost(mp.target_arch, mp.draft_arch)
    ex = HFExecutor(cost=cost, model=mp, seed=seed, decode=dict(temperature=temperature, top_p=1.0), engine=cfg,
                    static_shapes=static)
    return ex, cost


def _spy(ex, log):
    """Per tree step: one target forward, one draft forward per level; the caches then hold exactly the
    known tokens (target) and at most them (draft)."""
    draft_tree, verify_tree = ex.draft_tree, ex.verify_tree

    def d(trees):
        calls = ex.dr.calls
        out = draft_tree(trees)
        assert ex.dr.calls - calls == out[3] == max(t.max_depth for t in trees)
        assert out[0].shape == (len(trees), max(t.nodes for t in trees))
        return out

    def v(trees):
        calls = ex.tr.calls
        nodes = [t.nodes for t in trees]
        path = ex.tree_step
        a, _, _ = out = verify_tree(trees)
        assert ex.tr.calls - calls == 1
        st = ex.cache_state()
        assert (st["target"] == st["length"] - 1).all()
        assert (st["draft"] <= st["length"]).all()
        assert (a <= [t.max_depth for t in trees]).all()
        log.append(dict(nodes=nodes, accepted=a.copy(), tokens=path[6].copy()))
        return out

    ex.draft_tree, ex.verify_tree = d, v


def _requests(n, out_len, arrivals=False, seed=1):
    rng = np.random.default_rng(seed)
    P = rng.integers(2, 14, n)
    return [Request(i, 0.02 * i if arrivals else 0.0, int(p), int(out_len),
                    prompt_ids=rng.integers(3, 64, int(p)).tolist()) for i, p in enumerate(P)]


@pytest.mark.parametrize("static", ["off", "graphs"])
def test_per_row_trees_greedy_is_the_targets_output(random_pair, tiny_pair, static):
    """Per-row trees (chains and chain(0) among them), ragged prompts, rows arriving while others decode
    (continuous batching over 3 rows): the target's greedy output, on a random pair and on the noisy pair."""
    for pair in (random_pair, tiny_pair):
        cfg = EngineConfig(max_depth=5, max_batch_size=3, progress=False)
        ex, cost = _executor(pair, cfg, static)
        log = []
        _spy(ex, log)
        reqs = _requests(6, 20, arrivals=True)
        res = Engine(PerRowTrees(), ex, cost, cfg, reqs).run()
        for g in res.extra["generations.jsonl"]:
            assert g["output_ids"] == _greedy(pair["target"], tuple(g["prompt_ids"]), 20), g["request_id"]
        assert log and sum(int(e["accepted"].sum()) for e in log) > 0
        assert any(len(set(e["nodes"])) > 2 for e in log)   # different trees in one verify
        if static == "graphs":
            st = ex.summary_fields()["static_shapes"]["target"]
            assert st["graphs"] == "standin" and st["tree_forwards"] >= len(log)


@pytest.mark.parametrize("static", ["off", "graphs"])
def test_tree_fixed_greedy_through_the_app(tiny_pair, tmp_path, static):
    """policy=tree_fixed (EAGLE's tree) through the app, ragged batches and continuous batching: the target's
    greedy output; steps.csv counts a tree step's nodes as its drafts."""
    run(compose(hf_overrides(tiny_pair, "policy=tree_fixed", *RAGGED, f"backend.static_shapes={static}", "seed=3")),
        tmp_path)
    _check_greedy(tiny_pair, tmp_path)
    import csv
    with open(tmp_path / "steps.csv") as f:
        steps = [s for s in csv.DictReader(f) if int(s["max_depth"])]
    assert steps and all(int(s["drafted"]) == 25 * int(s["batch_size"]) for s in steps)


def test_shipped_pair_tree_greedy(tmp_path):
    """The shipped tiny pair, EAGLE's tree and a [3, 2, 1] product tree, dynamic and static: the target's
    greedy output, the same on both paths."""
    pair = {"target": SHIPPED / "target", "draft": SHIPPED / "draft"}
    outs = {}
    for static in ("off", "graphs"):
        for widths in ("null", "[3,2,1]"):
            d = tmp_path / f"{static}{widths}"
            run(compose("backend=hf", "model=tiny_pair", "policy=tree_fixed", f"policy.widths={widths}",
                        "workload.batch_size=3", "workload.output_len=24", f"backend.static_shapes={static}",
                        "engine.progress=false"), d)
            _check_greedy(pair, d)
            outs[static, widths] = _gens(d)
    assert outs["off", "null"] == outs["graphs", "null"]


@pytest.mark.parametrize("policy", ["tree_fixed", "tree_fixed_widths"])
def test_sampled_static_equals_dynamic(tiny_pair, tmp_path, policy):
    """Sampling (temperature 1, top_p 0.9): the same seed gives the same tokens on the dynamic and the static
    path (the same draws in the same order over the same distributions)."""
    extra = ["policy=tree_fixed"] + (["policy.widths=[3,2,2]"] if policy.endswith("widths") else [])
    common = hf_overrides(tiny_pair, *extra, *RAGGED, "decode.temperature=1.0", "decode.top_p=0.9", "seed=5")
    run(compose(common, "backend.static_shapes=off"), tmp_path / "off")
    run(compose(common, "backend.static_shapes=graphs"), tmp_path / "graphs")
    assert _gens(tmp_path / "graphs") == _gens(tmp_path / "off")


def test_sampled_per_row_trees_static_equals_dynamic(random_pair):
    outs = []
    for static in ("off", "eager"):
        cfg = EngineConfig(max_depth=5, max_batch_size=3, progress=False)
        ex, cost = _executor(random_pair, cfg, static, temperature=1.0, seed=7)
        res = Engine(PerRowTrees(), ex, cost, cfg, _requests(6, 16)).run()
        outs.append([g["output_ids"] for g in res.extra["generations.jsonl"]])
    assert outs[0] == outs[1]


@pytest.mark.parametrize("widths", [[3, 2], [2, 1, 2]])
def test_tree_rejection_sampling_matches_target_distribution(tiny_pair_small_vocab, widths):
    """SpecInfer's rule end to end: N requests with one prompt in one batch, a tree per step from a draft that
    disagrees with the target; the tokens at output positions 0..2 follow the target's own marginals."""
    from test_hf_sampling import N, POSITIONS, PROMPT, _chi2, _marginals
    pair, V = tiny_pair_small_vocab, tiny_pair_small_vocab["vocab"]
    cfg = EngineConfig(max_depth=len(widths), max_batch_size=N, max_num_batched_tokens=1 << 20, progress=False)
    ex, cost = _executor(pair, cfg, "off", temperature=1.0, seed=13)
    tree = T.from_widths(widths)

    class Fixed(Policy):
        def plan(self, view):
            return tree

    reqs = [Request(i, 0.0, len(PROMPT), POSITIONS, prompt_ids=list(PROMPT)) for i in range(N)]
    res = Engine(Fixed(), ex, cost, cfg, reqs).run()
    out = np.array([g["output_ids"] for g in res.extra["generations.jsonl"]])
    margs = _marginals(str(pair["target"]), V, 1.0, 1.0)
    for j in range(POSITIONS):
        obs = np.bincount(out[:, j], minlength=V).astype(float)
        pv = _chi2(obs, margs[j])
        assert pv > 0.01, f"position {j}: chi-square p = {pv:.3g}; {obs.tolist()} vs {(margs[j] * N).round(1).tolist()}"


def test_timing_mode_refuses_trees_without_a_rank_table(tiny_pair, tmp_path):
    """backend.acceptance=simulated with a model that has no per-rank table: a tree plan is one clear
    PolicyError naming the fix."""
    with pytest.raises(PolicyError) as e:
        run(compose(hf_overrides(tiny_pair, "policy=tree_fixed", "backend.acceptance=simulated", "acceptance=beta",
                                 "workload.batch_size=2", "workload.output_len=4")), tmp_path)
    msg = str(e.value)
    assert "\n" not in msg and "acceptance=ranked" in msg


@pytest.mark.parametrize("static,temperature", [("off", 0.0), ("graphs", 1.0)])
def test_timing_mode_trees_match_the_simulator(tiny_pair, tmp_path, static, temperature):
    """Timing mode (real forwards and caches, accept/reject from acceptance=ranked keyed by request and output
    position): every step accepts what the simulator's step accepts with the same seed and workload."""
    import csv
    common = ["policy=tree_fixed", "acceptance=ranked", "acceptance.alpha=0.6", "workload.batch_size=3",
              "workload.output_len=30", "seed=2", f"decode.temperature={temperature}"]
    run(compose("backend=sim", "engine.progress=false", *common), tmp_path / "sim")
    run(compose(hf_overrides(tiny_pair, "backend.acceptance=simulated", f"backend.static_shapes={static}",
                             *common)), tmp_path / "hf")
    cols = ("batch_size", "max_depth", "drafted", "accepted", "emitted")
    steps = {}
    for k in ("sim", "hf"):
        with open(tmp_path / k / "steps.csv") as f:
            steps[k] = [tuple(row[c] for c in cols) for row in csv.DictReader(f)]
    assert steps["hf"] == steps["sim"]
    assert sum(int(s[3]) for s in steps["sim"]) > 0


def test_static_tree_forward_matches_dynamic():
    """StaticRunner.forward_tree (node buckets, row buckets, the stand-in graph, a resize of its node buckets)
    gives Runner.forward_tree's logits on the real queries, and the slot moves of kept paths land the same."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from specdepth.hf_runner import Runner
    from specdepth.hf_static import StaticRunner
    torch.manual_seed(0)
    m = LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)).eval()
    dyn, st = Runner(m, 3, 64), StaticRunner(m, 3, 64, 4, "standin")
    rng = np.random.default_rng(0)
    P = np.array([5, 9, 3])
    toks = rng.integers(0, 50, (3, 9))
    with torch.inference_mode():
        for r in (dyn, st):
            r.forward(np.arange(3), toks, np.zeros(3, np.int64), P, "none")
        for trees in ([T.from_widths([2, 2]), T.chain(2), T.from_widths([3])],
                      [T.EAGLE_TREE, T.chain(0), T.from_widths([4, 2])]):
            Q = 1 + max(t.nodes for t in trees)
            par, depth, real = T.pack(trees, Q)
            mask = T.attention_mask(P, trees, Q)
            anc = np.stack([mask[i, :, P[i]:P[i] + Q] for i in range(3)])
            tk = rng.integers(0, 50, (3, Q))
            slots = P[:, None] + np.arange(Q)
            qn = np.array([1 + t.nodes for t in trees])
            a = dyn.forward_tree(slice(0, 3), tk, slots, P[:, None] + depth, P, anc, qn)
            b = st.forward_tree(slice(0, 3), tk, slots, P[:, None] + depth, P, anc, qn)
            on = torch.from_numpy(np.arange(Q)[None, :] < qn[:, None])
            torch.testing.assert_close(a[on], b[on], rtol=1e-4, atol=1e-4)
            sub = st.forward_tree(np.array([1]), tk[1:2], slots[1:2], (P[:, None] + depth)[1:2], P[1:2], anc[1:2],
                                  qn[1:2])
            torch.testing.assert_close(sub[0, :qn[1]], b[1, :qn[1]], rtol=1e-4, atol=1e-4)
    assert st.resizes == 1 and st.stats()["tree_forwards"] == 4


def test_kept_static_runner_reused_by_a_later_tree_run(tiny_pair, tmp_path):
    """Inside MODELS.keep() (scripts of many runs) a later run reuses the static runners, their grown node
    buckets and their tree graphs: nothing is captured again and the output is still the target's."""
    from specdepth.hf_runner import MODELS
    cfg = compose(hf_overrides(tiny_pair, "policy=tree_fixed", "policy.widths=[3,2]", "workload.batch_size=2",
                               "workload.output_len=12", "backend.static_shapes=graphs"))
    with MODELS.keep():
        first = run(cfg, tmp_path / "a")
        second = run(cfg, tmp_path / "b")
    for d in ("a", "b"):
        _check_greedy(tiny_pair, tmp_path / d)
    assert first["static_shapes"]["target"]["captured"] > 0
    assert second["static_shapes"]["target"]["captured"] == 0 and second["static_shapes"]["target"]["tree_forwards"]


def test_tree_wider_than_the_draft_vocabulary_is_one_line(tiny_pair):
    """A node with more children than the draft has tokens: one BackendError line, before the tree is drafted."""
    from specdepth.errors import BackendError
    cfg = EngineConfig(max_depth=2, progress=False)
    ex, cost = _executor(tiny_pair, cfg)

    class Wide(Policy):
        def plan(self, view):
            return T.from_widths([65])

    with pytest.raises(BackendError) as e:
        Engine(Wide(), ex, cost, cfg, _requests(2, 4)).run()
    assert "\n" not in str(e.value) and "65 children" in str(e.value)
