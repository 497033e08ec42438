"""Acceptance models, workloads, trace replay and the config tree."""
import csv
import json

import numpy as np
import pytest
from hydra.core.global_hydra import GlobalHydra

from sdtest import cfg, engine, run_sim
from specdepth import ConfigError
from specdepth.acceptance import IID, Beta, Confidence, Trace


def _draw(model, n=4000, k=8, seed=0):
    model.reset(np.random.default_rng(seed))
    model.admit(n)
    return model.sample(n, k)


@pytest.mark.parametrize("model,mean", [(IID(0.7), 0.7), (Beta(0.6, 10), 0.6), (Confidence(0.75), 0.75),
                                        (Confidence(0.5, spread=1.0, seq_concentration=None), 0.5)])
def test_acceptance_models_hit_their_mean(model, mean):
    conf, acc = _draw(model)
    assert acc.mean() == pytest.approx(mean, abs=0.02)
    assert conf.shape == acc.shape == (4000, 8)


def test_confidence_is_a_calibrated_signal():
    conf, acc = _draw(Confidence(0.7, spread=2.0))
    lo, hi = conf < 0.3, conf > 0.8
    assert acc[lo].mean() < 0.3 < 0.8 < acc[hi].mean()
    # calibration > 1: the draft is over-confident, accepts less than it claims
    conf2, acc2 = _draw(Confidence(0.7, spread=2.0, calibration=2.0))
    assert acc2.mean() < conf2.mean() - 0.1


def test_rows_follow_admission_and_retirement():
    m = Beta(0.5, 2.0)
    m.reset(np.random.default_rng(1))
    m.admit(3)
    a = m.row_level.copy()
    m.retire(np.array([True, False, True]))
    m.admit(1)
    assert np.array_equal(m.row_level[:2], a[[0, 2]]) and m.row_level.size == 3


@pytest.mark.parametrize("model", [IID(0.6), Beta(0.6, 5.0), Confidence(0.7, calibration=1.5)])
def test_outcomes_are_keyed_by_request_and_position(model):
    """Common random numbers: a draft token's (confidence, outcome) depends on (request, output position)
    only, not on admission order, batch neighbours, or how the steps cut the positions into blocks."""
    model.reset(np.random.default_rng(7))
    model.admit(np.array([5, 9, 2]))
    conf, acc = model.sample(3, 12)
    assert 0.2 < acc.mean() < 0.95 and len({tuple(r) for r in acc}) == 3    # rows differ
    model.reset(np.random.default_rng(7))
    model.admit(np.array([2, 5]))                 # other order, request 9 absent
    c1, a1 = model.sample(2, 4)
    assert np.array_equal(a1, acc[[2, 0], :4]) and np.allclose(c1, conf[[2, 0], :4])
    model.commit(np.array([4, 4]), np.array([1, 3]))   # request 2 moves 2 positions, request 5 moves 4
    c2, a2 = model.sample(2, 5)
    assert np.array_equal(a2[0], acc[2, 2:7]) and np.array_equal(a2[1], acc[0, 4:9])
    assert np.allclose(c2[0], conf[2, 2:7]) and np.allclose(c2[1], conf[0, 4:9])
    model.reset(np.random.default_rng(8))          # another seed: another field
    model.admit(np.array([5, 9, 2]))
    assert not np.array_equal(model.sample(3, 12)[1], acc)


@pytest.mark.parametrize("depth", [1, 3, 8])
def test_engine_consumes_the_acceptance_field_by_position(depth):
    """Rebuild one request's acceptance field from the model and replay greedy speculation on it by
    hand: the engine must take exactly the steps that the field dictates, for every depth."""
    from specdepth.sim import SimExecutor
    out_len = 300
    eng = engine("policy=fixed", f"policy.depth={depth}", "acceptance=iid", "acceptance.alpha=0.7",
                 "workload.batch_size=1", f"workload.output_len={out_len}", "seed=3")
    res = eng.run()
    ref = IID(0.7)
    SimExecutor(eng.cost, ref, seed=3)   # resets ref exactly as the run's executor reset its model
    ref.admit(np.array([0]))
    field = ref.sample(1, out_len + depth + 1)[1][0]
    pos, gen, steps, accepted = 0, 1, 0, []
    while gen < out_len:
        run = 0
        while run < depth and field[pos + run]:
            run += 1
        accepted.append(run)
        pos += run + 1
        gen += run + 1
        steps += 1
    assert len(res.steps) == steps
    assert [s[5] for s in res.steps] == accepted


