"""Issue 16: tensor parallelism, GPU memory capacity, context windows and mixture-of-experts models."""
import csv
import json

import numpy as np
import pytest

from sdtest import cfg, run_sim
from specdepth import ConfigError
from specdepth.app import build, make
from specdepth.capacity import GIB, Parallel, kv_bytes_per_gpu
from specdepth.cost import CostModel, Hardware, RooflineCost, expected_experts
from specdepth.errors import SpecdepthError
from specdepth.models import ModelArch

H100 = Hardware("h100", 989, 3.35, memory_gb=80, interconnect_gbs=450)
FULL = ModelArch(layers=32, hidden=4096, heads=32, kv_heads=8, intermediate=14336, vocab=128256, head_dim=128)
# one GPU's share of FULL in a 2-way tensor-parallel group: half the heads, KV heads, MLP width and LM head
HALF = ModelArch(layers=32, hidden=4096, heads=16, kv_heads=4, intermediate=7168, vocab=64128, head_dim=128)
CTX = np.array([100, 2000, 513, 0], np.int64)
Q = np.array([1, 5, 3, 2], np.int64)


def _cost(*overrides):
    c = cfg(*overrides)
    pair, hw, par = make(c, "model"), make(c, "hardware"), make(c, "parallel")
    return make(c, "cost", target=pair.target_arch, draft=pair.draft_arch, hardware=hw, parallel=par)


# ---- tensor parallelism ----------------------------------------------------------------------------------
@pytest.mark.parametrize("latency", [0.0, 5e-6])
def test_tp2_forward_is_half_the_model_plus_the_all_reduces(latency):
    tp2 = RooflineCost(FULL, FULL, hardware=H100, parallel=Parallel(tensor=2, allreduce_latency_s=latency))
    one = RooflineCost(HALF, HALF, hardware=H100)
    t2, f2 = tp2.target_forward(CTX, Q)
    t1, f1 = one.target_forward(CTX, Q)
    tokens = int(Q.sum())
    ring = 2 * (2 - 1) / 2 * tokens * FULL.hidden * 2 / 450e9        # ring all-reduce of the activations
    allreduce = 2 * FULL.layers * (ring + latency)                  # two per layer
    assert t2 == pytest.approx(t1 + allreduce, rel=1e-12)
    assert f2 == pytest.approx(2 * f1, rel=1e-12)                   # FLOPs reported for the whole group
    # the compiled draft path charges the same communication as the per-forward formula
    k = np.array([3, 0, 5, 1], np.int64)
    assert tp2.draft_positions(CTX, k)[0] == pytest.approx(
        CostModel.draft_positions(tp2, CTX.astype(float), k)[0], rel=1e-12)


def test_draft_tensor_parallel_degree_applies_to_the_draft_only():
    p = Parallel(tensor=4, draft_tensor=1)
    c = RooflineCost(FULL, HALF, hardware=H100, parallel=p)
    alone = RooflineCost(FULL, HALF, hardware=H100)
    assert c.draft_forward(CTX)[0] == alone.draft_forward(CTX)[0]
    assert c.target_forward(CTX)[0] < alone.target_forward(CTX)[0]


def test_kv_heads_split_then_replicate():
    assert kv_bytes_per_gpu(FULL, 1) == FULL.kv_bytes_per_token
    assert kv_bytes_per_gpu(FULL, 4) * 4 == FULL.kv_bytes_per_token
    assert kv_bytes_per_gpu(FULL, 16) == kv_bytes_per_gpu(FULL, 8)   # 8 KV heads: one per GPU past tp 8


@pytest.mark.parametrize("overrides,names", [
    (["parallel.tensor=3"], ["parallel.tensor=3", "attention heads"]),
    (["parallel.tensor=2", "parallel.draft_tensor=4"], ["parallel.draft_tensor"]),
    (["parallel.tensor=2", "cost=constant"], ["parallel.tensor=2", "cost=roofline"]),
    (["parallel.tensor=2", "hardware.interconnect_gbs=null"], ["hardware.interconnect_gbs"]),
    (["parallel.gpu_memory_utilization=0"], ["parallel.gpu_memory_utilization"]),
])
def test_bad_parallel_configs_name_the_key(overrides, names):
    with pytest.raises(ConfigError) as e:
        build(cfg(*overrides))
    assert all(n in str(e.value) for n in names), str(e.value)


