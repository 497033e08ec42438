import operator

import numpy as np

from specdepth.errors import as_bool, as_choice, as_float, as_int
from specdepth.policy import Policy
from specdepth.tree import by_object

from .kit import CostCalibration, RankEstimate, TreePrice, draft_caps, plan_rows, plan_trees
from .kit.tree import RankConfidence, pair_groups
from .kit.options import node

ESTIMATE = {"ranks": 8, "prior_strength": 50.0, "memory": 5000.0, "every": 0.02, "confidence": True}


class TreeGoodput(Policy):
    """Goodput for draft trees: per step, the depth cap and node count per row whose best trees give the most
    expected emitted tokens per predicted second of the step.

    Rule: estimate the per-rank table from the rows' trees and accepted path lengths (`kit.RankEstimate`, EM),
    its prior the draft's mean confidence per rank (`kit.tree.RankConfidence`; `estimate.confidence`; ranks
    never drafted, or confidence off: the geometric table of view.acceptance_prior); each row's best tree of N nodes is the N nodes of
    highest path probability (`kit.best_order`); search each depth cap D <= `max_depth` and N <= `max_nodes`
    (a fraction of the rows one node more, in `fractions` steps) for the most n (1 + E[accepted]) / step
    seconds (`kit.plan_trees`), and cut each row's tree at its remaining tokens. N = 0: no speculation.
    Budget: the cost model prices every plan as the simulator's clock does (draft forwards level by level,
    nodes as verify tokens; `kit.TreePrice`), corrected online by `kit.CostCalibration` (`cost: calibrated`;
    `model`: as is; `clock`: the simulator's true cost); the engine's hard cap bounds N.
    Parameters: `max_nodes`, `max_depth`, `cost`, `fractions`; nodes `estimate` (ranks, prior_strength,
    memory, every: RankEstimate's; confidence) and `calibration` (memory).
    """

    name = "tree_goodput"
    depth_param = "max_depth"

    def __init__(self, max_nodes: int = 64, max_depth: int = 16, cost: str = "calibrated", fractions: int = 8,
                 estimate=None, calibration=None):
        self.max_nodes = as_int(max_nodes, "policy.max_nodes", min=0)
        self.max_depth = as_int(max_depth, "policy.max_depth", min=0)
        self.cost = as_choice(cost, "policy.cost", {"model", "calibrated", "clock"})
        self.fractions = as_int(fractions, "policy.fractions", min=1)
        e = node(estimate, "policy.estimate", ESTIMATE)
        self._est = (as_int(e.ranks, "policy.estimate.ranks", min=1),
                    as_float(e.prior_strength, "policy.estimate.prior_strength", min=0, min_open=True),
                    as_float(e.memory, "policy.estimate.memory", min=1), as_float(e.every, "policy.estimate.every", min=0))
        self._use_confidence = as_bool(e.confidence, "policy.estimate.confidence")
        c = node(calibration, "policy.calibration", {"memory": 200.0})
        self._cal_memory = as_float(c.memory, "policy.calibration.memory", min=1)
        self.reset()

    @property
    def requires_true_cost(self):
        return self.cost == "clock"

    def reset(self):
        ranks, strength, memory, every = self._est
        self._table = RankEstimate(ranks=ranks, strength=strength, memory=memory, every=every)
        self._conf = RankConfidence(ranks=ranks, memory=memory)
        self._calib = CostCalibration(memory=self._cal_memory)
        self._price = TreePrice(self._calib if self.cost == "calibrated" else None)
        self._trees = {}
        self._geometric = (None, None)
        self._rounded = (None, None, None, None)   # _plan_table's key, its table, the arrays keyed by id, prior
        self._planned = None   # the last plan's rows and plan_rows' pairs

    def table(self, view) -> np.ndarray:
        """The per-rank table the plan values trees by."""
        self._table.start(self._prior(view))
        return self._table.table

    def _prior(self, view):
        """The estimate's prior: the confidence's table (the geometric table of view.acceptance_prior where
        nothing was drafted), or that rate where confidence is off."""
        a, R = view.acceptance_prior, self._table.ranks
        if not self._use_confidence:
            return a
        if self._geometric[0] != (a, R):   # computed once per prior
            self._geometric = ((a, R), a * (1.0 - a) ** np.arange(R))
        return self._conf.table_now(self._geometric[1])

    def _plan_table(self, view) -> np.ndarray:
        """`table` rounded to 0.005 (the same trees, and cached orders, while it holds); kept while its inputs
        hold: the prior, the confidence's sums and counts (the same arrays, not observed since) and the estimate's
        hits and trials (the same arrays: its refresh makes new ones; the arrays are held with the key). The prior
        is kept while its part of the key holds."""
        c, e, old = self._conf, self._table, self._rounded
        held = (c.sums, c.counts, e.hits, e.trials)
        key = (view.acceptance_prior, c.version, *map(id, held))
        if old[0] != key:
            prior = old[3] if old[0] is not None and old[0][:4] == key[:4] else self._prior(view)
            self._rounded = (key, self._table.start_rounded(prior, 200.0), held, prior)
            self._rounded[1].flags.writeable = False
        return self._rounded[1]

    def plan(self, view):
        n = view.batch_size
        D = min(self.max_depth, view.max_depth)
        N = min(self.max_nodes, (view.max_num_batched_tokens - n) // n)
        if D <= 0 or N <= 0:
            return np.zeros(n, np.int64)
        price = self._price.update(view.true_cost if self.cost == "clock" else view.cost, view.context_lens)
        plan = plan_trees(self._plan_table(view), price, n, N, D, steps=self.fractions)
        if plan.nodes == 0:
            return np.zeros(n, np.int64)
        if len(self._trees) > 4096:
            self._trees.clear()
        pairs = []
        self._planned = (plan_rows(plan, draft_caps(view, D), self._trees, pairs), pairs)
        return self._planned[0]

    def observe(self, view, accepted):
        if self.cost == "calibrated":
            self._calib.observe(view)
        trees = view.trees
        if trees is None:   # a chain step (every row's tree a chain, or nothing drafted)
            return self._table.observe_chains(view.drafted, accepted)
        p = self._planned   # the rows' Tree objects, for both: as planned where these are the planned objects
        if p is not None and len(trees) == len(p[0]) and all(map(operator.is_, trees, p[0])):
            groups = pair_groups(*p[1])
        else:
            groups = by_object(trees, view.batch_size)
        if self._use_confidence:
            self._conf.observe_groups(groups, view.node_confidences)
        self._table.observe_groups(groups, accepted)
