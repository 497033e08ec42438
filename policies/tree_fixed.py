import numpy as np

from specdepth import tree
from specdepth.errors import ConfigError, as_choice
from specdepth.policy import Policy


class TreeFixed(Policy):
    """Every sequence drafts the same static tree every step (Medusa's and EAGLE's static trees).

    Rule: the tree is `widths` (the product tree of candidates per level, tree.from_widths) when given, else
    `shape`: `eagle` is EAGLE's default 25-node, depth-5 tree (tree.EAGLE_CHOICES).
    Budget: like `fixed`, it ignores the shared token budget and pays for it in step time; only the hard
    cap binds: when batch_size x (1 + nodes) exceeds engine.max_num_batched_tokens, every row drafts the
    tree's first (cap - batch_size) // batch_size nodes in node order (by depth, then rank path: still a
    tree, the likeliest nodes kept), which is nothing when the batch alone fills the cap.
    Runs where the backend runs tree plans (backend=sim with acceptance=ranked or iid; backend=hf, lossless,
    or in timing mode with those models); a chain shape (widths [1, 1, ...]) runs everywhere, as `fixed`.
    """

    name = "tree_fixed"
    SHAPES = {"eagle": tree.EAGLE_CHOICES}

    def __init__(self, shape: str = "eagle", widths=None):
        self.shape = as_choice(shape, "policy.shape", tuple(self.SHAPES))
        self.widths = None if widths is None else list(widths)
        try:
            self._tree = (tree.from_choices(self.SHAPES[self.shape]) if widths is None
                          else tree.from_widths(self.widths))
        except (TypeError, ValueError) as e:
            raise ConfigError(f"policy.widths: {e}") from None
        self.reset()

    def reset(self):
        self._key, self._plan = None, None

    def plan(self, view):
        n, cap = view.batch_size, view.max_num_batched_tokens
        if (n, cap) != self._key:   # the same answer while the batch size holds
            room = max(0, cap - n) // n
            t = self._tree if room >= self._tree.nodes else _first_nodes(self._tree, room)
            self._plan = t if not t.is_chain else np.full(n, t.nodes, np.int64)
            self._key = (n, cap)
        return self._plan


def _first_nodes(t: tree.Tree, k: int) -> tree.Tree:
    """The tree of t's first k nodes in node order (a parent precedes its children: still a tree)."""
    return tree.from_parents(t.parent[:k])
