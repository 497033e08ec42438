"""backend=hf, stochastic verification: with a draft that disagrees with the target, the emitted tokens at the
first positions follow the target's own sampling distribution (temperature, top-p), by a chi-square test."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
scipy_stats = pytest.importorskip("scipy.stats")

from specdepth.cost import ConstantCost  # noqa: E402
from specdepth.engine import Engine, EngineConfig  # noqa: E402
from specdepth.hf import HFExecutor  # noqa: E402
from specdepth.models import ModelPair  # noqa: E402
from specdepth.policies.fixed import FixedDepth  # noqa: E402
from specdepth.workload import Request  # noqa: E402

PROMPT = [3, 7, 4, 9, 5]
POSITIONS = 3          # output positions tested: 0 (prefill), 1 and 2 (speculated)
N = 3000               # samples = requests with the same prompt, in one batch


def _filtered(logits, temperature, top_p):
    """The target's own sampling distribution (independent of the backend's code)."""
    p = torch.softmax(logits.double() / temperature, -1)
    if top_p < 1:
        out = torch.zeros_like(p)
        for i in range(p.shape[0]):
            order = torch.argsort(p[i], descending=True)
            cum = 0.0
            for j in order.tolist():
                out[i, j] = p[i, j]
                cum += float(p[i, j])
                if cum >= top_p:
                    break
        p = out / out.sum(-1, keepdim=True)
    return p


def _marginals(path, V, temperature, top_p):
    """Exact marginal distribution of output tokens 0..POSITIONS-1 by enumerating every prefix."""
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    margs = []
    prefixes = {(): 1.0}
    with torch.inference_mode():
        for _ in range(POSITIONS):
            keys = list(prefixes)
            x = torch.tensor([PROMPT + list(k) for k in keys])
            p = _filtered(m(input_ids=x).logits[:, -1], temperature, top_p)
            w = torch.tensor([prefixes[k] for k in keys], dtype=torch.float64)
            margs.append((w[:, None] * p).sum(0).numpy())
            prefixes = {k + (t,): prefixes[k] * float(p[i, t]) for i, k in enumerate(keys) for t in range(V)
                        if prefixes[k] * float(p[i, t]) > 1e-9}
    return margs


def _chi2(observed, expected_p):
    exp = expected_p * observed.sum()
    big = exp >= 5
    obs_b = np.append(observed[big], observed[~big].sum())
    exp_b = np.append(exp[big], exp[~big].sum())
    if exp_b[-1] == 0:
        obs_b, exp_b = obs_b[:-1], exp_b[:-1]
    assert obs_b.sum() == observed.sum()
    return scipy_stats.chisquare(obs_b, exp_b * obs_b.sum() / exp_b.sum()).pvalue


@pytest.mark.parametrize("temperature,top_p,depth", [(1.0, 1.0, 3), (0.7, 0.8, 2)])
def test_rejection_sampling_matches_target_distribution(tiny_pair_small_vocab, temperature, top_p, depth):
    pair, V = tiny_pair_small_vocab, tiny_pair_small_vocab["vocab"]
    mp = ModelPair(target=str(pair["target"]), draft=str(pair["draft"]), dtype="float32", device="cpu")
    cost = ConstantCost(mp.target_arch, mp.draft_arch)
    cfg = EngineConfig(max_depth=depth, max_batch_size=N, max_num_batched_tokens=1 << 20, progress=False)
    ex = HFExecutor(cost=cost, model=mp, seed=11, decode=dict(temperature=temperature, top_p=top_p), engine=cfg)
    reqs = [Request(i, 0.0, len(PROMPT), POSITIONS, prompt_ids=list(PROMPT)) for i in range(N)]
    res = Engine(FixedDepth(depth), ex, cost, cfg, reqs).run()
    out = np.array([g["output_ids"] for g in res.extra["generations.jsonl"]])
    assert out.shape == (N, POSITIONS)
    drafted = sum(r[10] for r in res.requests)
    accepted = sum(r[11] for r in res.requests)
    assert 0.05 < accepted / drafted < 0.9, "the draft should disagree with the target, but not always"
    margs = _marginals(str(pair["target"]), V, temperature, top_p)
    for j in range(POSITIONS):
        obs = np.bincount(out[:, j], minlength=V).astype(float)
        pv = _chi2(obs, margs[j])
        assert pv > 0.01, f"position {j}: chi-square p = {pv:.3g}; observed {obs.tolist()} vs {(margs[j] * N).round(1).tolist()}"


def test_sampling_seeded_reproducible(tiny_pair_small_vocab):
    pair = tiny_pair_small_vocab
    outs = []
    for _ in range(2):
        mp = ModelPair(target=str(pair["target"]), draft=str(pair["draft"]), dtype="float32", device="cpu")
        cost = ConstantCost(mp.target_arch, mp.draft_arch)
        cfg = EngineConfig(max_depth=3, progress=False)
        ex = HFExecutor(cost=cost, model=mp, seed=5, decode=dict(temperature=1.0, top_p=1.0), engine=cfg)
        reqs = [Request(i, 0.0, 5, 12, prompt_ids=list(PROMPT)) for i in range(4)]
        res = Engine(FixedDepth(3), ex, cost, cfg, reqs).run()
        outs.append([g["output_ids"] for g in res.extra["generations.jsonl"]])
    assert outs[0] == outs[1]
    assert len({tuple(o) for o in outs[0]}) > 1
