"""Lossless verification of draft trees as pure functions (the tree counterpart of verify.py).

Shapes follow tree.pack: each row's tree padded to Q queries, query 0 the root, query 1 + i node i; tokens
[n, Q - 1] the draft token of each node (anything at padding).

Greedy (temperature 0): a node is accepted when its parent is (the root always is) and its token equals
the target's argmax at its parent. The accepted path is the deepest accepted node's path (the first such
node in node order when several are equally deep: siblings with equal tokens); the emitted token is the
target's argmax at its end (the correction, or the bonus token after a leaf). With distinct siblings at
most one child of a node matches, so the path is unique and the output equals the target's own greedy
decoding, as for a chain.

Sampling (temperature > 0): SpecInfer's multi-step speculative sampling (Miao et al., ASPLOS 2024: its
stochastic verification), the variant with replacement (no update of q): starting at the root with the
target's distribution p there, the node's children are tried in node order (SpecInfer picks them at
random; each try is one-draft speculative sampling against the current residual, so any order is
lossless); child c with token x, drawn from q_c, is accepted with probability
min(1, p(x) / q_c(x)); on rejection p <- norm(max(0, p - q_c)) and the next child is tried; an accepted
child becomes the current node, with p the target's distribution after it. When every child is rejected
(or the node is a leaf) the emitted token is sampled from the current p (the residual, or the target's
distribution at the last accepted node: the bonus token). Lossless when each child's token is drawn from
its q_c independently of its siblings given the path: i.i.d. samples of the draft at the parent (q_c the
draft's distribution there), or tokens the draft picks deterministically such as its top-k (q_c then
one-hot at the token: accepted with probability p(x), and x removed from the residual). Top-k children
with q_c the draft's softmax are NOT lossless.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from . import verify
from .tree import Tree, children_table, pack, rows


def _path(par: np.ndarray, end: np.ndarray, length: np.ndarray) -> np.ndarray:
    """int64 [n, max(length)]: the node indices (0-based) from the root's child down to query end[i] - 1,
    -1 past each row's length."""
    n = end.size
    D = int(length.max(initial=0))
    out = np.full((n, D), -1, np.int64)
    cur = end.copy()
    rr = np.arange(n)
    for d in range(D - 1, -1, -1):
        on = length > d
        out[on, d] = cur[on] - 1
        cur = np.where(on, par[rr, cur], cur)
    return out


def kept_slots(context: np.ndarray, path: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where the accepted path's KV goes after verification: (source slot, destination slot) int64 [n, D],
    -1 past each row's path. Node x of the path sits at slot context + 1 + x and moves to context + d for
    the path's d-th node (1-based), right after the root, so a row's cache holds context + 1 + accepted
    slots; every other node's slot is free. On a chain source equals destination."""
    ctx = np.asarray(context, np.int64)[:, None]
    on = path >= 0
    src = np.where(on, ctx + 1 + path, -1)
    dst = np.where(on, ctx + 1 + np.arange(path.shape[1])[None, :], -1)
    return src, dst


def greedy(trees: Tree | Sequence[Tree], tokens: np.ndarray,
           target: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """tokens [n, Q - 1] the nodes' draft tokens, target [n, Q] the target's argmax at each query. Returns
    (accepted nodes per row, the accepted path as node indices [n, D] padded with -1, the emitted token)."""
    par, depth, real = pack(rows(trees, target.shape[0]), target.shape[1])
    n, Q = par.shape
    rr = np.arange(n)
    acc = np.zeros((n, Q), bool)
    acc[:, 0] = True
    for j in range(1, Q):
        p = np.maximum(par[:, j], 0)
        acc[:, j] = real[:, j] & acc[rr, p] & (tokens[:, j - 1] == target[rr, p])
    score = np.where(acc, depth, -1)
    end = score.argmax(axis=1)   # the deepest accepted query, the first one on ties
    a = depth[rr, end]
    return a, _path(par, end, a), target[rr, end]


def rejection(p, q, tokens, trees: Tree | Sequence[Tree], generator):
    """SpecInfer's rule over a batch. p [n, Q, V] the target's probabilities at each query, q [n, Q - 1, V]
    the distribution each node's token was drawn from, tokens [n, Q - 1] (a LongTensor). Returns (accepted
    nodes per row, the accepted path as node indices [n, D] padded with -1, the emitted token), LongTensors.
    One uniform per node (torch.rand [n, Q - 1]), then the samples, come from `generator`, in that order."""
    import torch
    n, Q, V = p.shape
    dev = p.device
    trees = rows(trees, n)
    kids = children_table(trees, Q)   # [row, query, rank] -> child query, -1 none
    kids_t = torch.from_numpy(kids).to(dev)
    u = torch.rand((n, Q - 1), generator=generator, device=dev)
    rr = torch.arange(n, device=dev)
    cur = torch.zeros(n, dtype=torch.long, device=dev)   # the current query (0: the root)
    cur_p = p[:, 0].clone()
    active = torch.ones(n, dtype=torch.bool, device=dev)
    D = max((t.max_depth for t in trees), default=0)
    path = torch.full((n, D), -1, dtype=torch.long, device=dev)
    a = torch.zeros(n, dtype=torch.long, device=dev)
    for d in range(D):
        moved = torch.zeros(n, dtype=torch.bool, device=dev)
        for c in range(kids.shape[2]):
            ch = kids_t[rr, cur, c]
            tried = active & ~moved & (ch > 0)
            if not bool(tried.any()):
                continue
            node = (ch - 1).clamp(min=0)
            x = tokens[rr, node]
            qc = q[rr, node]                                             # [n, V]
            qx, px = qc.gather(-1, x[:, None]).squeeze(-1), cur_p.gather(-1, x[:, None]).squeeze(-1)
            ok = tried & (u[rr, node] * qx < px)                          # u < p / q, without dividing by q
            rej = tried & ~ok
            res = (cur_p - qc).clamp(min=0)
            mass = res.sum(-1, keepdim=True)
            res = torch.where(mass > 0, res / mass.clamp(min=1e-30), cur_p)   # p == q_c: nothing to remove
            cur_p = torch.where(rej[:, None], res, cur_p)
            cur_p = torch.where(ok[:, None], p[rr, ch.clamp(min=0)], cur_p)
            cur = torch.where(ok, ch, cur)
            path[ok, d] = node[ok]
            moved |= ok
        active &= moved
        a += active.long()
    return a, path, verify.sample(cur_p, generator)
