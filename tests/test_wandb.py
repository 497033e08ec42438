"""logger=wandb: offline by default, the summary/config/step table in the run files, never loses results."""
from __future__ import annotations

import json
import struct
import time

import pytest

from conftest import compose
from specdepth import tracking
from specdepth.app import run
from specdepth.engine import STEP_COLUMNS, Engine

wandb = pytest.importorskip("wandb")
TINY = ["workload.output_len=8", "workload.prompt_len=16", "workload.batch_size=2"]


def wandb_records(path):
    """The protobuf records of a .wandb file (a LevelDB-style log: 7-byte header, 32 KiB blocks, chunks of
    crc32(4) length(2) type(1) data; type 1 = whole, 2/3/4 = first/middle/last)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, buf = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pos += 7
        if kind == 0 and length == 0:
            break
        chunk, pos = data[pos:pos + length], pos + length
        if kind in (1, 4):
            r = pb.Record()
            r.ParseFromString(buf + chunk if kind == 4 else chunk)
            buf = b""
            yield r
        else:
            buf = chunk if kind == 2 else buf + chunk


@pytest.fixture
def no_wandb_env(monkeypatch):
    for k in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_DIR"):
        monkeypatch.delenv(k, raising=False)


def test_offline_run_files_hold_config_summary_and_steps(tmp_path, no_wandb_env):
    summary = run(compose("logger=wandb", "name=wb", "policy=fixed", *TINY), tmp_path)
    assert json.loads((tmp_path / "summary.json").read_text()) == summary   # local results as always
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, "offline unless a mode is set"
    # wandb's service process writes the .wandb file; it may finish flushing just after finish() returns
    deadline = time.monotonic() + 30
    while True:
        try:
            recs = list(wandb_records(next(runs[0].glob("run-*.wandb"))))
        except Exception:  # a record still being written
            recs = []
        if any(r.WhichOneof("record_type") == "exit" for r in recs) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    kinds = [r.WhichOneof("record_type") for r in recs]
    r = next(r.run for r in recs if r.WhichOneof("record_type") == "run")
    assert r.run_group == "wb" and r.job_type == "fixed(4)" and r.display_name == tmp_path.name
    logged = {}
    for rec in recs:
        if rec.WhichOneof("record_type") == "summary":
            logged.update({u.key: json.loads(u.value_json) for u in rec.summary.update})
    for k in ("throughput_tok_s", "tokens_per_step", "tpot_p50_s", "policy", "batch_size"):
        assert logged[k] == summary[k], k
    config = {u.key: json.loads(u.value_json) for u in r.config.update}      # the resolved config, at init
    for rec in recs:
        if rec.WhichOneof("record_type") == "config":
            config.update({u.key: json.loads(u.value_json) for u in rec.config.update})
    assert config["specdepth"]["policy"] == "fixed(4)"
    assert config["policy"]["depth"] == 4 and config["workload"]["batch_size"] == 2
    assert "exit" in kinds and next(r.exit for r in recs if r.WhichOneof("record_type") == "exit").exit_code == 0
    # the per-step table: steps.csv's columns and rows
    table = json.loads(next(runs[0].glob("files/media/table/steps_*.table.json")).read_text())
    assert table["columns"] == list(STEP_COLUMNS) and len(table["data"]) == summary["steps"]


def test_wandb_mode_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    run(compose("logger=wandb", *TINY), tmp_path)
    assert (tmp_path / "summary.json").is_file() and not list(tmp_path.glob("wandb/offline-run-*"))
    assert tracking.WandbLogger(mode="online").resolved_mode() == "online"
    monkeypatch.delenv("WANDB_MODE")
    assert tracking.WandbLogger().resolved_mode() == "offline"


class _Box:
    def __init__(self, fail):
        self.fail = fail

    def update(self, *a, **k):
        if self.fail:
            raise RuntimeError("disk full")


class FakeRun:
    def __init__(self, fail_log=False):
        self.finished, self.fail_log, self.dir = [], fail_log, "/nonexistent/files"
        self.summary, self.config = _Box(fail_log), _Box(False)

    def log(self, *a, **k):
        if self.fail_log:
            raise RuntimeError("disk full")

    def finish(self, exit_code=0):
        self.finished.append(exit_code)


def test_wandb_failures_never_lose_local_results(tmp_path, monkeypatch, no_wandb_env):
    # init fails: a warning, the run goes on
    monkeypatch.setattr(wandb, "init", lambda **k: (_ for _ in ()).throw(RuntimeError("no network")))
    run(compose("logger=wandb", *TINY), tmp_path / "a")
    assert (tmp_path / "a" / "summary.json").is_file()
    # logging fails: results kept, finish still runs
    fake = FakeRun(fail_log=True)
    monkeypatch.setattr(wandb, "init", lambda **k: fake)
    run(compose("logger=wandb", *TINY), tmp_path / "b")
    assert (tmp_path / "b" / "summary.json").is_file() and fake.finished == [0]


def test_finish_runs_when_the_run_fails(tmp_path, monkeypatch, no_wandb_env):
    fake = FakeRun()
    monkeypatch.setattr(wandb, "init", lambda **k: fake)

    def boom(self):
        raise RuntimeError("engine failed")

    monkeypatch.setattr(Engine, "run", boom)
    with pytest.raises(RuntimeError, match="engine failed"):
        run(compose("logger=wandb", *TINY), tmp_path)
    assert fake.finished == [1]
    assert not (tmp_path / "summary.json").exists()


def test_logger_none_is_the_default():
    cfg = compose()
    assert cfg.logger._target_ == "specdepth.tracking.NullLogger"