def test_trace_replays_recorded_acceptance(tmp_path):
    # record with the simulator, replay the file, get the same acceptance statistics back
    run_sim(tmp_path / "rec", "policy=fixed", "policy.depth=3", "acceptance=iid", "acceptance.alpha=0.65",
            "workload.batch_size=16", "workload.output_len=200", "engine.record_trace=true")
    trace = tmp_path / "rec" / "acceptance_trace.jsonl"
    rec = [json.loads(line) for line in trace.read_text().splitlines()]
    assert len(rec) == 16 and set(rec[0]) == {"request_id", "confidence", "accepted", "unverified"}
    s = run_sim(tmp_path / "rep", "policy=fixed", "policy.depth=3", "acceptance=trace",
                f"acceptance.path={trace}", "workload.batch_size=16", "workload.output_len=200")
    assert np.mean(s["per_position_acceptance"]) == pytest.approx(0.65, abs=0.03)


def test_trace_replay_shows_keep_drafting_the_recorded_confidences(tmp_path):
    """A policy that stops drafting on low confidence sees, in a replay, the confidences it saw when the
    trace was recorded, also those of tokens drafted after a rejection (never verified: "unverified"), so it
    makes the same decisions step for step."""
    common = ["policy=confidence", "policy.threshold=0.35", "policy.max_depth=6", "engine.token_budget=4096",
              "workload.batch_size=4", "workload.output_len=60"]
    run_sim(tmp_path / "rec", *common, "acceptance=confidence", "acceptance.mean=0.6", "engine.record_trace=true")
    trace = tmp_path / "rec" / "acceptance_trace.jsonl"
    assert sum(len(json.loads(line)["unverified"]) for line in trace.read_text().splitlines()) > 0
    run_sim(tmp_path / "rep", *common, "acceptance=trace", f"acceptance.path={trace}")
    cols = [[line.split(",")[2:8] for line in (tmp_path / d / "steps.csv").read_text().splitlines()]
            for d in ("rec", "rep")]   # batch_size .. verify_tokens
    assert cols[0] == cols[1]
    # (the simulator's own confidences are keyed by output position, so there the next step's first draft has
    # the confidence of the unverified token; a real backend's drafts after a rejection differ:) a hand-made
    # trace: 0.9 accepted, 0.9 rejected, then 0.1 next in the stream; after the rejection the recorded run
    # drafted two more tokens of confidence 0.9
    rec = {"request_id": 0, "confidence": [0.9, 0.9, 0.1, 0.9, 0.9, 0.9], "accepted": [1, 0, 1, 1, 1, 1]}
    drafted = []
    for unv in ([[1, [0.9, 0.9]]], None):
        path = tmp_path / f"hand{len(drafted)}.jsonl"
        path.write_text(json.dumps({**rec, "unverified": unv}) + "\n")
        run_sim(tmp_path / f"hand{len(drafted)}", "policy=confidence", "policy.threshold=0.5", "policy.max_depth=4",
                "policy.cost_aware=false",   # plan max_depth: the confidences alone stop the drafts
                # (6 tokens: after the prefill's, 5 left, room for max_depth drafts; none past a request's end)
                "engine.token_budget=4096", "workload.batch_size=1", "workload.output_len=6", "acceptance=trace",
                f"acceptance.path={path}")
        first = (tmp_path / f"hand{len(drafted)}" / "steps.csv").read_text().splitlines()[1].split(",")
        drafted.append(int(first[4]))
    assert drafted == [4, 3]   # with the unverified confidences: drafts to max_depth; without: stops at the 0.1


def test_trace_file_errors_name_the_file(tmp_path):
    with pytest.raises(ConfigError, match="acceptance.path: trace file not found"):
        Trace(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"confidence": [0.5], "accepted": [1]}\n{"confidence": [2.0], "accepted": [1]}\n')
    with pytest.raises(ConfigError, match=r"bad.jsonl:2"):
        Trace(bad)
    bad.write_text('{"confidence": [0.5, 0.4], "accepted": [1, 0], "unverified": [[0, [0.3]]]}\n')
    with pytest.raises(ConfigError, match=r"bad.jsonl:1: 'unverified' entry 0: index of a rejected token"):
        Trace(bad)


