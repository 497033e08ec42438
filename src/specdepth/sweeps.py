"""Failed jobs of a sweep: recorded, never fatal to the rest of the grid.

A job of a `--multirun` that fails (a bad config value, an unreadable input file, a policy error, or an
unexpected exception) writes its error to `<run dir>/error.txt` and appends one line to
`<sweep dir>/failures.jsonl` (`run_dir`, `overrides`, `error`); the sweep goes on with the next job. The
failures file lists the failures of the last sweep launched in that dir (`FailureCallback` empties it when a
sweep starts); when the sweep ends the launching process prints how many jobs failed and exits with code 1.
"""
from __future__ import annotations

import fcntl
import json
import logging
import sys
from pathlib import Path

from hydra.experimental.callback import Callback

from .errors import SpecdepthError, as_int
from .results import atomic_write

log = logging.getLogger("specdepth")
FAILURES = "failures.jsonl"
ERROR = "error.txt"

#: failures of the last sweep this process launched (read by app.main for the exit code)
last_failures: list[dict] = []
#: failures this process could not write to failures.jsonl (a full disk): reported when the sweep ends
unwritten: list[dict] = []
#: the sweep dir of the sweep this process is launching (None outside one)
running: list = [None]


def record_failure(run_dir, sweep_dir, overrides, message: str, error_file: bool = True) -> None:
    """One line into the sweep's failures file (locked: parallel jobs) and the job's error into its run dir
    (error_file)."""
    run_dir, sweep_dir = Path(run_dir), Path(sweep_dir)
    record = {"run_dir": str(run_dir), "overrides": list(overrides), "error": message}
    try:
        sweep_dir.mkdir(parents=True, exist_ok=True)
        with open(sweep_dir / FAILURES, "a", encoding="utf-8") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.write(json.dumps(record) + "\n")
            f.flush()
            fcntl.flock(f, fcntl.LOCK_UN)
    except OSError as e:   # the sweep still goes on; the failure is reported when it ends (on_multirun_end)
        unwritten.append(record)
        print(f"specdepth: cannot record this failure in {sweep_dir / FAILURES}: {e.strerror or e}", file=sys.stderr,
              flush=True)
    try:
        if error_file:
            atomic_write(run_dir / ERROR, message.rstrip("\n") + "\n")
    except OSError:   # failures.jsonl (or the end of the sweep) has it
        pass


def record_stop(message: str) -> None:
    """A sweep that stopped before its end (Hydra could not write a job's files: a full disk): one line in its
    failures file, where it can still be written; app.main prints the message either way."""
    if running[0] is not None:
        record_failure(running[0], running[0], [], f"the sweep stopped here: {message}", error_file=False)
        running[0] = None


def read_failures(sweep_dir) -> list[dict]:
    """The failures file's records ([] when there is none); unreadable lines are kept as their text."""
    p = Path(sweep_dir) / FAILURES
    if not p.is_file():
        return []
    out = []
    for line in p.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                out.append({"run_dir": "?", "overrides": [], "error": line})
    return out


def check_sweeper(node) -> None:
    """The Optuna sweeper's counts, before any trial: n_trials >= 1 (0 ran nothing and then failed on "no trials
    are completed yet"), n_jobs >= 1."""
    if node is None or "optuna" not in str(node.get("_target_", "")).lower():
        return
    for key in ("n_trials", "n_jobs"):
        if node.get(key) is not None:
            as_int(node.get(key), f"hydra.sweeper.{key}", min=1)


class FailureCallback(Callback):
    """Registered in conf/config.yaml (hydra.callbacks.failures): empties the failures file when a sweep
    starts; when it ends, prints where its results went and reports its failures."""

    def on_multirun_start(self, config, **kwargs) -> None:
        try:
            check_sweeper(config.hydra.get("sweeper"))
        except SpecdepthError as e:   # Hydra turns a callback's exception into a warning and goes on: stop here
            print(f"specdepth: error: {e}", file=sys.stderr, flush=True)
            raise SystemExit(2) from None
        last_failures.clear()
        unwritten.clear()
        running[0] = str(config.hydra.sweep.dir)
        p = Path(str(config.hydra.sweep.dir)) / FAILURES
        if p.is_file():
            p.unlink()

    def on_multirun_end(self, config, **kwargs) -> None:
        sweep_dir, running[0] = str(config.hydra.sweep.dir), None
        failed = read_failures(sweep_dir) + unwritten
        last_failures[:] = failed
        print(f"results: {sweep_dir}", flush=True)
        if failed:
            print(f"specdepth: {len(failed)} run(s) of the sweep failed (errors in {Path(sweep_dir) / FAILURES}):",
                  file=sys.stderr, flush=True)
            for f in failed[:20]:
                print(f"  {' '.join(f.get('overrides') or []) or f.get('run_dir')}: {f.get('error')}",
                      file=sys.stderr, flush=True)
