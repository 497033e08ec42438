"""Experiment trackers (the `logger` config group). The local result files never depend on them."""
from __future__ import annotations


class NullLogger:
    """`logger=none` (the default): logs nothing."""

    def start(self, config: dict, run_dir: str, meta: dict) -> None:
        pass

    def log(self, summary: dict, steps: tuple[tuple, list]) -> None:
        pass

    def finish(self, ok: bool = True) -> None:
        pass
