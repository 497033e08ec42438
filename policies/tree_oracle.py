import numpy as np

from specdepth.errors import ConfigError, as_int
from specdepth.policy import Policy

from .kit import TreePrice, draft_caps, plan_rows, plan_trees


class TreeOracle(Policy):
    """Simulator only: the expected-value best tree plan per step, given the true per-rank table
    (`view.rank_table`) and the true step cost (`view.true_cost`, what the simulator's clock charges).

    Rule: `tree_goodput`'s search with what that policy estimates replaced by the truth: every depth cap up to
    `max_depth`, every node count per row up to `max_nodes`, in `fractions` steps (a fraction of the rows one
    node more), of the best-first trees (`kit.plan_trees`: the N nodes of highest true path probability are the
    best N-node tree); the plan with the most expected emitted tokens per second of the step. Myopic (one step
    at a time, no drain), so a bound on the per-step choice, not on end-to-end throughput.
    Budget: the true cost model (draft forwards level by level, nodes as verify tokens); the hard cap bounds N.
    Parameters: `max_nodes`, `max_depth`, `fractions`.
    """

    name = "tree_oracle"
    depth_param = "max_depth"
    requires_accept_prob = True
    requires_true_cost = True

    def __init__(self, max_nodes: int = 64, max_depth: int = 16, fractions: int = 16):
        self.max_nodes = as_int(max_nodes, "policy.max_nodes", min=0)
        self.max_depth = as_int(max_depth, "policy.max_depth", min=0)
        self.fractions = as_int(fractions, "policy.fractions", min=1)
        self.reset()

    def reset(self):
        self._price, self._trees = TreePrice(), {}

    def plan(self, view):
        n = view.batch_size
        D = min(self.max_depth, view.max_depth)
        N = min(self.max_nodes, (view.max_num_batched_tokens - n) // n)
        if view.rank_table is None:
            raise ConfigError("tree_oracle needs the simulator's true per-rank table (view.rank_table): run it with "
                              "acceptance=ranked or iid")
        if D <= 0 or N <= 0:
            return np.zeros(n, np.int64)
        price = self._price.update(view.true_cost, view.context_lens)
        plan = plan_trees(np.asarray(view.rank_table), price, n, N, D, steps=self.fractions)
        if plan.nodes == 0:
            return np.zeros(n, np.int64)
        if len(self._trees) > 4096:
            self._trees.clear()
        return plan_rows(plan, draft_caps(view, D), self._trees)
