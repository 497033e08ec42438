"""Every bad input is one clear line (exit code 2, the culprit named, no traceback, no result files).

One table, `ROWS`, of bad inputs across every config group, input file, custom-policy hook (the build-time
ones: constructor, missing plan, not a Policy) and backend. Each row runs the real `specdepth` entry point
(`specdepth.app.main`, Hydra included) in this process with a patched sys.argv, so the CLI's own error path
is what is tested; a few rows also run as real subprocesses. Rows are (class, overrides, culprit): the
class follows issue 13's numbering (2 results that would not say what ran, 3 input files, 4 config keys and
values, 5 would-be tracebacks), plus "hydra" (the command line itself) and "hf" (the real backend).
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from collections import Counter
from pathlib import Path

import pytest

from sdtest import ROOT, cli, result_files
from specdepth.app import main

FID = ROOT / "experiments" / "fidelity"
TRACE_OK = '{"request_id": 0, "confidence": [0.9, 0.5], "accepted": [1, 0]}\n'


def _files(d: Path) -> dict:
    """Bad input files, written once: {name: path}."""
    d.mkdir(parents=True, exist_ok=True)
    text = {
        "wl_typo.jsonl": '{"prompt_len": 8, "output_len": 4, "arival_s": 0.5}\n',
        "wl_ids_str.jsonl": '{"prompt_ids": "12 13 14", "output_len": 4}\n',
        "wl_ids_float.jsonl": '{"prompt_ids": [1, 2.5], "output_len": 4}\n',
        "wl_json.jsonl": '{"prompt_len": 8, "output_len": 4}\n{"prompt_len": 8,\n',
        "wl_list.jsonl": '[8, 4]\n',
        "wl_no_out.jsonl": '{"prompt_len": 8}\n',
        "wl_neg_arrival.jsonl": '{"prompt_len": 8, "output_len": 4, "arrival_s": -1}\n',
        "wl_mismatch.jsonl": '{"prompt_len": 5, "prompt_ids": [1, 2, 3], "output_len": 4}\n',
        "wl_empty.jsonl": "\n\n",
        "tr_typo.jsonl": '{"request_id": 0, "confidence": [0.9], "accepted": [1], "acepted": [1]}\n',
        "tr_str.jsonl": '{"confidence": "0.9", "accepted": [1]}\n',
        "tr_two.jsonl": '{"confidence": [0.9], "accepted": [2]}\n',
        "tr_len.jsonl": '{"confidence": [0.9, 0.8], "accepted": [1]}\n',
        "tr_missing.jsonl": '{"confidence": [0.9]}\n',
        "pr_typo.jsonl": '{"txt": "hello"}\n',
        "pr_ids_str.jsonl": '{"prompt_ids": "1 2 3"}\n',
        "pr_both.jsonl": '{"text": "a", "prompt": "b"}\n',
        "csv_cols.csv": "model,batch,seconds\ntarget,1,0.1\n",
        "csv_value.csv": "model,batch,query,context,seconds\ntarget,1,1,0,fast\n",
        "csv_which.csv": "model,batch,query,context,seconds\nverifier,1,1,0,0.1\n",
        "csv_grid.csv": "model,batch,query,context,seconds\ntarget,1,1,0,0.1\ntarget,2,2,0,0.2\n",
        "csv_arch.csv": ("model,batch,query,context,seconds,device,dtype,name,arch\n"
                         "target,1,1,0,0.1,cpu,float32,other,L2-H64-A4-KV2-I128-V64-D16-float32\n"),
        "yaml_bad.yaml": "a: [1, 2\n",
        "csv_no_draft.csv": "model,batch,query,context,seconds\ntarget,1,1,0,0.1\ntarget,2,1,0,0.2\n",
        "csv_draft_short.csv": ("model,batch,query,context,seconds\ntarget,1,1,0,0.1\ntarget,2,1,0,0.2\n"
                                "draft,1,1,0,0.01\n"),
        "csv_inf.csv": "model,batch,query,context,seconds\ntarget,1,1,0,inf\ndraft,1,1,0,0.01\n",
        "csv_twice.csv": "model,batch,query,context,seconds\ntarget,1,1,0,0.1\ntarget,1,1,0,0.3\ndraft,1,1,0,0.01\n",
        "csv_cut.csv": "model,batch,query,context,seconds\ntarget,1,1,0,0.1\ndraft,1,1,0\n",
        "ds_empty.jsonl": "\n",
        "ds_no_text.jsonl": '{"text": "hello there"}\n{"txt": "general kenobi"}\n',
    }
    out = {k: d / k for k in text}
    out["no_tokenizer"] = d / "no_tokenizer"   # a checkpoint directory without tokenizer files
    out["no_tokenizer"].mkdir(exist_ok=True)
    for k, v in text.items():
        out[k].write_text(v)
    for name, body in (("wl_latin1.jsonl", '{"prompt_len": 8, "output_len": 4}\n# caf\xe9\n'),
                       ("tr_latin1.jsonl", TRACE_OK + "caf\xe9\n"), ("pr_latin1.jsonl", '{"text": "caf\xe9"}\n')):
        out[name] = d / name
        out[name].write_bytes(body.encode("latin-1"))
    return out


WL, TR = "workload=file workload.path={%s}", "acceptance=trace acceptance.path={%s}"
TABLE = "cost=table cost.path={%s}"
POL = "policy=none ~policy.depth policy._target_=custom_policies.%s"

# (class, overrides (space-separated; {name} = a file from _files), culprit the message must name)
ROWS = [
    # ---- 2: a result that would not say what ran -> refused
    ("2", "policy=fixed engine.max_depth=2", "policy.depth=4"),
    ("2", "policy=disable_by_batch policy.depth=6 engine.max_depth=5", "policy.depth=6"),
    ("2", "policy=batch_scaled engine.max_depth=4", "policy.max_depth=8"),
    ("2", "policy=confidence engine.max_depth=6", "policy.max_depth=8"),
    ("2", "policy=heuristic engine.max_depth=8", "policy.max_depth=16"),
    ("2", "policy=ema engine.max_depth=3", "policy.max_depth=7"),
    ("2", "policy=ema policy.max_depth=5 engine.max_depth=5", "policy.tiers=7"),
    ("2", "policy=goodput engine.max_depth=12", "policy.max_depth=16"),
    ("2", "policy=oracle engine.max_depth=4", "policy.max_depth=16"),
    ("2", "policy=bandit engine.max_depth=6", "policy.arms=8"),
    ("2", "policy=batch_table engine.max_depth=3", "policy.table=4"),
    ("2", "model=tiny_pair " + TABLE % "csv_arch.csv", "profiled for another model"),
    ("2", "cost=table cost.path=" + str(FID / "profile.csv"), "profiled for model 'tiny_pair'"),
    ("2", f"backend.clock_profile={FID / 'clock_profile.csv'}", "backend.clock_profile"),
    # ---- 3: input files (workload=file, acceptance=trace, cost=table / clock_profile CSVs)
    ("3", WL % "wl_typo.jsonl", "wl_typo.jsonl:1: unknown key 'arival_s'"),
    ("3", WL % "wl_ids_str.jsonl", "wl_ids_str.jsonl:1: prompt_ids must be a list"),
    ("3", WL % "wl_ids_float.jsonl", "wl_ids_float.jsonl:1: prompt_ids[1]"),
    ("3", WL % "wl_latin1.jsonl", "wl_latin1.jsonl:2: not UTF-8"),
    ("3", WL % "wl_json.jsonl", "wl_json.jsonl:2: invalid JSON"),
    ("3", WL % "wl_list.jsonl", "wl_list.jsonl:1: expected a JSON object"),
    ("3", WL % "wl_no_out.jsonl", "wl_no_out.jsonl:1: output_len"),
    ("3", WL % "wl_neg_arrival.jsonl", "wl_neg_arrival.jsonl:1: arrival_s"),
    ("3", WL % "wl_mismatch.jsonl", "wl_mismatch.jsonl:1: prompt_len"),
    ("3", WL % "wl_empty.jsonl", "holds no requests"),
    ("3", "workload=file workload.path=/nonexistent/w.jsonl", "/nonexistent/w.jsonl"),
    ("3", TR % "tr_typo.jsonl", "tr_typo.jsonl:1: unknown key 'acepted'"),
    ("3", TR % "tr_str.jsonl", "tr_str.jsonl:1: confidence must be a list"),
    ("3", TR % "tr_two.jsonl", "tr_two.jsonl:1: confidences must be in [0, 1] and accepted 0 or 1"),
    ("3", TR % "tr_len.jsonl", "tr_len.jsonl:1: 'confidence' and 'accepted'"),
    ("3", TR % "tr_missing.jsonl", "tr_missing.jsonl:1: not a trace record"),
    ("3", TR % "tr_latin1.jsonl", "tr_latin1.jsonl:2: not UTF-8"),
    ("3", "acceptance=trace acceptance.path=/nonexistent/t.jsonl", "/nonexistent/t.jsonl"),
    ("3", TABLE % "csv_cols.csv", "csv_cols.csv lacks columns"),
    ("3", TABLE % "csv_value.csv", "csv_value.csv:2"),
    ("3", TABLE % "csv_which.csv", "csv_which.csv:2: model must be target, draft or draft_next"),
    ("3", TABLE % "csv_grid.csv", "full batch x query x context grid"),
    ("3", "cost=table cost.path=/nonexistent/p.csv", "cost.path: profile CSV not found"),
    ("3", "backend.clock_profile={csv_cols.csv}", "backend.clock_profile"),
    ("3", "workload=dataset workload.path={yaml_bad.yaml}", "workload.path"),
    ("3", "workload=dataset workload.path=/nonexistent/d.jsonl", "workload.path"),
    # ---- 4: config values and typos, every group
    ("4", "engine.max_batch_size=0", "engine.max_batch_size"),
    ("4", "engine.max_num_batched_tokens=0", "engine.max_num_batched_tokens"),
    ("4", "engine.token_budget=0", "engine.token_budget"),
    ("4", "engine.token_budget=lots", "engine.token_budget"),
    ("4", "engine.max_depth=-1", "engine.max_depth"),
    ("4", "engine.acceptance_prior=2", "engine.acceptance_prior"),
    ("4", "engine.history=0", "engine.history"),
    ("4", "engine.progress=maybe", "engine.progress"),
    ("4", "+engine.max_dept=3", "engine.max_dept: unknown key"),
    ("4", "policy=fixed policy.depth=-1", "policy.depth"),
    ("4", "policy=fixed +policy.dept=3", "policy.dept: unknown key"),
    ("4", "policy=goodput +policy.max_dept=3", "policy.max_dept: unknown key"),
    ("4", "policy=goodput policy.estimator=vibes", "policy.estimator"),
    ("4", "policy=goodput policy.ranking=alphabetical", "policy.ranking"),
    ("4", "policy=goodput policy.drain=sometimes", "policy.drain must be true or false"),
    ("4", "policy=goodput +policy.drain_value=time", "policy.drain_value: unknown key"),
    ("4", "policy=goodput policy.probe=-0.5", "policy.probe must be >= 0"),
    ("4", "policy=goodput policy.estimate.calibration_prior=0", "policy.estimate.calibration_prior"),
    ("4", "policy=goodput +policy.estimate.prior=1", "policy.estimate.prior: unknown key"),
    ("4", "policy=goodput policy.estimate.row_calibration=-3", "policy.estimate.row_calibration must be >= 0"),
    ("4", "policy=goodput policy.idle_replan=-1", "policy.idle_replan must be >= 0"),
    ("4", "policy=confidence policy.idle_replan=2.5", "policy.idle_replan"),
    ("4", "policy=goodput policy.policy_time=sometimes", "policy.policy_time must be true or false"),
    ("4", "policy=batch_scaled policy.policy_time=2", "policy.policy_time must be true or false"),
    ("4", "policy=goodput policy.catch_up=sometimes", "policy.catch_up must be true or false"),
    ("4", "policy=goodput policy.calibration.draft_fixed=often", "policy.calibration.draft_fixed must be true or false"),
    ("4", "policy=goodput policy.calibration.memory=0", "policy.calibration.memory must be >= 1"),
    ("4", "policy=goodput policy.draining.tail=sometimes", "policy.draining.tail"),
    ("4", "policy=goodput policy.draining.after=-1", "policy.draining.after must be >= 0"),
    ("4", "policy=goodput policy.estimate=often", "policy.estimate must be a mapping"),
    ("4", "policy=goodput policy.estimate.tie_tolerance=0.8", "policy.estimate.tie_tolerance must be <= 0.5"),
    ("4", "policy=goodput policy.estimate.position_prior=0", "policy.estimate.position_prior must be > 0"),
    ("4", "policy=goodput policy.estimate.prior_strength=0", "policy.estimate.prior_strength must be > 0"),
    ("4", "policy=goodput policy.calibration.draft_clip=0.5", "policy.calibration.draft_clip must be 0 (off) or >= 1"),
    ("4", "policy=goodput policy.calibration.draft_clip=-1", "policy.calibration.draft_clip must be >= 0"),
    ("4", "policy=confidence policy.extend=-1", "policy.extend"),
    ("4", "policy=confidence policy.catch_up=2", "policy.catch_up must be true or false"),
    ("4", "policy=oracle_expected policy.catch_up=maybe", "policy.catch_up must be true or false"),
    ("4", "policy=batch_scaled policy.drain=1", "policy.drain must be true or false"),
    ("4", "policy=confidence policy.drain=yes", "policy.drain must be true or false"),
    ("4", "policy=batch_scaled policy.level.probe=-1", "policy.level.probe must be >= 0"),
    ("4", "policy=batch_scaled +policy.level.probes=1", "policy.level.probes: unknown key"),
    ("4", "policy=confidence policy.level.positions=maybe", "policy.level.positions must be true or false"),
    ("4", "policy=ema policy.scope=galaxy", "policy.scope"),
    ("4", "policy=ema policy.tiers=[]", "policy.tiers"),
    ("4", "policy=bandit policy.arms=[]", "policy.arms"),
    ("4", "policy=batch_table policy.table=[[1,2]]", "policy.table[0]"),
    ("4", "policy=batch_table policy.table=[[1,8,2],[4,9,1]]", "policy.table"),
    ("4", "policy=batch_table policy.table=[]", "policy.table is empty"),
    ("4", "policy=disable_by_batch policy.threshold=0", "policy.threshold"),
    ("4", "policy=heuristic policy.initial=0", "policy.initial"),
    ("4", "policy=confidence policy.max_depth=-3", "policy.max_depth"),
    ("4", "+model.tokeniser=x", "model.tokeniser: unknown key"),
    ("4", "model.dtype=int4", "model.dtype"),
    ("4", "model.device=tpu", "model.device"),
    ("4", "model.target_arch.layers=0", "model.target_arch.layers"),
    ("4", "+model.target_arch.num_experts=8", "model.target_arch has unknown keys"),
    ("4", "model.target=/nonexistent/ckpt model.target_arch=null", "model.target_arch"),
    ("4", "hardware.mbu=0", "hardware.mbu"),
    ("4", "hardware.peak_tflops=-1", "hardware.peak_tflops"),
    ("4", "+hardware.hbm_gb=80", "hardware.hbm_gb: unknown key"),
    ("4", "cost.overhead_s=-1", "cost.overhead_s"),
    ("4", "+cost.overhed_s=1", "cost.overhed_s: unknown key"),
    ("4", "cost=constant cost.target_step_s=0", "cost.target_step_s"),
    ("4", "cost=constant +cost.hardware_name=h100", "cost.hardware_name: unknown key"),
    ("4", "acceptance=iid acceptance.alpha=1.5", "acceptance.alpha"),
    ("4", "acceptance=iid +acceptance.alpah=0.5", "acceptance.alpah: unknown key"),
    ("4", "acceptance=beta acceptance.mean=1", "acceptance.mean"),
    ("4", "acceptance=beta acceptance.concentration=0", "acceptance.concentration"),
    ("4", "acceptance.calibration=-1", "acceptance.calibration"),
    ("4", "workload.batch_size=0", "workload.batch_size"),
    ("4", "workload.output_len=0", "workload.output_len"),
    ("4", "workload.prompt_len=abc", "workload.prompt_len"),
    ("4", "workload.prompt_len={dist:uniform,low:9,high:2}", "workload.prompt_len.high"),
    ("4", "workload.prompt_len={dist:gauss,mean:5}", "workload.prompt_len.dist"),
    ("4", "workload.prompt_len={dist:uniform,low:1,high:5,hi:9}", "workload.prompt_len.hi: unknown key"),
    ("4", "+workload.batchsize=4", "workload.batchsize: unknown key"),
    ("4", "workload=poisson workload.rate=0", "workload.rate"),
    ("4", "workload=poisson workload.max_concurrency=0", "workload.max_concurrency"),
    ("4", "+backend.pad_raged=true", "backend.pad_raged: unknown key"),
    ("4", "backend.step_overhead_s=-1", "backend.step_overhead_s"),
    ("4", "backend.pad_ragged=true backend.group_prefill=sometimes", "backend.group_prefill must be true or false"),
    ("4", "+logger.project=x", "logger.project: unknown key"),
    ("4", "logger=wandb logger.mode=loud", "logger.mode"),
    ("4", "logger=wandb +logger.projct=x", "logger.projct: unknown key"),
    ("4", "+decode.temprature=0.5", "decode.temprature: unknown key"),
    ("4", "seed=-3", "seed"),
    # ---- 5: custom policies at build time, and what used to be a traceback
    ("5", POL % "NoPlan", "does not implement plan"),
    ("5", POL % "Exploding", "policy Exploding: __init__() raised ValueError: knob must be odd and prime"),
    ("5", POL % "NotAPolicy", "policy NotAPolicy: not a specdepth.Policy subclass"),
    ("5", POL % "Alternating" + " +policy.dpth=2", "policy.dpth: unknown key"),
    ("5", "policy=none ~policy.depth policy._target_=no_such_module.Policy", "no_such_module"),
    ("5", "policy=none ~policy.depth policy._target_=custom_policies.Missing", "custom_policies.Missing"),
    ("5", "hydra.run.dir=/proc/no/such/dir", "/proc/no"),
    # ---- 5: a user's policy that raises while the run goes: its name, the hook and the exception's message
    ("5", POL % "RaisesIn" + " +policy.hook=plan", "policy RaisesIn: plan() raised RuntimeError: my bug in plan"),
    ("5", POL % "RaisesIn" + " +policy.hook=keep_drafting",
     "policy RaisesIn: keep_drafting() raised RuntimeError: my bug in keep_drafting"),
    ("5", POL % "RaisesIn" + " +policy.hook=observe", "policy RaisesIn: observe() raised RuntimeError: my bug in observe"),
    ("5", POL % "RaisesIn" + " +policy.hook=reset", "policy RaisesIn: reset() raised RuntimeError: my bug in reset"),
    ("5", POL % "Broken" + " +policy.answer=short", "policy Broken broke a rule: plan() must return one depth"),
    ("5", POL % "Broken" + " +policy.answer=bad_mask", "policy Broken broke a rule: keep_drafting() must return"),
    # ---- 2: what cannot run (context window, GPU memory) is refused, naming the key and the model
    ("2", "workload.prompt_len=131000", "exceed the context of model llama3_8b"),
    ("2", "model=llama3_70b", "model llama3_70b does not fit"),
    ("2", "workload.prompt_len=120000 hardware=a100_80g hardware.memory_gb=24", "can never fit: the KV cache of model"),
    ("2", "parallel.tensor=3 model=llama3_70b", "parallel.tensor=3 must divide"),
    # ---- the command line itself
    ("hydra", "hardware=tpu_v9", "tpu_v9"),
    ("hydra", "policy.depth=[1,", "policy.depth"),
    ("hydra", "cost=table", "cost.path"),
    ("hydra", "workload=file", "workload.path"),
]

# silent results, tracebacks and vague errors of the features added since the table above
ROWS += [
    ("4", "+sede=5", "sede: unknown top-level key (did you mean seed?)"),
    ("4", "+experimnt=main", "experimnt: unknown top-level key (did you mean experiment?)"),
    ("4", "engine.max_dept=3", "engine.max_dept: unknown key (did you mean engine.max_depth?)"),
    ("4", "seed=abc", "seed must be an integer, got 'abc'"),
    ("4", "resume=maybe", "resume must be true or false"),
    ("4", "engine.record_trace=maybe", "engine.record_trace must be true or false"),
    ("4", "engine.charge_policy_time=2", "engine.charge_policy_time must be true or false"),
    ("4", "acceptance=decay +acceptance.start=2", "acceptance.start: unknown key"),
    ("3", "model=tiny_pair " + TABLE % "csv_no_draft.csv", "csv_no_draft.csv has no draft rows"),
    ("3", TABLE % "csv_draft_short.csv", "csv_draft_short.csv: the draft rows stop at batch 1"),
    ("3", TABLE % "csv_inf.csv", "csv_inf.csv:2: batch and query must be >= 1, context >= 0, seconds > 0 and finite"),
    ("3", TABLE % "csv_twice.csv", "csv_twice.csv:3: target batch=1 query=1 context=0 is also on line 2"),
    ("3", TABLE % "csv_cut.csv", "csv_cut.csv:3: 4 cells, the header has 5"),
    ("3", "backend.clock_profile={csv_cut.csv}", "csv_cut.csv:3: 4 cells"),
    ("3", "workload=dataset workload.path={ds_empty.jsonl}", "ds_empty.jsonl is empty"),
    ("3", "workload=dataset workload.path={ds_no_text.jsonl}", "row 1 of"),
    ("5", POL % "RaisesIn" + " +policy.exit=0", "policy RaisesIn: plan() raised SystemExit(0)"),
    ("5", POL % "RaisesIn" + " +policy.hook=observe +policy.exit=3", "policy RaisesIn: observe() raised SystemExit(3)"),
    ("5", POL % "WritesInto" + " +policy.hook=observe", "policy WritesInto: observe() raised ValueError: assignment "
     "destination is read-only"),
    ("5", POL % "WritesInto" + " +policy.hook=keep_drafting", "policy WritesInto: keep_drafting() raised ValueError"),
    # backend=hf: refused before any model loads (checks.before_loading)
    ("hf", "backend=hf model.device=cpu model.target=/nonexistent/ckpt", "model.target: no such directory"),
    ("hf", "backend=hf model.device=cpu model.draft=/nonexistent/draft", "model.draft: no such directory"),
    ("hf", "backend=hf model.device=cpu model.tokenizer=/nonexistent/tok", "model.tokenizer: no such directory"),
    ("hf", "backend=hf model.device=cpu model.target={no_tokenizer}", "has no tokenizer files"),
    ("hf", "backend=hf model.device=cpu policy=oracle", "backend 'hf' cannot provide them"),
    ("hf", "backend=hf model.device=cpu parallel.tensor=2", "tensor parallelism is simulated only"),
    ("hf", "backend=hf model.device=cpu model.prompts={pr_typo.jsonl}", "pr_typo.jsonl:1: unknown key 'txt'"),
]


def _fill(overrides: str, names: dict) -> list[str]:
    """The row's overrides, each {name} replaced by that file's path."""
    out = []
    for a in overrides.split(" "):
        for k, v in names.items():
            a = a.replace("{" + k + "}", str(v))
        out.append(a)
    return out


def _main(args, cwd: Path):
    """`specdepth *args` in this process: (exit code, stdout + stderr)."""
    out = io.StringIO()
    old_argv, old_cwd = sys.argv, os.getcwd()
    sys.argv = ["specdepth", *args]
    os.chdir(cwd)
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            main()
    except SystemExit as e:
        code = e.code
    finally:
        sys.argv = old_argv
        os.chdir(old_cwd)
    return code, out.getvalue()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return _files(tmp_path_factory.mktemp("bad_files"))


def _assert_refused(code, out, culprit, tmp_path):
    assert code == 2, out[-3000:]
    assert culprit in out, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    line = [ln for ln in out.splitlines() if ln.startswith("specdepth: error:")]
    assert len(line) == 1, out[-3000:]
    assert result_files(tmp_path) == []
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("cls,overrides,culprit", ROWS, ids=[f"{c}:{o[:60]}" for c, o, _ in ROWS])
def test_bad_input(cls, overrides, culprit, files, tmp_path):
    args = _fill(overrides, files)
    if not any(a.startswith("hydra.run.dir=") for a in args):
        args.append(f"hydra.run.dir={tmp_path / 'run'}")
    code, out = _main(["engine.progress=false", *args], tmp_path)
    _assert_refused(code, out, culprit, tmp_path)


# ---- the real backend -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def big_vocab_draft(tiny_pair, tmp_path_factory):
    """A draft whose vocabulary (80 rows) is larger than the target's (64)."""
    from conftest import build_tiny_llama
    d = tmp_path_factory.mktemp("big_vocab") / "draft"
    build_tiny_llama(d, seed=3, tokenizer=False, vocab=80)
    return d


