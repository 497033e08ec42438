"""backend=hf through the real console script, the dataset workload, specdepth-profile + cost=table, and the
shipped tiny_pair model (when its assets are present)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from conftest import compose, hf_overrides  # noqa: E402
from specdepth.app import run  # noqa: E402

BIN = Path(sys.executable).parent
ASSETS = Path(__file__).resolve().parents[1] / "src" / "specdepth" / "assets" / "tiny_pair"


def _cli(tool, args, tmp_path):
    exe = BIN / tool
    if not exe.exists():
        pytest.skip(f"{exe} not installed (pip install -e .)")
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    return subprocess.run([str(exe), *args], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)


@pytest.mark.slow
def test_console_script(tiny_pair, tmp_path):
    out = tmp_path / "run"
    args = hf_overrides(tiny_pair, "policy=confidence", "workload.batch_size=3", "workload.prompt_len=5",
                        "workload.output_len=6", "decode.temperature=0.8", f"hydra.run.dir={out}")
    r = _cli("specdepth", args, tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "on hf" in r.stdout
    gens = [json.loads(x) for x in (out / "generations.jsonl").read_text().splitlines()]
    assert [g["request_id"] for g in gens] == [0, 1, 2] and all(len(g["output_ids"]) == 6 for g in gens)
    assert (out / "acceptance_trace.jsonl").is_file() and (out / "summary.json").is_file()
    # a bad input: exit code 2, one clean line, no results
    bad = tmp_path / "bad"
    r = _cli("specdepth", hf_overrides(tiny_pair, "workload.prompt_len=900", f"hydra.run.dir={bad}"), tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("specdepth: error: workload.prompt_len + workload.output_len + engine.max_depth = "
                               "900 + ") and "(request 0) exceed the context of model target" in r.stderr, r.stderr
    assert not (bad / "summary.json").exists()


def test_dataset_workload_and_trace_replay(tiny_pair, tmp_path):
    f = tmp_path / "prompts.jsonl"
    f.write_text("".join(json.dumps({"prompt": f"w{3 + i} w{10 + i} w{20 + 2 * i}" + " w5" * i}) + "\n"
                         for i in range(5)))
    cfg = compose(hf_overrides(tiny_pair, "workload=dataset", f"workload.path={f}", "workload.text_field=prompt",
                                   "workload.num_requests=7", "workload.output_len=5", "policy=fixed",
                                   "policy.depth=3"))
    s = run(cfg, tmp_path / "run")
    gens = [json.loads(x) for x in (tmp_path / "run" / "generations.jsonl").read_text().splitlines()]
    assert len(gens) == 7 and gens[5]["prompt_ids"] == gens[0]["prompt_ids"] == [3, 10, 20]
    assert gens[1]["prompt_ids"] == [4, 11, 22, 5]
    assert s["requests"] == 7
    # the recorded trace replays in the simulator: row i reads stream i (wrapping at its end), each step
    # 3 drafts, of which the leading accepted run is accepted; what the verify looked at is consumed
    trace = tmp_path / "run" / "acceptance_trace.jsonl"
    streams = [r["accepted"] for r in map(json.loads, trace.read_text().splitlines()) if r["accepted"]]
    gen, pos, accepted, drafted = [1] * 4, [0] * 4, 0, 0
    while any(g < 16 for g in gen):
        for i in (i for i in range(4) if gen[i] < 16):
            st = streams[i % len(streams)]
            a = next((j for j in range(3) if not st[(pos[i] + j) % len(st)]), 3)
            accepted, drafted = accepted + a, drafted + 3
            gen[i] += min(a + 1, 16 - gen[i])
            pos[i] += min(3, a + 1)
    sim = compose(["acceptance=trace", f"acceptance.path={trace}", "workload.batch_size=4", "workload.output_len=16",
                   "policy=fixed", "policy.depth=3", "engine.progress=false", "resume=false"])
    assert run(sim, tmp_path / "sim")["acceptance_rate"] == pytest.approx(accepted / drafted, rel=1e-12)


def test_dataset_workload_formats(tmp_path):
    pytest.importorskip("datasets")
    import csv

    from specdepth.errors import ConfigError
    from specdepth.workload import Dataset
    p = tmp_path / "d.csv"
    with p.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["q", "other"])
        w.writerows([["hello there", 1], ["general kenobi", 2]])
    d = Dataset(str(p), text_field="q", output_len=4, rate=100.0)
    reqs = d.requests(np.random.default_rng(0))
    assert [r.text for r in reqs] == ["hello there", "general kenobi"] and reqs[1].arrival_s > 0
    with pytest.raises(ConfigError, match="no column 'text'"):
        Dataset(str(p))
    with pytest.raises(ConfigError, match="workload.path: cannot load"):
        Dataset(str(tmp_path / "no_such_dataset_here"))


@pytest.mark.slow
def test_profile_and_table_cost(tiny_pair, tmp_path):
    out = tmp_path / "prof"
    r = _cli("specdepth-profile", [f"model.target={tiny_pair['target']}", f"model.draft={tiny_pair['draft']}",
                                   "model.target_arch=null", "model.draft_arch=null", "model.prompts=null",
                                   "model.dtype=float32", "model.device=cpu", "grid.batch=[1,4]", "grid.query=[1,4]",
                                   "grid.context=[0,32]", "repeats=1", "warmup=1", "rounds=2",
                                   f"hydra.run.dir={out}"], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = (out / "profile.csv").read_text().splitlines()
    assert rows[0].startswith("model,batch,query,context,seconds") and len(rows) == 1 + 2 * 8
    from specdepth.cost import TableCost
    from specdepth.models import ModelArch
    arch = ModelArch.from_hf_config(tiny_pair["target"], "model.target_arch")
    c = TableCost(arch, arch, path=str(out / "profile.csv"))
    t1, f1 = c.target_forward(np.array([0]))
    t4, _ = c.target_forward(np.full(4, 32), np.full(4, 4))
    assert t1 > 0 and t4 > 0 and f1 > 0
    # the simulator runs on the measured table
    s = run(compose(["cost=table", f"cost.path={out / 'profile.csv'}", f"model.target={tiny_pair['target']}",
                         f"model.draft={tiny_pair['draft']}", "model.target_arch=null", "model.draft_arch=null",
                         "model.prompts=null", "workload.batch_size=2", "workload.prompt_len=16",
                         "workload.output_len=8", "engine.progress=false", "resume=false"]), tmp_path / "sim")
    assert s["time_s"] > 0


def test_table_cost_interpolation(tmp_path):
    from specdepth.cost import TableCost
    from specdepth.errors import ConfigError
    from specdepth.models import ModelArch
    arch = ModelArch(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=64)
    lines = ["model,batch,query,context,seconds"]
    for w in ("target", "draft"):
        for b in (1, 4):
            for q in (1, 4):
                for c in (0, 100):
                    lines.append(f"{w},{b},{q},{c},{(1 + 0.1 * b * q + 0.01 * c) * (1 if w == 'target' else 0.5)}")
    p = tmp_path / "t.csv"
    p.write_text("\n".join(lines) + "\n")
    c = TableCost(arch, arch, path=str(p))
    assert c.lookup("target", 1, 1, 0) == pytest.approx(1.1)
    assert c.lookup("target", 4, 4, 100) == pytest.approx(3.6)
    assert c.lookup("target", 1, 1, 50) == pytest.approx(1.6)       # linear in context
    assert c.lookup("target", 2, 1, 0) == pytest.approx(1.25)       # halfway in log2(batch)
    assert c.lookup("target", 8, 4, 0) == pytest.approx(2 * 2.6)    # beyond the grid: scales with tokens
    assert c.lookup("draft", 1, 1, 0) == pytest.approx(0.55)
    assert c.draft_forward(np.array([0]))[0] == pytest.approx(0.55)
    # the policies' tables (one compiled call) equal the base class's point-by-point lookups
    from specdepth.cost import CostModel
    ctx = np.array([0, 37, 180, 260, 90])   # past the last context point too
    for totals, rows in ((np.arange(0, 60), np.arange(0, 6)), (np.array([0.0, 2.5, 7.0]), np.array([0, 3, 9]))):
        np.testing.assert_allclose(c.verify_times(ctx, totals), CostModel.verify_times(c, ctx, totals), rtol=1e-12)
        np.testing.assert_allclose(c.draft_times(77.0, rows), CostModel.draft_times(c, 77.0, rows), rtol=1e-12)
    pts = np.array([[1, 1, 0], [3, 2, 30], [8, 4, 100], [64, 9, 250], [0.5, 0.2, -1]], float)
    np.testing.assert_allclose(c.lookups("target", *pts.T.copy()), [c.lookup("target", *pt) for pt in pts], rtol=1e-15)
    assert c.lookup("target", 2, 1, 0) != c.lookup("target", 4, 1, 0)
    p.write_text("\n".join(lines[:-1]) + "\n")
    with pytest.raises(ConfigError, match="full batch x query x context grid"):
        TableCost(arch, arch, path=str(p))


@pytest.mark.skipif(not (ASSETS / "target" / "config.json").exists(), reason="tiny_pair assets not present")
def test_tiny_pair_greedy_is_target_greedy(tmp_path):
    from transformers import AutoModelForCausalLM
    cfg = compose(["backend=hf", "model=tiny_pair", "model.device=cpu", "policy=fixed", "policy.depth=4",
                       "workload.batch_size=3", "workload.prompt_len={dist:uniform,low:8,high:40}",
                       "workload.output_len=24", "engine.progress=false", "resume=false"])
    s = run(cfg, tmp_path)
    m = AutoModelForCausalLM.from_pretrained(str(ASSETS / "target"), dtype=torch.float32).eval()
    m.generation_config.eos_token_id = None
    for line in (tmp_path / "generations.jsonl").read_text().splitlines():
        g = json.loads(line)
        with torch.inference_mode():
            ref = m.generate(torch.tensor([g["prompt_ids"]]), max_new_tokens=24, do_sample=False,
                             eos_token_id=None)[0, len(g["prompt_ids"]):].tolist()
        assert g["output_ids"] == ref
    assert s["acceptance_rate"] > 0.2
