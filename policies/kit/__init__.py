"""The policy kit: the building blocks of the built-in adaptive policies, public for policies of your own.

  state        PerRequest: named per-request fields that follow rows by request id
  cost         StepCost (step-time tables from view.cost), Tables, PolicyTime, pad_extra, as_padded
  calibration  CostCalibration: the cost model corrected online by the measured step costs
  acceptance   PositionFactors, shrunk_rates, tie_bands, ConfidenceCalibration, expected_tokens
  search       uniform_depth, plan_by_position, keep_by_margin, best_prefix, draft_caps, fit_token_cap
  drain        expected_max, normal_cdf: when the last row of a draining batch is expected to finish
  kernels      the compiled loops (numba) of the kit's per-step work and of goodput, confidence and the tree
               policies: the same arithmetic as their numpy form, run instead with `COMPILED = False` in kit.search
               (the searches, the drain, CostAwareDepth, goodput, confidence), kit.depth (CostAwareDepth's chains
               fused into one call each), kit.acceptance, state, cost, calibration, idle or kit.tree (the tree
               policies); one file: numba's disk cache does not follow calls across files
  idle         IdleReplan, may_probe / thin_evidence, catch_up_s / catch_up_pays / catch_up_rows, CatchUpPadding
  depth        CostAwareDepth (one calibrated depth for the batch) and CostAwarePolicy, its Policy base
  budget       first_drafts, best_survivors: the shared token budget as a hard limit on drafts
  options      node: a nested config node with its keys checked
  tree         best_order / best_tree, RankEstimate, TreePrice, plan_trees / plan_rows: draft trees under a per-rank
               table (expected_accepted over specdepth.tree.path_probs)
"""
from .acceptance import ConfidenceCalibration, PositionFactors, expected_tokens, shrunk_rates, tie_bands
from .budget import best_survivors, first_drafts
from .calibration import CostCalibration, PaddingFit
from .cost import PolicyTime, StepCost, Tables, as_padded, every_row_deep, pad_extra, row_cost
from .depth import CostAwareDepth, CostAwarePolicy
from .drain import expected_max, normal_cdf
from .idle import (PROBE_ROUNDS, PROBE_TOKENS, CatchUpPadding, IdleReplan, catch_up_pays, catch_up_rows, catch_up_s,
                   may_probe, plan_pays_catch_up, thin_evidence)
from .search import best_prefix, draft_caps, fit_token_cap, keep_by_margin, plan_by_position, uniform_depth
from .state import PerRequest, Rows
from .tree import RankEstimate, TreePlan, TreePrice, best_order, best_tree, plan_rows, plan_trees

__all__ = [
    "CatchUpPadding", "ConfidenceCalibration", "CostAwareDepth", "CostAwarePolicy", "CostCalibration", "IdleReplan",
    "PROBE_ROUNDS", "PROBE_TOKENS", "PaddingFit", "PerRequest", "PolicyTime", "PositionFactors", "RankEstimate",
    "Rows", "StepCost", "Tables", "TreePlan", "TreePrice", "as_padded", "best_order", "best_prefix", "best_survivors",
    "best_tree", "catch_up_pays", "catch_up_rows", "catch_up_s", "draft_caps", "every_row_deep", "expected_max",
    "expected_tokens", "first_drafts", "fit_token_cap", "keep_by_margin", "may_probe", "normal_cdf", "pad_extra",
    "plan_by_position", "plan_rows", "plan_trees", "plan_pays_catch_up", "row_cost", "shrunk_rates", "thin_evidence",
    "tie_bands", "uniform_depth"
]
