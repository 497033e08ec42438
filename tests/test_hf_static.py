"""backend.static_shapes: the static-shape forward path (fixed buffers, row buckets, preallocated KV cache,
graphs captured once and replayed; on a CPU the eager `GraphStandIn` replays them) emits exactly the tokens of
the dynamic path, for every policy, greedy and sampled, on ragged batches and under continuous batching."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from conftest import compose, hf_overrides  # noqa: E402
from specdepth.app import run  # noqa: E402
from specdepth.errors import BackendError, ConfigError  # noqa: E402
from specdepth.hf_runner import Runner  # noqa: E402
from specdepth.hf_static import GraphStandIn, StaticRunner, resolve_mode, row_bucket  # noqa: E402
from test_hf_lossless import POLICIES, _check_greedy  # noqa: E402

RAGGED = ("workload=poisson", "workload.rate=1e6", "workload.num_requests=6", "engine.max_batch_size=3",
          "workload.prompt_len={dist:uniform,low:2,high:14}", "workload.output_len={dist:uniform,low:4,high:14}")


def _gens(run_dir) -> list:
    return [json.loads(line)["output_ids"] for line in (Path(run_dir) / "generations.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("policy", POLICIES)
def test_static_path_greedy_is_the_targets_output(tiny_pair, tmp_path, policy):
    """Greedy, every policy, ragged prompts and depths, rows joining and retiring (continuous batching, a
    bucket of 4 rows over 1-3 running ones): the graphed static path emits the target's own greedy output,
    which the dynamic path also emits (test_hf_lossless)."""
    s = run(compose(hf_overrides(tiny_pair, f"policy={policy}", *RAGGED, "backend.static_shapes=graphs", "seed=3")),
            tmp_path)
    _check_greedy(tiny_pair, tmp_path)
    st = s["static_shapes"]
    assert st["mode"] == "graphs" and st["target"]["graphs"] == "standin"
    assert st["target"]["captured"] >= 1 and st["target"]["static_forwards"] > st["target"]["captured"]
    assert st["target"]["rows"] == 4   # 3 rows at most: the bucket of 4


@pytest.mark.parametrize("policy", ["fixed", "heuristic", "none"])
@pytest.mark.parametrize("mode", ["eager", "graphs"])
def test_static_path_sampled_equals_dynamic_path(tiny_pair, tmp_path, policy, mode):
    """Sampling (temperature 1, top_p 0.9): the same random stream and the same distributions give the same
    tokens on both paths (policies whose plans do not depend on measured time)."""
    common = hf_overrides(tiny_pair, f"policy={policy}", *RAGGED, "decode.temperature=1.0", "decode.top_p=0.9",
                          "seed=5")
    run(compose(common, "backend.static_shapes=off"), tmp_path / "off")
    s = run(compose(common, f"backend.static_shapes={mode}"), tmp_path / mode)
    assert _gens(tmp_path / mode) == _gens(tmp_path / "off")
    assert s["static_shapes"]["mode"] == mode


def test_shipped_pair_static_equals_dynamic(tmp_path):
    """The shipped tiny pair (float16 weights run in float32), fixed depth 3, greedy and sampled."""
    for temp in ("0.0", "1.0"):
        out = {}
        for mode in ("off", "graphs"):
            d = tmp_path / f"{mode}{temp}"
            run(compose("backend=hf", "model=tiny_pair", "policy=fixed", "policy.depth=3", "workload.batch_size=3",
                        "workload.output_len=24", f"decode.temperature={temp}", f"backend.static_shapes={mode}"), d)
            out[mode] = _gens(d)
        assert out["graphs"] == out["off"], temp


def _model():
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=256)
    return LlamaForCausalLM(cfg).eval()


def test_static_runner_forwards_match_the_dynamic_runner():
    """Row subsets, ragged queries, want = last / all: the same logits as Runner's (to float rounding), each
    (bucket, query, want) captured once and replayed afterwards."""
    m = _model()
    rng = np.random.default_rng(0)
    dyn, sta = Runner(m, 5, 64), StaticRunner(m, 5, 64, max_query=4, graphs="standin")
    prompt = rng.integers(0, 50, (5, 9))
    with torch.inference_mode():
        for r in (dyn, sta):
            r.forward(slice(0, 5), prompt, np.zeros(5, np.int64), None, "none")
        calls = [(slice(0, 5), (5, 2), np.full(5, 9), np.array([1, 2, 2, 1, 2]), "last"),
                 (np.array([0, 3]), (2, 1), np.array([10, 11]), None, "last"),
                 (slice(0, 5), (5, 3), np.full(5, 9), None, "all"),
                 (np.array([1, 2, 4]), (3, 1), np.array([10, 10, 11]), None, "last")]
        for _ in range(2):
            for rows, shape, lens, ql, want in calls:
                toks = rng.integers(0, 50, shape)
                a = dyn.forward(rows, toks, lens.astype(np.int64), ql, want)
                b = sta.forward(rows, toks, lens.astype(np.int64), ql, want)
                assert a.shape == b.shape
                torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)
    st = sta.stats()
    assert st["captured"] == 4 and st["static_forwards"] == 8 and st["eager_forwards"] == 1
    assert {(s["bucket"], s["query"], s["want"]) for s in sta.shapes} == {(8, 2, "last"), (4, 1, "last"),
                                                                        (8, 3, "all"), (8, 1, "last")}
    assert sum(g.replays for g in sta._graphs.values()) == 4   # the second pass replays every captured shape


def test_graph_stand_in_replays_in_place_and_refuses_moved_buffers():
    x = torch.zeros(3)
    g = GraphStandIn([x])
    out = g.capture(lambda: x * 2)
    x.copy_(torch.tensor([1.0, 2.0, 3.0]))
    g.replay()
    assert out.tolist() == [2.0, 4.0, 6.0] and g.out is out and g.replays == 1
    g.buffers[0] = torch.zeros(3)   # a rebound input: a real graph would read the old address
    with pytest.raises(BackendError, match="moved"):
        g.replay()


def test_buckets_and_modes():
    assert [row_bucket(m, 64) for m in (1, 2, 3, 5, 8, 9, 64)] == [1, 2, 4, 8, 8, 16, 64]
    assert row_bucket(70, 128) == 128 and row_bucket(200, 128) == 128
    assert resolve_mode("auto", "cuda") == "graphs" and resolve_mode("auto", "cpu") == "off"
    assert resolve_mode(True, "cpu") == "eager" and resolve_mode(False, "cuda") == "off"
    with pytest.raises(ConfigError, match="backend.static_shapes"):
        resolve_mode("fast", "cpu")


def test_preallocation_beyond_memory_is_refused_with_the_keys_to_change(monkeypatch):
    import os
    m = _model()
    real = os.sysconf
    monkeypatch.setattr(os, "sysconf", lambda k: 1 if k == "SC_AVPHYS_PAGES" else real(k))
    with pytest.raises(BackendError, match="engine.max_batch_size.*static_shapes=off"):
        StaticRunner(m, 4, 64, max_query=3, graphs=None)


def test_graphs_are_kept_across_runs_inside_models_keep(tiny_pair, tmp_path):
    """Inside MODELS.keep() (a script of many runs over one pair) the second run replays the graphs the first
    captured: it captures nothing, and its tokens are the same."""
    from specdepth.hf_runner import MODELS
    common = hf_overrides(tiny_pair, "policy=fixed", "policy.depth=2", "workload.batch_size=3",
                          "workload.output_len=12", "backend.static_shapes=graphs")
    with MODELS.keep():
        a = run(compose(common), tmp_path / "a")
        b = run(compose(common), tmp_path / "b")
    assert a["static_shapes"]["target"]["captured"] >= 2
    assert b["static_shapes"]["target"]["captured"] == 0
    assert b["static_shapes"]["target"]["graphs_held"] == a["static_shapes"]["target"]["graphs_held"]
    assert _gens(tmp_path / "a") == _gens(tmp_path / "b")