HF_ROWS = [
    ("hf", "model.draft={big_draft}", "model.draft: its vocabulary has 80 rows, more than model.target's 64"),
    ("hf", "policy=oracle", "backend 'hf' cannot provide them"),
    ("hf", "+backend.pad_ragged=true", "backend.pad_ragged: unknown key for specdepth.hf.HFExecutor"),
    ("hf", "decode.temperature=-1", "decode.temperature"),
    ("hf", "backend.group_prefill=1", "backend.group_prefill must be true or false"),
    ("hf", "decode.top_p=0", "decode.top_p"),
    ("hf", "backend.num_threads=0", "backend.num_threads"),
    ("hf", "model.prompts={pr_typo.jsonl}", "pr_typo.jsonl:1: unknown key 'txt'"),
    ("hf", "model.prompts={pr_ids_str.jsonl}", "pr_ids_str.jsonl:1: prompt_ids must be a list"),
    ("hf", "model.prompts={pr_both.jsonl}", "pr_both.jsonl:1: expected exactly one of"),
    ("hf", "model.prompts={pr_latin1.jsonl}", "pr_latin1.jsonl:1: not UTF-8"),
    ("hf", "model.prompts=/nonexistent/p.jsonl", "/nonexistent/p.jsonl"),
    ("hf", "workload=file workload.path={wl_typo.jsonl}", "unknown key 'arival_s'"),
]


