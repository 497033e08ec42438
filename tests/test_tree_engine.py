"""Tree plans through the engine and the simulator (issue 48): the engine's checks, chains as trees, the
simulator's tree acceptance (closed form, keyed outcomes, iid and ranked), the view's tree fields, tree_fixed
end to end."""
from __future__ import annotations

import json

import numpy as np
import pytest

from sdtest import cfg, cli
from specdepth import tree as T
from specdepth import tree_acceptance as TA
from specdepth.app import build, run
from specdepth.engine import Engine
from specdepth.errors import BackendError, ConfigError, PolicyError
from specdepth.executor import Executor
from specdepth.policy import Policy

SMALL = ("workload=closed", "workload.batch_size=6", "workload.output_len=40", "workload.prompt_len=64")


class Plan(Policy):
    """Answers plan() with answer(view); keeps what observe saw when record=True."""

    def __init__(self, answer, record: bool = False, accept_prob: bool = False):
        self._answer, self._record = answer, record
        self.requires_accept_prob = accept_prob
        self.seen = []

    def plan(self, view):
        if self.requires_accept_prob:
            self.seen.append(("table", view.rank_table))
        return self._answer(view)

    def observe(self, view, accepted):
        if self._record:
            self.seen.append(dict(ids=view.request_ids.copy(), pos=view.generated.copy() - 1, ctx=view.context_lens.copy(),
                                  trees=view.trees, nodes=None if view.nodes is None else view.nodes.copy(),
                                  conf=view.node_confidences, accepted=accepted.copy(), depths=view.depths.copy(),
                                  times=(view.measured_draft_s, view.predicted_draft_s, view.measured_verify_s,
                                         view.predicted_verify_s)))


def engine(policy, *overrides):
    e = build(cfg(*SMALL, *overrides))["engine"]
    return Engine(policy, e.executor, e.cost, e.cfg, e.requests)


# ---- the engine's checks ---------------------------------------------------------------------------
@pytest.mark.parametrize("answer, message", [
    (lambda v: [T.EAGLE_TREE] * (v.batch_size - 1), "one Tree for every sequence or a list of 6"),
    (lambda v: [T.EAGLE_TREE] * (v.batch_size - 1) + [2], "element 5 is a int, not a specdepth.tree.Tree"),
    (lambda v: [T.EAGLE_TREE] * (v.batch_size - 1) + [None], "element 5 is a NoneType"),
    (lambda v: T.from_widths([2] + [1] * 16), r"tree of depth 17 \(sequence 0\) > engine.max_depth=16"),
    (lambda v: T.from_widths([4, 4, 4]), r"verify tokens \(510 = 6 sequences \+ 504 tree nodes\) exceed "
                                         r"engine.max_num_batched_tokens=256"),
])
def test_bad_tree_plans_are_policy_errors(answer, message):
    with pytest.raises(PolicyError, match=r"policy Plan broke a rule: .*" + message):
        engine(Plan(answer), "acceptance=ranked", "engine.max_num_batched_tokens=256").run()


def test_a_tree_plan_on_a_model_without_a_rank_table_is_refused_naming_the_fix():
    with pytest.raises(PolicyError, match="plan\\(\\) returned a tree plan, but acceptance model Beta has no "
                                          "per-rank table: tree plans run under acceptance=ranked"):
        engine(Plan(lambda v: T.EAGLE_TREE), "acceptance=beta").run()


def test_the_executor_base_class_refuses_trees_naming_the_backend():
    ex = build(cfg(*SMALL, "acceptance=ranked"))["engine"].executor
    assert Executor.supports_trees is False
    with pytest.raises(BackendError, match="backend 'sim' cannot draft trees"):
        Executor.draft_tree(ex, [T.EAGLE_TREE])
    with pytest.raises(BackendError, match="backend 'sim' cannot verify trees"):
        Executor.verify_tree(ex, [T.EAGLE_TREE])


def test_ranked_config_errors_name_the_key():
    with pytest.raises(ConfigError, match="acceptance.table: rank table sums to 1.2 > 1"):
        build(cfg(*SMALL, "acceptance=ranked", "acceptance.table=[0.7,0.5]"))
    with pytest.raises(ConfigError, match="acceptance.alpha"):
        build(cfg(*SMALL, "acceptance=ranked", "acceptance.alpha=1.5"))


# ---- chains as trees -------------------------------------------------------------------------------
@pytest.mark.parametrize("acceptance", ["confidence", "ranked"])
def test_an_all_chain_tree_plan_is_the_depths_bit_for_bit(acceptance):
    """A plan of chains (one Tree, or one per row, ragged) runs as the depths, on any acceptance model."""
    ragged = lambda v: np.arange(v.batch_size, dtype=np.int64) % 4   # noqa: E731
    cases = [(lambda v: np.full(v.batch_size, 3, np.int64), lambda v: T.chain(3)),
             (ragged, lambda v: [T.chain(int(k)) for k in ragged(v)]),
             (lambda v: np.zeros(v.batch_size, np.int64), lambda v: [T.chain(0)] * v.batch_size)]
    for depths, trees in cases:
        a = engine(Plan(depths, record=True), f"acceptance={acceptance}").run()
        b = engine(Plan(trees, record=True), f"acceptance={acceptance}").run()
        assert a.steps == b.steps and a.requests == b.requests
        assert np.array_equal(a.position_accepted, b.position_accepted)