def test_poisson_and_file_workloads(tmp_path):
    s = run_sim(tmp_path / "p", "workload=poisson", "workload.rate=50", "workload.num_requests=30")
    assert s["requests"] == 30 and s["ttft_p50_s"] > 0
    f = tmp_path / "w.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in [
        {"prompt_len": 100, "output_len": 20}, {"prompt_len": 50, "output_len": 10, "arrival_s": 0.5},
        {"prompt_ids": [1, 2, 3], "output_len": 5}]))
    s = run_sim(tmp_path / "f", "workload=file", f"workload.path={f}")
    assert s["requests"] == 3 and s["output_tokens"] == 35
    f.write_text('{"prompt_len": 10}\n')
    with pytest.raises(ConfigError, match="w.jsonl:1: output_len"):
        run_sim(tmp_path / "g", "workload=file", f"workload.path={f}")


def test_continuous_batching_respects_max_batch_size(tmp_path):
    s = run_sim(tmp_path, "workload=poisson", "workload.rate=1e6", "workload.num_requests=50",
                "engine.max_batch_size=8", "policy=fixed")
    import csv
    sizes = [int(r["batch_size"]) for r in csv.DictReader(open(tmp_path / "steps.csv"))]
    assert max(sizes) == 8 and s["requests"] == 50


def test_output_len_one_finishes_at_prefill(tmp_path):
    s = run_sim(tmp_path, "workload.batch_size=3", "workload.output_len=1")
    assert s["output_tokens"] == 3 and s["steps"] == 0
    assert s["prefill_time_s"] > 0 and s["target_flops"] > 0 and s["draft_flops"] > 0   # the prefill is counted
    # mixed: requests done at their prefill leave at once, the others decode in the same step
    s = run_sim(tmp_path / "mixed", "workload.batch_size=6", "workload.output_len={dist: uniform, low: 1, high: 3}",
                "seed=3")
    rows = list(csv.DictReader(open(tmp_path / "mixed" / "steps.csv")))
    assert sum(int(r["finished"]) for r in rows) == s["requests"] == 6
    assert float(rows[0]["prefill_s"]) > 0 and int(rows[0]["batch_size"]) < 6   # some left after their prefill


def test_model_arch_from_config_json(tmp_path):
    from specdepth.models import ModelPair
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                                   num_key_value_heads=2, intermediate_size=128, vocab_size=300,
                                                   tie_word_embeddings=True, torch_dtype="float32")))
    pair = ModelPair(target=str(d), draft=str(d), dtype="float32")   # the dtype the backend runs at
    assert pair.target_arch.layers == 2 and pair.target_arch.bytes_per_param == 4
    assert pair.target_arch.hd == 16 and pair.target_arch.tie_embeddings
    with pytest.raises(ConfigError, match="model.target_arch"):
        ModelPair(target=str(tmp_path / "nowhere"))


@pytest.mark.parametrize("group,options", [
    ("hardware", ["a100_80g", "h100_sxm", "h200", "b200"]),
    ("model", ["llama3_8b", "llama3_70b", "qwen2_5_7b", "qwen3_30b_a3b", "qwen3_235b_a22b"]),
    ("parallel", ["default"]),
    ("acceptance", ["iid", "beta", "confidence"]),
    ("cost", ["roofline", "constant"]),
    ("policy", ["none", "fixed", "batch_scaled", "confidence"]),
])
def test_every_config_option_builds(tmp_path, group, options):
    # models that do not fit one H100 run on the tensor-parallel group they need
    deploy = {"llama3_70b": ["parallel.tensor=4"], "qwen3_235b_a22b": ["parallel.tensor=8", "hardware=h200"]}
    for opt in options:
        s = run_sim(tmp_path / opt, f"{group}={opt}", "workload.batch_size=2", "workload.output_len=8",
                    *deploy.get(opt, []))
        assert s["output_tokens"] == 16


def test_main_experiment_composes():
    c = cfg("experiment=main", hydra_cfg=True)
    assert c.hydra.mode.name == "MULTIRUN"
    params = c.hydra.sweeper.params
    assert str(params["workload.batch_size"]) == "1,8,64,256"
    assert set(str(params["policy"]).split(",")) == {"none", "fixed", "batch_scaled", "confidence", "goodput"}
    GlobalHydra.instance().clear()