@pytest.mark.parametrize("cls,overrides,culprit", HF_ROWS, ids=[o[:50] for _, o, _ in HF_ROWS])
def test_bad_input_hf(cls, overrides, culprit, files, tiny_pair, big_vocab_draft, tmp_path):
    pytest.importorskip("transformers")
    from transformers import AutoModelForCausalLM  # noqa: F401  (imported before Hydra runs the job)

    from conftest import hf_overrides
    extra = _fill(overrides, dict(files, big_draft=big_vocab_draft))
    small = [] if "workload=" in overrides else ["workload.batch_size=2", "workload.output_len=4",
                                                  "workload.prompt_len=4"]
    args = hf_overrides(tiny_pair, *small, *extra, f"hydra.run.dir={tmp_path / 'run'}")
    code, out = _main(args, tmp_path)
    _assert_refused(code, out, culprit, tmp_path)


def test_hf_refusals_come_before_any_model_loads(files, tiny_pair, big_vocab_draft, tmp_path):
    """What backend=hf refuses from its config (checks.before_loading) is refused before a model loads (loading a
    real pair takes seconds): nothing reached the model cache."""
    pytest.importorskip("transformers")
    from conftest import hf_overrides
    from specdepth.hf_runner import MODELS
    for extra in (["policy=oracle"], [f"model.draft={big_vocab_draft}"], ["parallel.tensor=2"],
                  [f"model.prompts={files['pr_typo.jsonl']}"], [f"model.tokenizer={files['no_tokenizer']}"],
                  ["workload.prompt_len=100000"]):
        with MODELS.keep() as cache:
            code, out = _main(hf_overrides(tiny_pair, *extra, f"hydra.run.dir={tmp_path / 'run'}"), tmp_path)
            assert code == 2 and "specdepth: error:" in out, out[-2000:]
            assert not cache._store, f"{extra}: a model loaded before the refusal"