def test_ranked_runs_a_chain_policy_exactly_as_iid_with_alpha_table0(tmp_path):
    iid = ("policy=fixed", "policy.depth=3", "acceptance=iid", "acceptance.alpha=0.6")
    run(cfg(*SMALL, *iid), tmp_path / "iid")
    run(cfg(*SMALL, "policy=fixed", "policy.depth=3", "acceptance=ranked", "acceptance.table=[0.6,0.2,0.1]"),
        tmp_path / "ranked")
    a, b = ((tmp_path / d / "steps.csv").read_text() for d in ("iid", "ranked"))
    assert a == b and len(a.splitlines()) > 5


def test_iid_runs_trees_with_the_geometric_rank_table():
    a = engine(Plan(lambda v: T.EAGLE_TREE), "acceptance=iid", "acceptance.alpha=0.7").run()
    b = engine(Plan(lambda v: T.EAGLE_TREE), "acceptance=ranked", "acceptance.alpha=0.7").run()
    c = engine(Plan(lambda v: T.EAGLE_TREE), "acceptance=ranked", "acceptance.alpha=0.7",
               "acceptance.decay=0.1").run()
    assert a.steps == b.steps and a.steps != c.steps


# ---- the simulator's tree acceptance ----------------------------------------------------------------
def test_a_static_trees_mean_accepted_length_matches_the_closed_form():
    """Monte-Carlo over a run: the mean accepted path of a static tree is tree_acceptance.expected_accepted
    within 1 % (about 25,000 row-steps; the run's seed is fixed)."""
    table = [0.55, 0.2, 0.1, 0.05]
    p = Plan(lambda v: T.EAGLE_TREE, record=True)
    engine(p, "acceptance=ranked", f"acceptance.table={table}", "workload.batch_size=64",
           "workload.output_len=1500").run()
    acc = np.concatenate([s["accepted"] for s in p.seen])
    assert acc.size > 20000
    assert acc.mean() == pytest.approx(TA.expected_accepted(T.EAGLE_TREE, table), rel=0.01)