def test_tensor_parallelism_is_simulated_only():
    with pytest.raises(SpecdepthError, match="backend=sim"):
        build(cfg("backend=hf", "model=tiny_pair", "parallel.tensor=2", "model.device=cpu"))


@pytest.mark.parametrize("tp", [4, 8])
@pytest.mark.parametrize("hw", ["a100_80g", "h100_sxm", "h200"])
def test_llama3_70b_tp_entries_fit(tp, hw):
    parts = build(cfg(f"experiment=llama3_70b_tp{tp}", f"hardware={hw}"))
    assert parts["parallel"].tensor == tp and parts["model"].name == "llama3_70b"
    assert parts["capacity"].weights == pytest.approx(parts["model"].target_arch.resident_bytes / tp
                                                      + parts["model"].draft_arch.resident_bytes / tp)


# ---- memory ----------------------------------------------------------------------------------------------
def test_a_model_that_does_not_fit_is_refused():
    with pytest.raises(ConfigError, match="llama3_70b does not fit.*parallel.tensor"):
        build(cfg("model=llama3_70b"))            # 141 GB of weights on one 80 GB H100
    build(cfg("model=llama3_70b", "parallel.tensor=2"))


def test_admission_runs_the_largest_batch_that_fits(tmp_path):
    prompt, out, depth = 32768, 24, 16
    ov = ["policy=fixed", "policy.depth=2", "workload.batch_size=24", f"workload.prompt_len={prompt}",
          f"workload.output_len={out}", f"engine.max_depth={depth}"]
    s = run_sim(tmp_path / "cap", *ov)
    batches = [int(r["batch_size"]) for r in csv.DictReader(open(tmp_path / "cap" / "steps.csv"))]
    # independent arithmetic: free bytes per GPU / KV bytes of one request's reservation
    t, d = FULL, ModelArch(16, 2048, 32, 8, 8192, 128256, head_dim=64, tie_embeddings=True)
    free = 80 * GIB * 0.9 - (t.params + d.params) * 2
    per_request = (prompt + out + depth) * (t.kv_bytes_per_token + d.kv_bytes_per_token)
    fits = int(free // per_request)
    assert 1 < fits < 24 and max(batches) == fits
    assert s["requests"] == 24 and s["output_tokens"] == 24 * out
    assert s["peak_kv_gb"] <= free / GIB
    # with unlimited memory the whole batch runs at once
    s2 = run_sim(tmp_path / "inf", *ov, "hardware.memory_gb=null")
    assert max(int(r["batch_size"]) for r in csv.DictReader(open(tmp_path / "inf" / "steps.csv"))) == 24
    assert s2["throughput_tok_s"] > s["throughput_tok_s"]


def test_peak_kv_gb_is_the_fullest_step(tmp_path):
    s = run_sim(tmp_path, "policy=none", "workload.batch_size=6", "workload.prompt_len=1000",
                "workload.output_len=50")
    per_token = FULL.kv_bytes_per_token + 16 * 2 * 8 * 64 * 2     # llama3_8b + llama3.2-1b, per token
    assert s["peak_kv_gb"] == pytest.approx(6 * 1050 * per_token / GIB, rel=1e-12)
    assert json.loads((tmp_path / "summary.json").read_text())["peak_kv_gb"] == s["peak_kv_gb"]


def test_a_request_that_can_never_fit_is_refused():
    with pytest.raises(ConfigError, match="can never fit.*llama3_8b"):
        build(cfg("hardware.memory_gb=24", "workload.prompt_len=60000"))


def test_context_window():
    with pytest.raises(ConfigError) as e:
        build(cfg("workload.prompt_len=131000", "workload.output_len=100"))
    msg = str(e.value)
    assert "workload.prompt_len" in msg and "workload.output_len" in msg and "llama3_8b" in msg and "131072" in msg
    build(cfg("workload.prompt_len=130000", "workload.output_len=100", "workload.batch_size=1"))


def test_max_context_is_read_from_config_json(tmp_path):
    arch = ModelArch.from_hf_config(_ckpt(tmp_path, {}), "k")
    assert arch.max_context == 4096 and not arch.is_moe
    mixtral = ModelArch.from_hf_config(_ckpt(tmp_path, {"num_local_experts": 8, "num_experts_per_tok": 2}), "k")
    assert (mixtral.experts, mixtral.experts_per_token, mixtral.expert_intermediate) == (8, 2, 256)
    qwen2 = ModelArch.from_hf_config(_ckpt(tmp_path, {"num_experts": 60, "num_experts_per_tok": 4,
                                                      "moe_intermediate_size": 64,
                                                      "shared_expert_intermediate_size": 256}), "k")
    assert (qwen2.experts, qwen2.expert_intermediate, qwen2.shared_experts) == (60, 64, 4)


def _ckpt(tmp_path, extra):
    d = tmp_path / str(len(list(tmp_path.iterdir())))
    d.mkdir()
    c = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=256, vocab_size=100, max_position_embeddings=4096, **extra)
    (d / "config.json").write_text(json.dumps(c))
    return d


