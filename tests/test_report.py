"""specdepth-report on synthetic sweep dirs (no runs): table, CSV, speed-up baselines, facets, gaps."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from specdepth import report


def fake_run(sweep: Path, name: str, *, policy: str, depth: int, batch: int, mean: float, tput: float,
             overrides: list[str] | None = None, finished: bool = True, extra_policy: dict | None = None):
    d = sweep / name
    (d / ".hydra").mkdir(parents=True)
    cfg = {"seed": 0, "name": "s", "resume": True, "policy": {"_target_": "x.Fixed", "depth": depth, **(extra_policy or {})},
           "workload": {"batch_size": batch, "output_len": 8}, "acceptance": {"mean": mean},
           "engine": {"progress": "auto"}}
    (d / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    (d / ".hydra" / "overrides.yaml").write_text(OmegaConf.to_yaml(overrides or []))
    if finished:
        s = dict(policy=policy, backend="sim", batch_size=batch, model="m", hardware="h", cost="roofline",
                 acceptance="confidence", workload="closed", throughput_tok_s=tput, tokens_per_step=1 + depth / 4,
                 tpot_p50_s=1 / tput, tpot_p99_s=1.5 / tput, draft_tokens=depth * 10,
                 per_position_acceptance=[0.9, 0.8])
        (d / "summary.json").write_text(json.dumps(s))
    return d


def multirun_yaml(sweep: Path, params: dict, task: list[str]):
    m = {"hydra": {"sweeper": {"_target_": "hydra._internal.core_plugins.basic_sweeper.BasicSweeper",
                               "params": params},
                   "overrides": {"task": task},
                   "job": {"config": {"override_dirname": {"exclude_keys": ["name", "resume", "logger"]}}}}}
    (sweep / "multirun.yaml").write_text(OmegaConf.to_yaml(m))


@pytest.fixture
def sweep(tmp_path):
    """policy none/fixed x batch 1/8 x acceptance.mean 0.6/0.9; fixed at (8, 0.9) missing, (1, 0.9) started."""
    s = tmp_path / "sw"
    s.mkdir()
    multirun_yaml(s, {"policy": "none,fixed", "workload.batch_size": "1,8", "acceptance.mean": "0.6,0.9"},
                  ["name=s"])
    for pol, depth in (("none", 0), ("fixed(4)", 4)):
        for b in (1, 8):
            for m in (0.6, 0.9):
                if pol != "none" and m == 0.9 and b == 8:
                    continue   # never started
                ov = [f"policy={pol.split('(')[0]}", f"workload.batch_size={b}", f"acceptance.mean={m}", "name=s"]
                base = 100.0 * b
                tput = base if depth == 0 else base * (1 + m) / (1 + b / 8)
                fake_run(s, f"{pol}-{b}-{m}", policy=pol, depth=depth, batch=b, mean=m, tput=tput, overrides=ov,
                         finished=not (pol != "none" and m == 0.9 and b == 1))
    return s


def test_speedup_baseline_is_the_same_config_without_speculation(sweep):
    rows = report.add_speedup(report.collect(sweep))
    assert len(rows) == 6
    for r in rows:
        mean = float(Path(r["run_dir"]).name.split("-")[-1])
        if r["policy"] == "none":
            assert r["speedup_vs_none"] == pytest.approx(1.0)
        else:  # compared with the none run of the same acceptance.mean and batch size, not another one
            assert r["speedup_vs_none"] == pytest.approx((1 + mean) / (1 + r["batch_size"] / 8))


def test_render_facets_and_gaps(sweep):
    text = report.render(sweep)
    assert "6 runs under" in text
    assert "### acceptance.mean=0.6" in text and "### acceptance.mean=0.9" in text
    assert "| batch | none | fixed(4) |" in text            # the baseline first
    assert "MISSING: 2 of 8 runs" in text
    assert "policy=fixed workload.batch_size=8 acceptance.mean=0.9" not in text   # printed sorted:
    assert "acceptance.mean=0.9 policy=fixed workload.batch_size=8" in text
    assert "acceptance.mean=0.9 policy=fixed workload.batch_size=1" in text    # started, never finished
    assert "1 run dirs without summary.json" in text and "fixed(4)-1-0.9" in text


def test_csv_and_cli(sweep, tmp_path, capsys):
    out = tmp_path / "out"
    assert report.main([str(sweep), "--out", str(out), "--no-plots"]) == 0
    printed = capsys.readouterr().out
    assert "runs.csv" in printed and "MISSING" in printed
    rows = list(csv.DictReader((out / "runs.csv").open()))
    assert len(rows) == 6
    cols = set(rows[0])
    # summary fields, then only the config keys the sweep varied, then the run dir
    assert {"policy", "throughput_tok_s", "speedup_vs_none", "cfg.policy.depth", "cfg.workload.batch_size",
            "cfg.acceptance.mean", "run_dir"} <= cols
    assert "cfg.seed" not in cols and "cfg.workload.output_len" not in cols and "cfg.resume" not in cols
    assert json.loads(rows[0]["per_position_acceptance"]) == [0.9, 0.8]
    assert not list(out.glob("*.png"))


def test_series_names_policies_that_share_a_label(tmp_path):
    """A sweep over a policy parameter the label does not show gets one line per value."""
    s = tmp_path / "sw"
    for i, th in enumerate((0.3, 0.7)):
        fake_run(s, f"c{i}", policy="confidence", depth=4, batch=8, mean=0.7, tput=100 + i,
                 extra_policy={"threshold": th})
    rows, facets = report.label_rows(report.add_speedup(report.collect(s)))
    assert facets == [] and sorted(r["series"] for r in rows) == ["confidence (threshold=0.3)",
                                                                   "confidence (threshold=0.7)"]


def test_empty_and_bad_dirs(tmp_path, capsys):
    assert report.main([str(tmp_path)]) == 1
    assert "no finished runs" in capsys.readouterr().out
    assert report.main([str(tmp_path / "nope")]) == 2


def test_report_callback_still_prints(sweep, capsys):
    report.ReportCallback().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}}))
    assert "Throughput (output tokens/s)" in capsys.readouterr().out
    # the old helpers keep their signatures
    rows = report.add_speedup(report.collect(sweep))
    assert report.pivot_markdown(rows).startswith("| batch |")


def test_replace_results_rewrites_only_between_the_markers(tmp_path):
    from specdepth.report import RESULTS_BEGIN, RESULTS_END, replace_results
    p = tmp_path / "README.md"
    p.write_text(f"intro\n{RESULTS_BEGIN}\nold table\n{RESULTS_END}\noutro\n")
    assert replace_results(p, "new table\n")
    assert p.read_text() == f"intro\n{RESULTS_BEGIN}\nnew table\n{RESULTS_END}\noutro\n"
    q = tmp_path / "plain.md"
    q.write_text("no markers\n")
    assert not replace_results(q, "x") and q.read_text() == "no markers\n"
    assert not replace_results(tmp_path / "missing.md", "x")
