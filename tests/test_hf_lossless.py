"""backend=hf, greedy: speculative decoding emits exactly the target's own greedy output, for every built-in
policy, batch size and prompt length; ragged depths share one verify; the KV caches hold exactly the
accepted tokens."""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from conftest import compose, hf_overrides  # noqa: E402
from specdepth.app import CONF_DIR, run  # noqa: E402
from specdepth.cost import ConstantCost  # noqa: E402
from specdepth.engine import Engine, EngineConfig  # noqa: E402
from specdepth.hf import HFExecutor  # noqa: E402
from specdepth.models import ModelPair  # noqa: E402
from specdepth.policy import Policy  # noqa: E402
from specdepth.workload import Request  # noqa: E402


def _policies():
    """Every policy config in conf/policy, except the simulator-only ones (oracles). The flags are read from
    an instance of each preset: a policy may set them per instance (goodput's requires_true_cost is a property
    of its `cost` parameter)."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    out = []
    for f in sorted(Path(CONF_DIR, "policy").glob("*.yaml")):
        pol = instantiate(OmegaConf.load(f))
        if not any(getattr(pol, k, False) for k in ("requires_oracle", "requires_accept_prob", "requires_true_cost")):
            out.append(f.stem)
    return out


POLICIES = _policies()


def test_every_non_oracle_preset_is_checked():
    assert {"goodput", "tree_goodput", "confidence", "batch_scaled", "tree_fixed"} <= set(POLICIES)
    assert not {"oracle", "oracle_expected", "oracle_causal", "tree_oracle"} & set(POLICIES)


@lru_cache(maxsize=None)
def _target(path):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@lru_cache(maxsize=None)
def _greedy(path, prompt: tuple, n: int) -> list:
    m = _target(str(path))
    with torch.inference_mode():
        out = m.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None,
                         pad_token_id=0)
    return out[0, len(prompt):].tolist()


def _check_greedy(pair, run_dir):
    gens = [json.loads(line) for line in (Path(run_dir) / "generations.jsonl").read_text().splitlines()]
    reqs = {int(r["request_id"]): r for r in _read_csv(Path(run_dir) / "requests.csv")}
    assert len(gens) == len(reqs)
    for g in gens:
        n = int(reqs[g["request_id"]]["output_len"])
        assert len(g["output_ids"]) == n
        assert g["output_ids"] == _greedy(pair["target"], tuple(g["prompt_ids"]), n), f"request {g['request_id']}"
    return gens


def _read_csv(path):
    import csv
    with open(path) as f:
        return list(csv.DictReader(f))


def test_policies_found():
    assert {"none", "fixed", "confidence", "batch_scaled"} <= set(POLICIES)


@pytest.mark.parametrize("batch", [1, 3, 8])
@pytest.mark.parametrize("policy", POLICIES)
def test_greedy_equals_target_generate(tiny_pair, tmp_path, policy, batch):
    cfg = compose(hf_overrides(
        tiny_pair, f"policy={policy}", f"workload.batch_size={batch}", "workload=closed",
        "workload.prompt_len={dist:uniform,low:2,high:14}", "workload.output_len={dist:uniform,low:5,high:14}",
        f"seed={batch}"))
    s = run(cfg, tmp_path)
    gens = _check_greedy(tiny_pair, tmp_path)
    assert len({len(g["prompt_ids"]) for g in gens}) > 1 or batch == 1
    assert s["backend"] == "hf" and s["output_tokens"] == sum(len(g["output_ids"]) for g in gens)
    assert s["accepted_tokens"] <= s["draft_tokens"]
    for f in ("summary.json", "steps.csv", "requests.csv", "acceptance_trace.jsonl", "generations.jsonl"):
        assert (tmp_path / f).is_file()


def test_continuous_batching_lossless(tiny_pair, tmp_path):
    """7 requests, at most 3 running: new requests join with their prefill as others finish."""
    cfg = compose(hf_overrides(
        tiny_pair, "policy=fixed", "policy.depth=3", "workload=poisson", "workload.rate=1e6",
        "workload.num_requests=7", "engine.max_batch_size=3", "workload.prompt_len={dist:uniform,low:2,high:10}",
        "workload.output_len={dist:uniform,low:3,high:16}"))
    run(cfg, tmp_path)
    _check_greedy(tiny_pair, tmp_path)
    steps = _read_csv(tmp_path / "steps.csv")
    assert max(int(s["batch_size"]) for s in steps) == 3
    admitted_late = [s for s in steps if int(s["admitted"]) and int(s["step"]) > 0]
    assert admitted_late, "no request joined a running batch"


class Staggered(Policy):
    """Row i drafts i mod 5 tokens: different depths (0 to 4) within one step."""
    name = "staggered"

    def plan(self, view):
        return (np.arange(view.batch_size) % 5).astype(np.int64)


def _executor(pair, engine_cfg, **decode):
    mp = ModelPair(target=str(pair["target"]), draft=str(pair["draft"]), dtype="float32", device="cpu")
    cost = ConstantCost(mp.target_arch, mp.draft_arch)
    return HFExecutor(cost=cost, model=mp, seed=0, decode=dict(temperature=0.0, top_p=1.0, **decode),
                      engine=engine_cfg), cost


def _spy(ex, log):
    verify, draft = ex.verify, ex.draft

    def v(drafted):
        calls = ex.tr.calls
        out = verify(drafted)
        log.append(dict(drafted=drafted.copy(), accepted=out[0].copy(), target_calls=ex.tr.calls - calls,
                        state=ex.cache_state()))
        return out

    def d(rows, position):
        calls = ex.dr.calls
        out = draft(rows, position)
        assert ex.dr.calls - calls == 1   # one batched draft forward per position
        return out

    ex.verify, ex.draft = v, d


def test_ragged_depths_in_one_verify_and_cache_lengths(tiny_pair):
    cfg = EngineConfig(max_depth=4, progress=False)
    ex, cost = _executor(tiny_pair, cfg)
    rng = np.random.default_rng(1)
    reqs = [Request(i, 0.0, int(p), 40, prompt_ids=rng.integers(3, 64, int(p)).tolist())
            for i, p in enumerate([3, 9, 5, 12, 7, 4])]
    log = []
    _spy(ex, log)
    res = Engine(Staggered(), ex, cost, cfg, reqs).run()
    ragged = [e for e in log if len(set(e["drafted"][e["drafted"] > 0].tolist())) > 1]
    assert ragged, "no verify had different depths"
    assert all(e["target_calls"] == 1 for e in log)           # one target forward per step
    for e in log:
        st = e["state"]
        assert (st["target"] == st["length"] - 1).all()         # target cache = the accepted tokens exactly
        assert (st["draft"] <= st["length"]).all()
        # memory is bounded by the longest sequence, not by the tokens ever verified
        assert st["allocated_target"] <= 2 * (max(r.prompt_len for r in reqs) + 40 + 4 + 2)
    verified = sum(len(r.prompt_ids) for r in reqs) + sum(int(e["drafted"].sum()) + e["drafted"].size for e in log)
    assert log[-1]["state"]["allocated_target"] < verified / len(reqs)
    gens = res.extra["generations.jsonl"]
    for g in gens:
        assert g["output_ids"] == _greedy(tiny_pair["target"], tuple(g["prompt_ids"]), 40)
    drafted = sum(int(e["drafted"].sum()) for e in log)
    accepted = sum(int(e["accepted"].sum()) for e in log)
    assert 0 < accepted < drafted


@pytest.mark.slow
def test_long_generation_cache_stays_bounded(tiny_pair):
    """A long generation with many rejections: the cache never holds rejected slots beyond the buffer's
    fixed slack (the allocation is set by the longest sequence, not by steps)."""
    cfg = EngineConfig(max_depth=6, progress=False)
    ex, cost = _executor(tiny_pair, cfg)
    from specdepth.policies.fixed import FixedDepth
    reqs = [Request(0, 0.0, 4, 160, prompt_ids=[5, 6, 7, 8]), Request(1, 0.0, 6, 60, prompt_ids=[9] * 6)]
    log = []
    _spy(ex, log)
    Engine(FixedDepth(6), ex, cost, cfg, reqs).run()
    rejected = sum(int((e["drafted"] - e["accepted"]).sum()) for e in log)
    assert rejected > 60
    for e in log:
        st = e["state"]
        assert (st["target"] == st["length"] - 1).all()
        assert st["allocated_target"] <= 2 * (4 + 160 + 6 + 2)


def test_cache_buffer_length_follows_the_longest_sequence():
    """The buffer length is slots(longest sequence), whatever order the cache grew in, so specdepth-profile's
    forward at a context runs over the buffer the executor's cache has at that context (issue 15: the buffer's
    length, not only the slots read, changes a forward's time)."""
    from specdepth.hf_runner import SlotCache, slots
    assert [slots(n) for n in (1, 64, 65, 129, 257)] == [64, 64, 128, 256, 512]
    walked, fresh = SlotCache(4, 1024), SlotCache(4, 1024)
    for n in (1, 64, 65, 100, 129):   # a decode from a 64-token prompt
        walked.reserve(4, n)
    fresh.reserve(4, 129)              # a profile point: context 128, one new token
    assert walked.cap_len == fresh.cap_len == 256
    capped = SlotCache(4, 300)
    capped.reserve(4, 257)
    assert capped.cap_len == 300