# ---- mixture of experts ----------------------------------------------------------------------------------
@pytest.mark.parametrize("E,k,T", [(128, 8, 1), (128, 8, 5), (128, 8, 40), (8, 2, 3), (64, 6, 17)])
def test_expected_experts_matches_monte_carlo(E, k, T):
    rng = np.random.default_rng(0)
    runs = 4000
    keys = rng.random((runs, T, E))
    picked = np.argpartition(keys, k, axis=2)[:, :, :k]            # k distinct experts per token, uniform
    distinct = np.array([np.unique(p).size for p in picked])
    se = distinct.std() / np.sqrt(runs)
    assert expected_experts(E, k, T) == pytest.approx(distinct.mean(), abs=4 * se + 1e-9)
    assert expected_experts(E, k, T) == pytest.approx(E * (1 - (1 - k / E) ** T), rel=1e-12)


@pytest.mark.parametrize("skew", [0.5, 1.2])
def test_skewed_routing_matches_monte_carlo(skew):
    E, k, T, runs = 64, 8, 12, 4000
    rng = np.random.default_rng(1)
    w = np.arange(1, E + 1, dtype=float) ** -skew
    pi = np.minimum(1.0, w * k / w.sum())
    for _ in range(E):   # the same water-filling, written out: cap at 1, renormalise the rest
        free = pi < 1.0
        pi = np.where(free, w * (k - (~free).sum()) / w[free].sum(), 1.0)
        if (pi <= 1.0).all():
            break
        pi = np.minimum(pi, 1.0)
    assert pi.sum() == pytest.approx(k)
    hits = rng.random((runs, T, E)) < pi                            # each token includes expert e w.p. pi_e
    distinct = hits.any(axis=1).sum(axis=1)
    se = distinct.std() / np.sqrt(runs)
    got = expected_experts(E, k, T, skew)
    assert got == pytest.approx(distinct.mean(), abs=4 * se)
    assert got < expected_experts(E, k, T)                          # skew concentrates the reads


def test_moe_forward_reads_the_touched_experts_and_computes_the_active_flops():
    cost = _cost("model=qwen3_30b_a3b")
    a = cost.target
    assert a.is_moe and a.params == pytest.approx(30.5e9, rel=0.01) and a.matmul_params < 3.2e9
    for T in (1, 4, 64):
        t, flops = cost.target_forward(np.zeros(1, np.int64), np.array([T], np.int64))
        assert flops == pytest.approx(2 * T * a.matmul_params + a.attn_flops_coeff * T * (T + 1) / 2)
        experts = expected_experts(128, 8, T)
        read = (a.weight_bytes - 48 * 128 * a.expert_params * 2) + 48 * a.expert_params * 2 * experts
        mem_s = (read + a.kv_bytes_per_token * T) / cost.hardware.bytes_per_s
        assert t == pytest.approx(max(flops / cost.hardware.flops_per_s, mem_s) + cost.overhead_s, rel=1e-12)
    # verifying 5 tokens reads ~4x the experts one token reads: speculation costs more than on a dense model
    one, five = (cost.target_forward(np.array([1000]), np.array([q]))[0] for q in (1, 5))
    assert five > 2.5 * one


