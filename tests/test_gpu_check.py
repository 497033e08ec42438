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
    assert set(status) == {"setup", "roofline", "crossover", "lossless", "overhead"}
    assert "error" not in status.values(), res["parts"]
    assert p.stdout.rstrip().splitlines()[-1].startswith("parts: ")   # the headlines come last
    for f in ("summary.md", "profile.csv", "roofline.csv", "roofline.png", "crossover.csv", "crossover.png",
              "lossless.csv", "overhead.csv"):
        assert (tmp_path / f).is_file(), f
    lossless = list(csv.DictReader((tmp_path / "lossless.csv").open()))
    ran = [r for r in lossless if r["equal"]]
    assert {r["pair"] for r in ran} == {"tiny_pair", "random_pair"}
    assert all(r["equal"] == "True" for r in ran)
    # timing mode follows the acceptance model: the real runs' tokens per step are the simulator's, cell by cell
    cross = [r for r in csv.DictReader((tmp_path / "crossover.csv").open()) if r["real_tokens_per_step"]]
    assert cross and all(r["real_tokens_per_step"] == r["roofline_tokens_per_step"]
                         for r in cross if not r["policy"] == "goodput")
    # (goodput calibrates its cost model to the measured step times: its decisions follow the clock)
    assert all(r["real_tokens_per_step"] == r["table_tokens_per_step"] for r in cross if r["policy"] != "goodput")
    from specdepth.cost import TableCost
    from specdepth.models import ModelArch
    arch = ModelArch.from_hf_config(tmp_path / "_models" / "target", "t")
    TableCost(arch, arch, path=str(tmp_path / "profile.csv"))   # a full grid cost=table reads