@pytest.mark.parametrize("group", [True, False])
def test_prefill_in_groups_of_similar_length_is_lossless(tiny_pair, tmp_path, monkeypatch, group):
    """backend.group_prefill: prompts of 3 and ~300 tokens admitted together prefill as one padded forward a
    group of similar length (the run's cost model prices that below one forward padded to 300 tokens, once
    the tiny model's fixed cost per forward is off: cost.overhead_s=0): two target forwards at the prefill,
    and the output is still exactly the target's greedy decoding. With group_prefill=false: one forward, the
    same output."""
    from specdepth.app import build
    from specdepth.executor import prefill_groups, prefill_price

    lens = (3, 300, 4, 290, 3)
    wl = tmp_path / "w.jsonl"
    wl.write_text("".join(json.dumps({"prompt_len": p, "output_len": 9}) + "\n" for p in lens))
    cfg = compose(hf_overrides(tiny_pair, "workload=file", f"workload.path={wl}", "policy=fixed", "policy.depth=2",
                               "cost.overhead_s=0", f"backend.group_prefill={str(group).lower()}"))
    groups = prefill_groups(np.array(lens), prefill_price(build(cfg)["cost"]))
    assert [g.tolist() for g in groups] == [[0, 2, 4], [1, 3]]
    calls, prefill = [], HFExecutor.prefill

    def spy(self, requests, new):
        n = self.tr.calls
        out = prefill(self, requests, new)
        calls.append(self.tr.calls - n)
        return out

    monkeypatch.setattr(HFExecutor, "prefill", spy)
    run(cfg, tmp_path / "run")
    gens = _check_greedy(tiny_pair, tmp_path / "run")
    assert sorted(len(g["prompt_ids"]) for g in gens) == sorted(lens)
    assert calls == [2 if group else 1]
