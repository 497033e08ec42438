"""Lossless verification as pure functions (the real backend's decision rule, tested on its own).

Greedy (temperature 0): accept the longest prefix of drafts equal to the target's argmax at each
position, then emit the target's token at the first mismatch (the correction) or after the last draft
(the bonus token). The output equals the target's own greedy decoding.

Sampling (temperature > 0): with p the target's and q the draft's distributions at each draft position,
accept draft token x with probability min(1, p(x) / q(x)); at the first rejection sample the correction
from norm(max(0, p - q)) and stop; if every draft is accepted, sample a bonus token from p at the next
position (Leviathan et al. 2023; Chen et al. 2023). The output is distributed as the target's own samples.
"""
from __future__ import annotations

import numpy as np


def distribution(logits, temperature: float, top_p: float = 1.0):
    """softmax(logits / temperature) restricted to the smallest top-p prefix (at least one token),
    float32, over the last dim."""
    import torch
    x = logits.float() / temperature
    if top_p < 1.0:
        srt, idx = torch.sort(x, dim=-1, descending=True)
        pr = torch.softmax(srt, dim=-1)
        cum = torch.cumsum(pr, dim=-1)
        drop = (cum - pr) >= top_p   # keep the smallest prefix reaching top_p (at least one)
        srt = srt.masked_fill(drop, float("-inf"))
        x = torch.full_like(x, float("-inf")).scatter(-1, idx, srt)
    return torch.softmax(x, dim=-1)


def sample(probs, generator):
    """One token per row from probs [..., V]."""
    import torch
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def greedy(drafts: np.ndarray, drafted: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """drafts [n, K] the draft tokens (row i's first drafted[i] are real), target [n, K + 1] the target's
    argmax after the last known token and after each draft. Returns (accepted drafts per row, the token
    emitted after them: the correction at the first mismatch, or the bonus token)."""
    n, K = drafts.shape
    ar = np.arange(n)
    if K == 0:
        return np.zeros(n, np.int64), target[ar, 0]
    valid = np.arange(K)[None, :] < drafted[:, None]
    match = (drafts == target[:, :K]) & valid
    a = np.cumprod(match, axis=1).sum(axis=1).astype(np.int64)
    return a, target[ar, a]


def rejection(p, q, drafts, drafted: np.ndarray, generator):
    """The lossless rejection rule over a batch. p [n, K + 1, V] target probabilities (after the last known
    token and after each draft), q [n, K, V] the draft's probabilities at its K positions, drafts [n, K]
    (a LongTensor), drafted [n] how many of row i's drafts are real. Returns (accepted drafts per row as a
    LongTensor, the token emitted after them). Uniforms and samples come from `generator`, in that order."""
    import torch
    n, K = drafts.shape
    dev = p.device
    rr = torch.arange(n, device=dev)
    a = torch.zeros(n, dtype=torch.long, device=dev)
    qa = None
    if K:
        pd = p[:, :K].gather(-1, drafts[..., None]).squeeze(-1)
        qd = q[:, :K].gather(-1, drafts[..., None]).squeeze(-1)
        u = torch.rand((n, K), generator=generator, device=dev)
        real = torch.from_numpy(np.arange(K)[None, :] < drafted[:, None]).to(dev)
        accept = (u * qd < pd) & real                         # u < p / q, without dividing by q
        a = torch.cumprod(accept.long(), dim=1).sum(dim=1)
        k = torch.from_numpy(np.asarray(drafted, np.int64)).to(dev)
        qa = q[rr, a.clamp(max=K - 1)] * (a < k)[:, None].float()   # q at the rejected position, 0 if none
    pa = p[rr, a]
    if qa is None:
        return a, sample(pa, generator)
    residual = (pa - qa).clamp_(min=0)
    mass = residual.sum(-1, keepdim=True)
    residual = torch.where(mass > 0, residual, pa)   # p == q exactly: the residual is empty, p is the answer
    return a, sample(residual, generator)
