"""Golden results: a fixed set of runs (every built-in policy on four simulator cells, the simulator's
switches, trace recording, and backend=hf greedy and sampled runs of the shipped tiny pair) must give
exactly the summary.json and result files recorded in tests/golden/ (wall-clock fields of real runs
excepted). They guard refactors of the engine, the executors and the policies against any behaviour change.
A change meant to alter results regenerates them (`python tests/golden/make_golden.py`) and says why."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

GOLDEN = Path(__file__).resolve().parent / "golden"
sys.path.insert(0, str(GOLDEN))
import make_golden  # noqa: E402

CASES = make_golden.cases()


def test_every_case_has_a_fixture():
    names = {n for n, _, _ in CASES}
    files = {p.stem for p in GOLDEN.glob("*.json")}
    assert names == files


@pytest.mark.parametrize("name,overrides,real", CASES, ids=[c[0] for c in CASES])
def test_golden(name, overrides, real, tmp_path):
    if real:
        pytest.importorskip("torch")
    want = json.loads((GOLDEN / f"{name}.json").read_text())
    assert want["overrides"] == overrides
    got = make_golden.record(name, overrides, real, tmp_path)
    for key in ("steps_csv", "requests_csv", "acceptance_trace", "generations"):
        assert got[key] == want[key], f"{name}: {key} differs from the golden result"
    diff = {k: (v, got["summary"].get(k)) for k, v in want["summary"].items() if got["summary"].get(k) != v}
    assert not diff, f"{name}: summary.json differs (golden, now): {diff}"
