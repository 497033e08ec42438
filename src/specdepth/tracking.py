"""Experiment trackers (the `logger` config group). The local result files never depend on them.

Interface (called by app.run): start(config, run_dir, meta) before the run; log(summary, (columns, rows))
after the results are written; finish(ok) always, even when the run failed.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger("specdepth")


class NullLogger:
    """`logger=none` (the default): logs nothing."""

    def start(self, config: dict, run_dir: str, meta: dict) -> None:
        pass

    def log(self, summary: dict, steps: tuple[tuple, list]) -> None:
        pass

    def finish(self, ok: bool = True) -> None:
        pass


class WandbLogger:
    """`logger=wandb`: one Weights & Biases run per specdepth run, with the resolved config, the summary
    metrics and the per-step table (`steps`, the columns of steps.csv).

    Offline unless a mode is set (`logger.mode=online` or the WANDB_MODE environment variable): nothing
    needs a login or network; the run files go to <run_dir>/wandb/ and `wandb sync <run_dir>/wandb/offline-run-*`
    uploads them later. Runs are grouped by sweep (group = the sweep `name`), job_type = the policy.
    Any wandb failure (not installed, no login for online mode, a full disk) is logged as a warning and
    the logger goes quiet: the run and its local results go on.
    """

    def __init__(self, project: str = "specdepth", entity: str | None = None, mode: str | None = None,
                 group: str | None = None, job_type: str | None = None, name: str | None = None,
                 tags: list | None = None, notes: str | None = None, dir: str | None = None,
                 log_steps: bool = True, max_step_rows: int = 100_000):
        if mode not in (None, "online", "offline", "disabled", "shared"):
            from .errors import ConfigError
            raise ConfigError(f"logger.mode must be online, offline, disabled or null, got {mode!r}")
        self.project, self.entity, self.mode = project, entity, mode
        self.group, self.job_type, self.name = group, job_type, name
        self.tags, self.notes, self.dir = list(tags or []), notes, dir
        self.log_steps, self.max_step_rows = bool(log_steps), int(max_step_rows)
        self.run = None

    def resolved_mode(self) -> str:
        """logger.mode, else $WANDB_MODE, else offline."""
        return self.mode or os.environ.get("WANDB_MODE") or "offline"

    def _fail(self, what: str, e: BaseException) -> None:
        log.warning("wandb %s failed (local results are not affected): %s: %s", what, type(e).__name__, e)

    def start(self, config: dict, run_dir: str, meta: dict) -> None:
        try:
            import wandb
        except ImportError as e:
            self._fail("import", e)
            return
        run_dir = Path(run_dir)
        wdir = Path(self.dir) if self.dir else run_dir
        try:
            wdir.mkdir(parents=True, exist_ok=True)
            self.run = wandb.init(
                project=self.project, entity=self.entity, mode=self.resolved_mode(),
                group=self.group, job_type=self.job_type or str(meta.get("policy")),
                name=self.name or run_dir.name, tags=self.tags or None, notes=self.notes,
                dir=str(wdir), config=config,
                settings=wandb.Settings(silent=True, console="off", reinit="finish_previous"),
            )
            self.run.config.update({"specdepth": dict(meta, run_dir=str(run_dir))}, allow_val_change=True)
        except Exception as e:
            self.run = None
            self._fail("init", e)

    def log(self, summary: dict, steps: tuple[tuple, list]) -> None:
        if self.run is None:
            return
        import wandb

        try:
            self.run.summary.update({k: v for k, v in summary.items() if v is not None})
            if self.log_steps:
                columns, rows = steps
                rows = list(rows)
                if len(rows) > self.max_step_rows:
                    log.warning("wandb: logging the first %d of %d steps (logger.max_step_rows); steps.csv "
                                "has them all", self.max_step_rows, len(rows))
                    rows = rows[: self.max_step_rows]
                self.run.log({"steps": wandb.Table(columns=list(columns), data=[list(r) for r in rows])})
        except Exception as e:
            self._fail("log", e)

    def finish(self, ok: bool = True) -> None:
        run, self.run = self.run, None
        if run is None:
            return
        try:
            run.finish(exit_code=0 if ok else 1)
        except Exception as e:
            self._fail("finish", e)
            return
        if self.resolved_mode() == "offline":
            d = Path(run.dir).parent
            log.info("wandb: offline run saved in %s; upload it with `wandb sync %s`", d, d)