def test_table_counts_by_class():
    """The table covers every config group, input file, build-time policy hook and backend (>= 80 rows)."""
    counts = Counter(c for c, _, _ in ROWS + HF_ROWS)
    assert sum(counts.values()) >= 80, counts
    groups = {o.split("=")[0].lstrip("+~").split(".")[0] for _, ov, _ in ROWS + HF_ROWS for o in ov.split(" ")}
    for g in ("engine", "policy", "model", "hardware", "cost", "acceptance", "workload", "backend", "logger",
              "decode", "seed", "hydra"):
        assert g in groups, g


# ---- a few through a real subprocess ------------------------------------------------------------------
@pytest.mark.parametrize("args,culprit", [
    (["+cost.overhed_s=1"], "cost.overhed_s: unknown key"),
    (["policy=none", "~policy.depth", "policy._target_=custom_policies.Exploding"], "raised ValueError"),
    (["hydra.run.dir=/proc/no/such/dir"], "/proc/no"),
])
def test_bad_input_subprocess(args, culprit, tmp_path):
    p = cli(*args, cwd=tmp_path, env_extra={"PYTHONPATH": str(ROOT / "tests")})
    assert p.returncode == 2, p.stderr
    assert culprit in p.stderr and "Traceback" not in p.stderr + p.stdout
    assert result_files(tmp_path) == []