def test_moe_skew_is_a_cost_knob():
    uni, skewed = _cost("model=qwen3_30b_a3b"), _cost("model=qwen3_30b_a3b", "cost.moe_skew=1.0")
    x = np.zeros(8, np.int64)
    assert skewed.target_forward(x)[0] < uni.target_forward(x)[0]


def test_moe_entries_run(tmp_path):
    s = run_sim(tmp_path, "model=qwen3_30b_a3b", "policy=fixed", "policy.depth=2", "workload.batch_size=4",
                "workload.output_len=16")
    assert s["output_tokens"] == 64 and s["model"] == "qwen3_30b_a3b"
    build(cfg("model=qwen3_235b_a22b", "parallel.tensor=8", "hardware=h200"))


# ---- the dense roofline is unchanged by this issue -------------------------------------------------------
# Values computed with the code before issue 16 (commit 559880b), repr'd floats: bit-identical required.
GOLDEN_ROOFLINE = {
    ("llama3_8b", "h100_sxm"): (0.012272786626865671, 0.012273471331343284, 0.24371307717025953,
                                0.0085710352238806, 232),
    ("llama3_70b", "a100_80g"): (0.11255911666503186, 0.11256192902403138, 6.770522247450256,
                                 0.013991872486512996, 120),
    ("qwen2_5_7b", "h200"): (0.005733642666666667, 0.005733851733333333, 0.22459688508527131,
                             0.002457962666666667, 162),
}


@pytest.mark.parametrize("model,hw", list(GOLDEN_ROOFLINE))
def test_dense_roofline_times_are_unchanged(model, hw):
    c = _cost(f"model={model}", f"hardware={hw}")
    ctx = np.array([0, 17, 900, 4096, 131000], np.int64)
    got = (c.target_forward(ctx)[0],
           c.target_forward(ctx, np.array([1, 3, 5, 2, 8], np.int64))[0],
           c.target_forward(np.zeros(2, np.int64), np.array([512, 8000], np.int64))[0],
           c.draft_positions(ctx, np.array([0, 4, 2, 7, 1], np.int64))[0],
           c.ridge_tokens())
    assert got == GOLDEN_ROOFLINE[(model, hw)]


def test_admission_reads_the_running_rows_as_they_are_now():
    """Continuous batching under a memory limit: at every admission the capacity check sees exactly the rows
    running then (not views left stale by the retirement just before), and the batch never exceeds what fits."""
    parts = build(cfg("workload=poisson", "workload.rate=1e9", "workload.num_requests=60", "workload.prompt_len=30000",
                      "workload.output_len={dist: uniform, low: 8, high: 40}", "engine.progress=false", "policy=fixed"))
    eng, cap = parts["engine"], parts["capacity"]
    seen = []
    room = cap.room

    def checked(plen, olen, nxt, limit):
        seen.append((plen.shape[0], eng.rows.n, int(plen.min(initial=1)), int(olen.min(initial=1))))
        return room(plen, olen, nxt, limit)

    cap.room = checked
    res = eng.run()
    assert len(res.requests) == 60 and len(seen) > 5
    assert all(shape == n for shape, n, _, _ in seen)            # the views hold the running rows, no more
    assert all(p >= 1 and o >= 1 for _, _, p, o in seen)          # no retired (zeroed) row among them
    assert max(r[2] for r in res.steps) <= cap.kv_tokens // (30000 + 40 + eng.cfg.max_depth) + 1
