"""The issue-7 simulator studies (experiments/{flops,crossover,leviathan,roofline,breadth_vs_depth}):
each experiment config composes as a multirun with its grid, and each analysis script runs end to end
on a tiny sweep made of real runs (a few short runs per study, written by specdepth.app.run)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf, open_dict

from conftest import compose
from specdepth.app import run

ROOT = Path(__file__).resolve().parents[1]
STUDIES = ("flops", "crossover", "leviathan", "breadth_vs_depth")
_CACHE: dict = {}


def compose_study(name: str, *overrides, hydra_cfg: bool = True):
    return compose(f"experiment={name}", *overrides, hydra_cfg=hydra_cfg)


def study_cfg(name: str, hydra_node: bool = False):
    """The study's config, composed once per test session; a copy without the hydra node (as a job sees
    it) unless hydra_node."""
    if name not in _CACHE:
        _CACHE[name] = compose_study(name)
    c = _CACHE[name].copy()
    if not hydra_node:
        with open_dict(c):
            del c["hydra"]
    return c


def load(study: str, script: str = "analyze.py"):
    path = ROOT / "experiments" / study / script
    spec = importlib.util.spec_from_file_location(f"study_{study}_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(path.parent))
    return mod


def tiny_run(study: str, sweep: Path, sub: str, **keys) -> dict:
    c = study_cfg(study)
    for k, v in keys.items():
        OmegaConf.update(c, k, v, merge=False)
    return run(c, sweep / sub)


@pytest.mark.parametrize("name", STUDIES)
def test_experiment_composes_as_a_multirun(name):
    c = study_cfg(name, hydra_node=True)
    assert c.name == name
    assert str(c.hydra.mode) == "RunMode.MULTIRUN"
    params = c.hydra.sweeper.params
    assert params, "an experiment holds its grid in hydra.sweeper.params"
    # every grid value parses, and the job made of each parameter's last value resolves
    job = study_cfg(name)
    for k, v in params.items():
        (ov,) = OverridesParser.create().parse_overrides([f"{k}={v}"])
        values = list(ov.sweep_string_iterator())
        assert len(values) >= 2, f"{k}: a one-value grid"
        (last,) = OverridesParser.create().parse_overrides([f"{k}={values[-1]}"])
        OmegaConf.update(job, k, last.value(), merge=False)
    OmegaConf.resolve(job)
    assert job.policy._target_ and job.acceptance._target_ and job.workload.batch_size >= 1


def test_flops_analysis(tmp_path):
    sweep = tmp_path / "flops"
    for k in (0, 2):
        tiny_run("flops", sweep, f"k{k}", **{"policy.depth": k, "acceptance.alpha": 0.8, "workload.output_len": 480})
    out = load("flops").analyze(sweep, tmp_path / "out")
    (row,) = [r for r in out if r["depth"] == 2]
    assert row["flops_ratio"] > 1 > row["steps_ratio"]             # more FLOPs per token, fewer steps
    assert abs(row["accounting_rel_err"]) < 0.02                  # the FLOP bookkeeping matches the model
    assert (tmp_path / "out" / "flops.png").stat().st_size > 0


def test_leviathan_analysis(tmp_path):
    sweep = tmp_path / "lev"
    for g in (0, 1, 2, 3):
        tiny_run("leviathan", sweep, f"g{g}", **{"policy.depth": g, "workload.output_len": 300})
    mod = load("leviathan")
    table, opt = mod.analyze(sweep, tmp_path / "out")
    assert len(table) == 4 and len(opt) == 1
    assert opt[0]["g_anchor"] == 8 and opt[0]["g_closed"] == 3    # argmax over the depths that ran
    assert mod.speedup(0.8, 8, 0.05) == pytest.approx((1 - 0.8 ** 9) / 0.2 / 1.4)
    assert "Optimal depth" in mod.markdown(table, opt)


def test_breadth_vs_depth_analysis(tmp_path):
    sweep = tmp_path / "bvd"
    for shape in ({"name": "breadth", "batch": 5, "depth": 0}, {"name": "depth", "batch": 1, "depth": 4}):
        tiny_run("breadth_vs_depth", sweep, shape["name"], **{"shape": shape, "workload.output_len": 48})
    table, cm = load("breadth_vs_depth").analyze(sweep, tmp_path / "out")
    (t,) = table
    assert t["breadth_verify_tokens"] == t["depth_verify_tokens"] == 5
    assert t["verify_time_ratio"] == pytest.approx(1.0, rel=0.05)  # same verify forward, same time
    assert t["breadth_tokens_per_forward"] == 5 > t["depth_tokens_per_forward"]
    assert all(r["flops_ratio"] == pytest.approx(1.0, rel=0.01) for r in cm)


def test_crossover_analysis(tmp_path):
    sweep = tmp_path / "cross"
    for b in (1, 512):
        for pol in ("none", "fixed8", "batch_scaled"):
            tiny_run("crossover", sweep, f"b{b}_{pol}",
                     **{"cell": {"hw": "h100_sxm", "pol": pol}, "workload.batch_size": b, "workload.output_len": 64,
                        "workload.prompt_len": 64})
    mod = load("crossover")
    rows, cross = mod.analyze(sweep, tmp_path / "out")
    (c,) = cross
    assert c["depth"] == 8 and c["speedup_b1"] > 1 > c["speedup_b512"] and c["last_win"] == 1
    assert mod.crossover([(1, 2.0), (2, 1.5), (4, 0.5)])[1] == pytest.approx(2 ** 1.5)
    assert mod.crossover([(1, 0.9)])[0].startswith("never") and mod.crossover([(1, 2.0)])[0] == "> 1"
    assert "batch_scaled" in mod.markdown(rows, cross)
    assert (tmp_path / "out" / "adaptive.png").is_file() and (tmp_path / "out" / "crossover_fixed.png").is_file()


def test_roofline_curves(tmp_path):
    mod = load("roofline", "roofline.py")
    every = mod.curves()
    rows = [r for r in every if r["model"] == "target" and r["context"] == 0]
    assert "h200" in mod.markdown(every)
    for hw in ("h100_sxm", "h200", "a100_80g"):
        t = {r["tokens"]: r["forward_s"] for r in rows if r["hardware"] == hw}
        assert t[8] == pytest.approx(t[1], rel=0.01)                # flat below the ridge
        assert t[8192] / t[4096] == pytest.approx(2.0, rel=0.02)    # linear far past it


def test_real_pareto_sweeps_live_in_one_table_that_renders_the_current_results_md_byte_for_byte():
    """variants.csv holds every figure of each real_pareto sweep's results.md, one `variant` column: the headline
    sweep rendered from it is the results.md beside it, and `variants.py goodput` reads each variant's goodput /
    max(none, best fixed) per batch from the same rows."""
    vs = load("real_pareto", "variants.py")
    rows = vs.read(ROOT / "experiments" / "real_pareto" / "variants.csv")
    assert len({r["variant"] for r in rows}) == 17
    text = (ROOT / "experiments" / "real_pareto" / "results.md").read_text()
    assert vs.render(vs.of_variant(rows, "default")) == text
    idle = [r for r in vs.of_variant(rows, "idle") if r["section"] == "goal12_batch" and r["metric"] == "e2e"]
    assert "| idle | " + " | ".join(r["ratio"] for r in idle) + " |" in vs.goodput(rows, "e2e")
    with pytest.raises(SystemExit, match="no variant 'nope'"):
        vs.of_variant(rows, "nope")


def test_every_real_pareto_sweep_rendered_from_the_table_is_the_results_md_its_folder_held(capsys):
    """The 16 variant folders and the headline results.md, as git holds them at 911d612 (before variants.csv):
    `variants.py check` renders each from the table alone and finds it byte-identical (skipped where the checkout
    lacks that history)."""
    import subprocess
    if subprocess.run(["git", "cat-file", "-e", "911d612^{commit}"], cwd=ROOT, capture_output=True).returncode:
        pytest.skip("this checkout has no commit 911d612")
    load("real_pareto", "variants.py").main(["check", "911d612"])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 17 and all(line.endswith(": identical") for line in lines)
