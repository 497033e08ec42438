"""experiments/gpu/run.sh --smoke: the one-command GPU check runs end to end on CPU with tiny shapes (the same
code as on a GPU), so the script cannot rot before a GPU runs it."""
from __future__ import annotations

import csv
import json
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("matplotlib")

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_gpu_check_smoke(tmp_path):
    import sys
    env = {"PYTHON": sys.executable, "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    p = subprocess.run(["bash", str(ROOT / "experiments/gpu/run.sh"), str(tmp_path), "--smoke"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    res = json.loads((tmp_path / "results.json").read_text())
    status = {r["part"]: r["status"] for r in res["parts"]}
    assert set(status) == {"setup", "roofline", "crossover", "trees", "lossless", "overhead"}
    assert "error" not in status.values(), res["parts"]
    assert p.stdout.rstrip().splitlines()[-1].startswith("parts: ")   # the headlines come last
    for f in ("summary.md", "profile.csv", "roofline.csv", "roofline.png", "crossover.csv", "crossover.png",
              "lossless.csv", "overhead.csv", "trees.csv"):
        assert (tmp_path / f).is_file(), f
    lossless = list(csv.DictReader((tmp_path / "lossless.csv").open()))
    ran = [r for r in lossless if r["equal"]]
    assert {r["pair"] for r in ran} == {"tiny_pair", "random_pair"}
    assert all(r["equal"] == "True" for r in ran)
    assert {"tree_fixed", "fixed"} <= {r["policy"] for r in ran}   # trees on the static path too
    # trees in timing mode: each cell's tokens per step are the simulator's (the same keyed per-rank outcomes)
    trees = [r for r in csv.DictReader((tmp_path / "trees.csv").open()) if r["real_tokens_per_step"]]
    assert {r["policy"] for r in trees} >= {"tree_eagle", "tree_2211"}
    assert all(r["real_tokens_per_step"] == r["roofline_tokens_per_step"] for r in trees)
    # timing mode follows the acceptance model: the real runs' tokens per step are the simulator's, cell by cell
    cross = [r for r in csv.DictReader((tmp_path / "crossover.csv").open()) if r["real_tokens_per_step"]]
    assert cross and all(r["real_tokens_per_step"] == r["roofline_tokens_per_step"]
                         for r in cross if not r["policy"] == "goodput")
    # (goodput calibrates its cost model to the measured step times: its decisions follow the clock)
    assert all(r["real_tokens_per_step"] == r["table_tokens_per_step"] for r in cross if r["policy"] != "goodput")
    # the measurement protocol: per batch a warm-up pass, then timed passes in the same (interleaved) order
    runs = list(csv.DictReader((tmp_path / "crossover_runs.csv").open()))
    for b in {r["batch"] for r in runs}:
        seq = [r for r in runs if r["batch"] == b]
        passes = [[(r["alpha"], r["policy"]) for r in seq if r["pass"] == k] for k in ("warmup", "0", "1")]
        assert passes[0] == passes[1] == passes[2] and [r["pass"] for r in seq][0] == "warmup"
        assert int(seq[0]["captured"]) > 0   # (goodput's timed runs may reach a depth its warm-up did not)
        assert all(int(r["captured"]) == 0 for r in seq if r["pass"] != "warmup" and r["policy"] != "goodput")
    full = list(csv.DictReader((tmp_path / "crossover.csv").open()))
    assert all(int(r["real_reps"]) == 2 and r["real_spread"] != "" for r in full if r["real_tok_s"])
    for r in full:   # a reported speed-up never exceeds its tokens-per-step bound; one that would is flagged
        assert (r["real_speedup"] == "" and r["flag"]) or not r["real_speedup"] or \
            float(r["real_speedup"]) <= float(r["bound"]) * 1.03
    summ = json.loads(next((tmp_path / "runs" / "crossover" / "real").rglob("summary.json")).read_text())
    assert summ["static_shapes"]["mode"] == "graphs"
    assert {"spread", "model_s", "warmup", "path"} <= set(next(csv.DictReader((tmp_path / "roofline.csv").open())))
    from specdepth.cost import TableCost
    from specdepth.models import ModelArch
    arch = ModelArch.from_hf_config(tmp_path / "_models" / "target", "t")
    TableCost(arch, arch, path=str(tmp_path / "profile.csv"))   # a full grid cost=table reads