def test_debug_switch_shows_the_traceback(tmp_path):
    p = cli("policy=none", "~policy.depth", "policy._target_=custom_policies.Exploding", cwd=tmp_path,
            env_extra={"PYTHONPATH": str(ROOT / "tests"), "SPECDEPTH_DEBUG": "1"})
    assert p.returncode != 0 and "Traceback" in p.stderr


@pytest.mark.slow
def test_ctrl_c_is_one_line_and_leaves_nothing(tmp_path):
    import signal
    import subprocess
    import time

    from sdtest import CLI
    # ~2 s of simulation on a fast CPU (batch 256 took ~1 s there and sometimes finished before the signal).
    # The child gets SIGINT's default disposition: a test runner started in the background by a shell without job
    # control inherits SIGINT ignored, and Python then installs no Ctrl-C handler (the run finished, exit 0: CI).
    proc = subprocess.Popen([CLI, "workload.batch_size=1024", "workload.output_len=120000", "policy=none",
                             "hardware.memory_gb=null", "hydra.run.dir=run"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ, HYDRA_FULL_ERROR="0"),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 60
    while time.time() < deadline and not (tmp_path / "run" / ".lock").exists():
        time.sleep(0.2)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, f"stderr: {err[-2000:]}\nstdout: {out[-2000:]}"
    assert "interrupted" in err and "Traceback" not in out + err
    assert result_files(tmp_path) == [] and not (tmp_path / "run").exists()


def test_ctrl_c_inside_a_callback_from_compiled_code_is_still_an_interrupt(tmp_path):
    """A Ctrl-C during a kernel's first compilation (fresh clone, cold numba cache) lands in llvmlite's ctypes
    callback: Python cannot raise it there, and what fails after it is its doing. One line, exit 130, nothing left
    (once an "unexpected error" with the ignored exception's traceback, exit 1: CI on a fresh clone)."""
    p = cli("policy=none", "~policy.depth", "policy._target_=custom_policies.InterruptedInCallback",
            "hydra.run.dir=run", cwd=tmp_path, env_extra={"PYTHONPATH": str(ROOT / "tests")})
    assert p.returncode == 130, p.stderr
    assert "interrupted" in p.stderr and "Traceback" not in p.stdout + p.stderr
    assert result_files(tmp_path) == [] and not (tmp_path / "run").exists()


def test_ctrl_c_swallowed_by_a_callback_that_goes_on_still_stops_the_run(tmp_path):
    """A Ctrl-C that lands in a callback from compiled code, where nothing fails after it, is raised again in the
    main thread: the run stops at once, exit 130, nothing left (without it such a run goes on to its end; CI once
    saw a Ctrl-C'd run exit 0, likely so).
    The child gets SIGINT's default disposition, so that Python handles Ctrl-C there, as in a terminal (a test
    runner started in the background without job control passes SIGINT on ignored; see the test above)."""
    import signal
    import subprocess
    import time

    from sdtest import CLI
    start = time.time()
    p = subprocess.run([CLI, "workload.batch_size=4", "workload.output_len=5000", "policy=none", "~policy.depth",
                        "policy._target_=custom_policies.InterruptedInCallbackThenGoesOn", "hydra.run.dir=run"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, HYDRA_FULL_ERROR="0", PYTHONPATH=str(ROOT / "tests")),
                       preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert p.returncode == 130, p.stderr
    assert "interrupted" in p.stderr and "Traceback" not in p.stdout + p.stderr
    assert result_files(tmp_path) == [] and not (tmp_path / "run").exists()
    assert time.time() - start < 30, "the run went on after the Ctrl-C"


def test_summary_of_a_refusal_is_not_json(tmp_path):
    """A refused run writes no summary.json that a report could mistake for a result."""
    code, out = _main(["policy=fixed", "engine.max_depth=2", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert code == 2
    assert not list(tmp_path.rglob("*.json")), json.dumps([str(p) for p in tmp_path.rglob("*")])


# ---- what ran is said, failures are recorded, an interrupt is one line wherever it lands ---------------------
def _summary_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def test_a_memory_limited_batch_names_memory(tmp_path):
    """A 100k-token prompt at batch 8: memory holds 3 sequences at once. The printed line, the warning and
    summary.json say so, and name memory even where engine.max_num_batched_tokens is also below the batch."""
    base = ["workload.prompt_len=100000", "workload.batch_size=8", "workload.output_len=4", "engine.progress=false"]
    for extra in ([], ["engine.max_num_batched_tokens=4"]):
        run_dir = tmp_path / f"run{len(extra)}"
        code, out = _main([*base, *extra, f"hydra.run.dir={run_dir}"], tmp_path)
        assert code == 0, out[-3000:]
        s = _summary_of(run_dir)
        assert s["batch_limited_by"] == "memory" and s["batch_limit"] == s["max_running"] == 3, s
        assert "batch 8 (at most 3 at once: memory)" in out
        assert any("KV cache memory" in w for w in s["warnings"])
        assert not any("max_num_batched_tokens" in w for w in s["warnings"]), s["warnings"]


def test_summary_says_what_ran(tmp_path):
    """The TP degree, the clock profile (and its device as the hardware), the acceptance model and its
    parameters, and what capped the batch are in summary.json, not only in config.yaml."""
    def one(name, *args):
        code, out = _main(["engine.progress=false", "workload.output_len=8", *args,
                           f"hydra.run.dir={tmp_path / name}"], tmp_path)
        assert code == 0, out[-3000:]
        return _summary_of(tmp_path / name), out

    s, out = one("tp4", "model=llama3_70b", "parallel.tensor=4", "parallel.draft_tensor=2", "acceptance=iid",
                 "acceptance.alpha=0.7", "engine.max_batch_size=4")
    assert (s["tensor_parallel"], s["draft_tensor_parallel"]) == (4, 2)
    assert s["acceptance_model"] == "IID" and s["acceptance_params"] == {"alpha": 0.7}
    assert (s["batch_limited_by"], s["batch_limit"]) == ("engine.max_batch_size", 4)
    assert s["clock_profile"] is None and s["clock_model"] == s["cost_model"]
    assert f"results: {tmp_path / 'tp4'}" in out   # a single run says where its results went
    s, _ = one("clock", "model=tiny_pair", f"backend.clock_profile={FID / 'clock_profile.csv'}")
    assert s["clock_profile"] == str(FID / "clock_profile.csv") and s["clock_model"].startswith("table(")
    assert s["hardware"] == "cpu" and s["cost_model"] == "roofline(h100_sxm)"
    assert any("every time of this run comes from" in w for w in s["warnings"])
    assert s["batch_limited_by"] is None and s["batch_limit"] is None


def test_sampling_asked_of_the_simulator_is_a_warning(tmp_path):
    """decode.* changes nothing on the simulator (it decodes nothing): the run says so instead of looking sampled."""
    code, out = _main(["decode.temperature=0.7", "workload.output_len=4", "engine.progress=false",
                       f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert code == 0, out[-2000:]
    assert any("decode.temperature=0.7: backend=sim decodes nothing" in w
               for w in _summary_of(tmp_path / "run")["warnings"])


def test_a_warning_is_printed_once_per_sweep(tmp_path):
    args = ["--multirun", "workload.prompt_len=100000", "workload.batch_size=8", "workload.output_len=4",
            "seed=0,1", "engine.progress=false", f"hydra.sweep.dir={tmp_path / 'sw'}"]
    code, out = _main(args, tmp_path)
    assert code == 0, out[-3000:]
    assert out.count("at most 3 sequences run at once") == 1, out[-3000:]
    assert f"results: {tmp_path / 'sw'}" in out   # where the sweep's results went
    assert all("KV cache memory" in _summary_of(p.parent)["warnings"][0] for p in (tmp_path / "sw").rglob("summary.json"))


def test_sys_exit_in_a_policy_is_a_failed_job_and_the_sweep_goes_on(tmp_path):
    sweep = tmp_path / "sw"
    code, out = _main(["--multirun", "policy=none", "~policy.depth", "policy._target_=custom_policies.RaisesIn",
                       "+policy.exit=0,null", "+policy.hook=plan,reset_never", "workload.output_len=4",
                       "engine.progress=false", f"hydra.sweep.dir={sweep}"], tmp_path)
    assert code == 1 and "Traceback" not in out, out[-3000:]
    fails = [json.loads(x) for x in (sweep / "failures.jsonl").read_text().splitlines()]
    assert len(fails) == 2, fails   # plan with exit=0 and plan with a RuntimeError; the other two finished
    assert any("plan() raised SystemExit(0)" in f["error"] for f in fails)
    assert len(list(sweep.rglob("summary.json"))) == 2


def _sweep_with_a_write_that_fails(tmp_path, preexec, env_extra=None):
    """A sweep of a small run and a large one (steps.csv of ~1.5 MB) whose results cannot be written."""
    import subprocess

    from sdtest import CLI
    sweep = tmp_path / "sw"
    p = subprocess.run([CLI, "--multirun", "policy=none", "workload.batch_size=1", "workload.output_len=16,10000",
                        "engine.progress=false", f"hydra.sweep.dir={sweep}"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300, preexec_fn=preexec,
                       env=dict(os.environ, HYDRA_FULL_ERROR="0", **(env_extra or {})))
    return p, sweep


def _check_write_failure(p, sweep, why):
    assert p.returncode == 1, p.stderr[-3000:]
    assert "Traceback" not in p.stdout + p.stderr and "Logging error" not in p.stderr, p.stderr[-3000:]
    fails = [json.loads(x) for x in (sweep / "failures.jsonl").read_text().splitlines()]
    assert len(fails) == 1 and why in fails[0]["error"] and "steps.csv" in fails[0]["error"], fails
    failed = sweep / Path(fails[0]["run_dir"]).name
    assert not [f for f in failed.iterdir() if f.suffix in (".csv", ".json", ".jsonl") or f.name == "config.yaml"]
    assert len(list(sweep.rglob("summary.json"))) == 1   # the small run finished


def test_a_write_that_fails_mid_sweep_is_recorded_and_the_sweep_goes_on(tmp_path):
    """A file size limit (RLIMIT_FSIZE: the write fails with EFBIG, as a full disk fails with ENOSPC) on the
    large run's steps.csv: that job fails with one line naming the file, its partial result files are removed,
    failures.jsonl records it and the sweep goes on."""
    import resource
    import signal

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

    p, sweep = _sweep_with_a_write_that_fails(tmp_path, limit)
    _check_write_failure(p, sweep, "File too large")


def test_a_disk_that_fills_during_a_sweep(tmp_path):
    """A real full disk: the sweep dir on a 1 MiB tmpfs (in a user namespace; skipped where one cannot be made)."""
    import shutil
    import subprocess

    from sdtest import CLI
    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run([unshare, "-rm", "true"], capture_output=True).returncode != 0:
        pytest.skip("no user namespace to mount a small tmpfs in")
    (tmp_path / "disk").mkdir()
    script = (f"mount -t tmpfs -o size=1m tmpfs {tmp_path / 'disk'} && cd {tmp_path / 'disk'} && {CLI} "
              f"--multirun policy=none workload.batch_size=1 workload.output_len=16,10000 engine.progress=false "
              f"hydra.sweep.dir=sw; rc=$?; cp -r sw {tmp_path}/sw; exit $rc")
    p = subprocess.run([unshare, "-rm", "sh", "-c", script], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300, env=dict(os.environ, HYDRA_FULL_ERROR="0"))
    _check_write_failure(p, tmp_path / "sw", "No space left on device")


@pytest.mark.slow
def test_ctrl_c_during_numba_compilation_is_one_line(tmp_path):
    """An empty NUMBA_CACHE_DIR forces every kernel to compile (seconds); SIGINT is sent while they do, at three
    points (after the 1st, 4th and 8th kernel is cached). Each time: exactly the interrupt's line on stderr (no
    AttributeError from a half-built llvmlite object's __del__ under it), exit 130, nothing left."""
    import signal
    import subprocess
    import time

    from sdtest import CLI
    from specdepth.app import _INTERRUPTED
    for k in (1, 4, 8):
        cache, work = tmp_path / f"numba{k}", tmp_path / f"w{k}"
        cache.mkdir()
        work.mkdir()
        proc = subprocess.Popen([CLI, "workload.output_len=16", "engine.progress=false", "hydra.run.dir=run"],
                                cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=dict(os.environ, HYDRA_FULL_ERROR="0", NUMBA_CACHE_DIR=str(cache)),
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        deadline = time.time() + 120
        while proc.poll() is None and time.time() < deadline and len(list(cache.rglob("*.nbi"))) < k:
            time.sleep(0.005)
        assert proc.poll() is None, "the run ended before its kernels compiled"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 130, f"k={k} stderr: {err[-2000:]}"
        assert err.strip() == _INTERRUPTED and "Traceback" not in out, f"k={k} stderr: {err[-2000:]}"
        assert result_files(work) == [] and not (work / "run").exists()


def test_ctrl_c_with_half_built_objects_alive_is_one_line(tmp_path):
    """The mechanism behind a Ctrl-C during numba's compilation, made certain: a real SIGINT while objects whose
    __del__ fails are alive (as llvmlite's half-built PassBuilder: "AttributeError: 'PassBuilder' object has no
    attribute '_as_parameter_'"), one freed while the interrupt is handled, one kept until the interpreter
    ends. Exactly the interrupt's line on stderr, exit 130, nothing left."""
    import signal
    import subprocess

    from sdtest import CLI
    from specdepth.app import _INTERRUPTED
    p = subprocess.run([CLI, "policy=none", "~policy.depth", "policy._target_=custom_policies.CtrlCLeavesHalfBuilt",
                        "workload.output_len=4", "engine.progress=false", "hydra.run.dir=run"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, HYDRA_FULL_ERROR="0", PYTHONPATH=str(ROOT / "tests")),
                       preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert p.returncode == 130, p.stderr[-2000:]
    assert p.stderr.strip() == _INTERRUPTED and "Traceback" not in p.stdout, p.stderr[-2000:]
    assert result_files(tmp_path) == [] and not (tmp_path / "run").exists()


# ---- specdepth-report, specdepth-profile and the Optuna sweeper -------------------------------------------------
def test_report_names_an_unusable_summary_and_an_unwritable_out(tmp_path, capsys):
    from specdepth.report import main as report_main
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "summary.json").write_text('{"policy": "fixed(4)", "throughput_tok_s": 1.0}')
    assert report_main([str(tmp_path), "--no-plots"]) == 1   # no batch_size: reported, no KeyError
    out = capsys.readouterr()
    assert "a/summary.json: lacks 'batch_size'" in out.out and "Traceback" not in out.err
    (tmp_path / "a" / "summary.json").write_text('{"policy": "fixed(4)", "throu')
    assert report_main([str(tmp_path), "--no-plots"]) == 1
    out = capsys.readouterr()
    assert "a/summary.json: JSONDecodeError" in out.out and "summary.json cannot be read" in out.out
    done = tmp_path / "b"
    code, log = _main(["workload.output_len=4", "engine.progress=false", f"hydra.run.dir={done}"], tmp_path)
    assert code == 0, log[-2000:]
    assert report_main([str(tmp_path), "--no-plots", "--out", "/proc/no/such/dir"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specdepth-report: error: cannot write /proc/no") and err.count("\n") == 1, err


@pytest.mark.parametrize("args,culprit", [
    (["grid.batchs=[1]"], "grid.batchs: unknown key (did you mean grid.batch?); valid keys: batch, context, query"),
    (["+repeat=3"], "repeat: unknown top-level key (did you mean repeats?)"),
    (["grid.batch=abc"], "grid.batch must be a list of integers"),
    (["repeats=0"], "repeats must be >= 1"),
])
def test_profile_bad_input_is_one_line(args, culprit, tmp_path):
    from specdepth import profile
    out = io.StringIO()
    old = sys.argv
    sys.argv = ["specdepth-profile", *args, f"hydra.run.dir={tmp_path / 'run'}"]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out), pytest.raises(SystemExit) as e:
            profile.main()
    finally:
        sys.argv = old
    text = out.getvalue()
    assert e.value.code == 2 and culprit in text and "Traceback" not in text, text
    assert [ln for ln in text.splitlines() if ln.strip()] == [ln for ln in text.splitlines() if
                                                              ln.startswith("specdepth-profile: error:")], text
    assert not (tmp_path / "run").exists()


def test_optuna_n_trials_zero_names_the_key(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper", reason="hydra-optuna-sweeper not installed")
    code, out = _main(["--multirun", "experiment=tune_confidence", "hydra.sweeper.n_trials=0",
                       f"hydra.sweep.dir={tmp_path / 'sw'}"], tmp_path)
    assert code == 2 and "specdepth: error: hydra.sweeper.n_trials must be >= 1, got 0" in out, out[-2000:]
    assert "Traceback" not in out and not (tmp_path / "sw").exists()


def test_an_optuna_study_whose_every_trial_fails_is_one_line(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper", reason="hydra-optuna-sweeper not installed")
    code, out = _main(["--multirun", "experiment=tune_confidence", "hydra.sweeper.n_trials=1", "engine.max_depth=2",
                       "workload.output_len=4", "engine.progress=false", f"hydra.sweep.dir={tmp_path / 'sw'}"],
                      tmp_path)
    assert code == 1 and "no trial of the Optuna study finished" in out and "Traceback" not in out, out[-2000:]
    assert (tmp_path / "sw" / "failures.jsonl").is_file()
