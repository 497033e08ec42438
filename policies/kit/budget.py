"""The shared token budget (view.verify_tokens_free: verify tokens the engine's `token_budget` leaves after one a
row) as a hard limit on drafts: who gets the first drafts, and who goes on while drafting."""
from __future__ import annotations

import numpy as np


def first_drafts(depths: np.ndarray, view, k: int) -> np.ndarray:
    """Where the budget cannot give every row a draft, one draft each to the rows with the highest acceptance
    estimates (view.acceptance; ties by row), none to the others; else `depths` as they are."""
    free, n = view.verify_tokens_free, view.batch_size
    if free >= n:
        return depths
    out = np.zeros_like(depths)
    if free > 0 and k > 0:
        out[np.argsort(-view.acceptance, kind="stable")[:free]] = 1
    return out


def best_survivors(keep: np.ndarray, survival: np.ndarray, view) -> np.ndarray:
    """While drafting: where the rows that would go on overflow the budget left, only those with the highest
    `survival` (e.g. the product of their confidences so far) go on."""
    room = view.verify_tokens_free - int(view.drafted.sum())
    if keep.sum() <= room:
        return keep
    order = np.argsort(-np.where(keep, survival, -1.0), kind="stable")
    out = np.zeros_like(keep)
    out[order[:max(room, 0)]] = True
    return out