def test_outcomes_are_keyed_the_same_target_ranks_for_every_policy():
    """Two tree policies and a chain policy: every row's accepted path is the walk of its tree over the same
    keyed ranks (one key per seed), so they face the same target tokens."""
    table = np.array([0.5, 0.25, 0.1])
    runs = []
    for answer in (lambda v: T.EAGLE_TREE, lambda v: [T.from_widths([3, 2, 1]), T.from_widths([1, 4])] *
                   (v.batch_size // 2) + [T.chain(2)] * (v.batch_size % 2), lambda v: T.chain(4)):
        p = Plan(answer, record=True)
        e = engine(p, "acceptance=ranked", f"acceptance.table={table.tolist()}", "workload.batch_size=7")
        e.run()
        runs.append((e.executor._tree_acc.key, p.seen))
    assert len({k for k, _ in runs}) == 1
    ranks = TA.TreeAcceptance(table)
    ranks.key = runs[0][0]
    checked = 0
    for _, seen in runs:
        for s in seen:
            trees = s["trees"] if s["trees"] is not None else [T.chain(int(d)) for d in s["depths"]]
            r = ranks.ranks(s["ids"], s["pos"], max(t.max_depth for t in trees))
            assert np.array_equal(TA.walk(trees, r), s["accepted"])
            checked += len(trees)
    assert checked > 100


def test_the_tree_steps_view_fields_and_the_clock_price_trees_as_tree_step_time():
    table = [0.6, 0.2]
    trees = [T.EAGLE_TREE, T.from_widths([2, 2]), T.chain(0), T.chain(3), T.from_widths([3]), T.EAGLE_TREE]
    p = Plan(lambda v: trees[:v.batch_size], record=True)
    e = engine(p, "acceptance=ranked", f"acceptance.table={table}")
    res = e.run()
    s = p.seen[0]
    assert s["trees"] == trees and s["nodes"].tolist() == [25, 6, 0, 3, 3, 25]
    assert s["depths"].tolist() == [5, 2, 0, 3, 1, 5]
    assert s["conf"].shape == (6, 25) and np.isnan(s["conf"][2]).all()
    assert s["conf"][0, :4].tolist() == [0.6, 0.2, 0.0, 0.0] and np.isnan(s["conf"][1, 6:]).all()
    draft_s, pred_draft, verify_s, pred_verify = s["times"]   # predicted: at context_lens, the cache + 1
    assert pred_draft == pytest.approx(T.tree_draft_time(e.cost, s["ctx"], trees), rel=1e-12)
    assert pred_verify == pytest.approx(e.cost.verify_time(s["ctx"], s["nodes"]), rel=1e-12)
    kv = s["ctx"] - 1   # the clock charges the forwards over the tokens in the cache
    assert draft_s + verify_s == pytest.approx(T.tree_step_time(e.cost, kv, trees), rel=1e-12)
    assert draft_s == pytest.approx(T.tree_draft_time(e.cost, kv, trees), rel=1e-12)
    first = res.steps[0]
    cols = dict(zip(("step", "time_s", "batch_size", "max_depth", "drafted", "accepted", "emitted",
                     "verify_tokens"), first))
    assert cols["drafted"] == 62 and cols["verify_tokens"] == 68 and cols["max_depth"] == 5
    assert cols["accepted"] == int(s["accepted"].sum())


def test_tree_step_time_of_a_chain_is_the_chains_price():
    cost = build(cfg(*SMALL))["cost"]
    ctx = np.array([100, 300, 50], np.int64)
    depths = np.array([3, 1, 0], np.int64)
    trees = [T.chain(3), T.chain(1), T.chain(0)]
    assert T.tree_step_time(cost, ctx, trees) == pytest.approx(cost.step_time(ctx, depths), rel=1e-12)
    assert T.level_counts(T.EAGLE_TREE, 1).tolist() == [[4, 8, 8, 3, 2]]
    assert T.parent_counts(T.EAGLE_TREE, 1).tolist() == [[1, 4, 4, 1, 1]]
    for t in (T.EAGLE_TREE, T.chain(0), T.chain(4), T.from_widths([3, 2, 1])):   # each tree's row, kept by the tree
        par = np.unique(t.parent)
        want = np.bincount(np.where(par >= 0, t.depth[np.maximum(par, 0)], 0), minlength=t.max_depth)
        assert t.level_parents().tolist() == want[:t.max_depth].tolist() and t.level_parents() is t.level_parents()
    assert T.parent_counts([T.chain(2), T.EAGLE_TREE, T.chain(2)], 3).tolist() == [[1, 1, 0, 0, 0], [1, 4, 4, 1, 1],
                                                                                   [1, 1, 0, 0, 0]]


def test_only_oracles_see_the_rank_table():
    p = Plan(lambda v: T.chain(2), accept_prob=True)
    engine(p, "acceptance=ranked", "acceptance.table=[0.5,0.3]").run()
    assert p.seen[0][1].tolist() == [0.5, 0.3]
    q = Plan(lambda v: (q.seen.append(v.rank_table), T.chain(1))[1])
    engine(q, "acceptance=ranked").run()
    assert q.seen[0] is None


# ---- tree_fixed ------------------------------------------------------------------------------------
def test_tree_fixed_runs_end_to_end_through_the_cli(tmp_path):
    r = cli("policy=tree_fixed", "acceptance=ranked", "acceptance.table=[0.6,0.15,0.05]", "workload=closed",
            "workload.batch_size=4", "workload.output_len=48", f"hydra.run.dir={tmp_path}/run", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["policy"] == "tree_fixed" and summary["acceptance"] == "ranked"
    lines = (tmp_path / "run" / "steps.csv").read_text().splitlines()
    head = lines[0].split(",")
    first = dict(zip(head, lines[1].split(",")))
    assert (first["batch_size"], first["drafted"], first["verify_tokens"], first["max_depth"]) == ("4", "100", "104", "5")


def test_tree_fixed_widths_and_the_token_cap():
    from specdepth.policies.tree_fixed import TreeFixed
    p = TreeFixed(widths=[3, 2])
    assert p.label == "tree_fixed(widths=[3, 2])"
    res = engine(p, "acceptance=ranked", "engine.max_num_batched_tokens=30").run()   # 6 rows: 4 nodes a row fit
    assert res.steps[0][2] == 6 and res.steps[0][4] == 24 and res.steps[0][7] == 30
    assert max(row[7] for row in res.steps) <= 30
    with pytest.raises(ConfigError, match="policy.widths: tree widths must be >= 0"):
        TreeFixed(widths=[2, -1])
    with pytest.raises(ConfigError, match="policy.shape"):
        TreeFixed(shape="medusa")


def test_the_true_cost_prices_a_tree_step_as_the_clock_charges_it():
    """view.true_cost with tree_step_time: the simulator's per-step and per-position overheads included."""
    class Check(Plan):
        requires_true_cost = True

    p = Check(lambda v: (p.seen.append(T.tree_step_time(v.true_cost, v.context_lens - 1, T.EAGLE_TREE)),
                         T.EAGLE_TREE)[1])
    res = engine(p, "acceptance=ranked", "backend.step_overhead_s=0.001", "backend.position_overhead_s=0.0002").run()
    assert res.steps[1][10] + res.steps[1][11] == pytest.approx(p.seen[1], rel=1e-12)   # draft_s + verify_s
