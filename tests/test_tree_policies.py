"""The adaptive tree policies (tree_goodput, tree_confidence, tree_oracle): their rules on hand-made views, and
tree_goodput against the oracle and the best static tree on a small simulator cell; the study's script on a
tiny grid."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from conftest import compose
from specdepth.app import build
from specdepth.errors import ConfigError
from specdepth.metrics import summarize
from specdepth.policies import TreeConfidence, TreeGoodput, TreeOracle
from test_policies_zoo import make_view

ROOT = Path(__file__).resolve().parents[1]


def test_tree_confidence_deepens_where_sure_and_widens_where_unsure():
    p = TreeConfidence(max_nodes=8, max_depth=8)
    v = make_view(2, budget=2 + 2 * 8)                 # (token_budget - batch) // batch = 8 nodes a row
    p._conf.align(v.request_ids).conf[:] = [0.95, 0.3]
    sure, unsure = p.plan(v)
    assert sure.nodes == unsure.nodes == 8
    assert sure.is_chain and sure.max_depth == 8
    assert unsure.max_depth < 4 and int((unsure.parent == -1).sum()) >= 3
    v = make_view(2, budget=2)                           # no budget left: one node a row (the seed's rule)
    assert [t.nodes for t in p.plan(v)] == [1, 1]


def test_tree_policies_check_their_parameters():
    with pytest.raises(ConfigError, match="policy.cost"):
        TreeGoodput(cost="fast")
    with pytest.raises(ConfigError, match="policy.estimate.unknown"):
        TreeGoodput(estimate={"unknown": 1})
    with pytest.raises(ConfigError, match="policy.max_nodes"):
        TreeOracle(max_nodes=-1)
    with pytest.raises(ConfigError, match="policy.resolution"):
        TreeConfidence(resolution=0.0)


def _cell(policy: str, seed: int, **keys) -> float:
    cfg = compose("workload=closed", "workload.batch_size=16", "engine.max_batch_size=8", "workload.output_len=64",
                  "workload.prompt_len=256", "acceptance=ranked", "acceptance.alpha=0.6", "acceptance.decay=0.3",
                  f"policy={policy}", f"seed={seed}", *[f"{k}={v}" for k, v in keys.items()])
    return summarize(build(cfg)["engine"].run())["throughput_tok_s"]


def test_tree_goodput_near_the_oracle_and_above_chains_on_a_small_cell():
    """Averaged over 3 outcome replicates: within 2 % of tree_oracle, above goodput (chains) and fixed chains."""
    mean = {p: np.mean([_cell(p, s) for s in range(3)]) for p in ("tree_goodput", "tree_oracle", "goodput")}
    chains = max(np.mean([_cell("fixed", s, **{"policy.depth": k}) for s in range(3)]) for k in (1, 2, 3))
    assert mean["tree_goodput"] >= 0.98 * mean["tree_oracle"]
    assert mean["tree_goodput"] > max(mean["goodput"], chains)


def test_tree_oracle_is_simulator_only_and_needs_a_rank_table():
    cfg = compose("workload=closed", "workload.batch_size=2", "workload.output_len=8", "acceptance=confidence",
                  "policy=tree_oracle")
    with pytest.raises(Exception, match="tree_oracle needs .* acceptance=ranked or iid"):
        build(cfg)["engine"].run()


def test_the_study_script_on_a_tiny_grid(tmp_path):
    path = ROOT / "experiments" / "trees" / "run_trees.py"
    spec = importlib.util.spec_from_file_location("run_trees_study", path)
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(mod)
        mod.main(["--out", str(tmp_path), "--seeds", "1", "--batches", "2", "--profiles", "mid",
                  "--deployments", "llama3_8b_h100_sxm", "--output-len", "8"])
    finally:
        sys.path.remove(str(path.parent))
    cells = (tmp_path / "cells.csv").read_text().splitlines()
    assert len(cells) == 2 and cells[0].startswith("deployment,profile,batch")
    assert (tmp_path / "trees.png").stat().st_size > 0 and "tree_goodput" in (tmp_path / "cells.md").read_text()
    runs = (tmp_path / "runs.csv").read_text().splitlines()
    assert len(runs) == 1 + len(mod.policies(np.array([0.6, 0.2])))


@pytest.mark.parametrize("batch", [1, 3])
def test_tree_goodput_greedy_equals_the_target_on_backend_hf(tiny_pair, tmp_path, batch):
    """tree_goodput drafts trees on the real backend, and greedy outputs are the target's alone, ragged batches included."""
    from conftest import hf_overrides
    from specdepth.app import run
    from test_hf_lossless import _check_greedy
    cfg = compose(hf_overrides(tiny_pair, "policy=tree_goodput", f"workload.batch_size={batch}", "workload=closed",
                               "workload.prompt_len={dist:uniform,low:2,high:14}",
                               "workload.output_len={dist:uniform,low:5,high:14}", f"seed={batch}"))
    s = run(cfg, tmp_path)
    _check_greedy(tiny_pair, tmp_path)
    assert s["draft_tokens"] > 0
