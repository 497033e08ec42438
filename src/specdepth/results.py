"""Atomic result files. summary.json is written last: its presence marks a complete run."""
from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import numbers
import os
import tempfile
from pathlib import Path

SUMMARY = "summary.json"
CONFIG = "config.yaml"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: Path, text: str | bytes) -> None:
    """Write `text` (str, or bytes as they are) to `path` so that readers see the old file or the whole new one,
    never a part. The file gets the mode a plain open() would give it (0666 minus the user's umask), not
    mkstemp's 0600."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with (os.fdopen(fd, "wb") if isinstance(text, bytes) else os.fdopen(fd, "w", newline="")) as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(e, OSError) and e.filename is None:   # a failed write (a full disk) names its file
            raise OSError(e.errno, e.strerror, str(path)) from None
        raise


def atomic_savefig(fig, path: Path, **kwargs) -> None:
    """fig.savefig(path, **kwargs), atomically: the figure is rendered in memory, in the format path's suffix
    names (png by default), and written with atomic_write, so a crash leaves the old figure or none."""
    buf = io.BytesIO()
    fig.savefig(buf, format=Path(path).suffix.lstrip(".") or "png", **kwargs)
    atomic_write(path, buf.getvalue())


@contextlib.contextmanager
def atomic_open(path: Path):
    """A text file to write into, as open(path, "w", newline="") gives one, that appears at `path` whole
    (atomic_write) when the block ends; where the block raises, nothing is written and the old file stays:

        with atomic_open(out / "table.csv") as f:
            csv.writer(f).writerows(rows)
    """
    buf = io.StringIO(newline="")
    yield buf
    atomic_write(path, buf.getvalue())


def plain(v):
    """`v` with numpy scalars and arrays turned into Python numbers and lists (recursively), so that every
    CSV cell and JSON value is a plain number: np.float64(0.5) -> 0.5, np.int64(3) -> 3, NaN/inf -> None."""
    if v is None or isinstance(v, (str, bool)):
        return v
    if isinstance(v, numbers.Integral):
        return int(v)
    if isinstance(v, numbers.Real):
        v = float(v)
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {str(k): plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    if hasattr(v, "tolist"):   # numpy arrays and numpy bools
        return plain(v.tolist())
    return v


def _cell(v):
    t = type(v)   # the common exact types first: a steps.csv holds ~20 cells a step
    if t is float:
        return repr(v)
    if t is int or t is str:
        return v
    if v is None:
        return ""
    if isinstance(v, numbers.Real) and not isinstance(v, (numbers.Integral, bool)):
        return repr(float(v))   # a plain float: never np.float64(...)
    v = plain(v)
    return "" if v is None else v


def csv_text(columns, rows) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(columns)
    for r in rows:
        w.writerow([_cell(v) for v in r])
    return buf.getvalue()


def json_text(obj, **kw) -> str:
    return json.dumps(plain(obj), allow_nan=False, **kw)


def jsonl_text(records) -> str:
    return "".join(json_text(r, separators=(",", ":")) + "\n" for r in records)


def write_run(run_dir, *, summary: dict, config_yaml: str, tables: dict[str, tuple], extra: dict[str, list]) -> Path:
    """tables: {file name: (columns, rows)} as CSV; extra: {file name: records} as JSONL. A write that fails
    (a full disk) removes the files this call wrote and an older summary.json: no half-written run is left."""
    run_dir = Path(run_dir)
    files = [(CONFIG, lambda: config_yaml)]
    files += [(name, lambda c=cols, r=rows: csv_text(c, r)) for name, (cols, rows) in tables.items()]
    files += [(name, lambda r=records: jsonl_text(r)) for name, records in extra.items()]
    files.append((SUMMARY, lambda: json_text(summary, indent=2) + "\n"))
    (run_dir / SUMMARY).unlink(missing_ok=True)   # the run dir looks finished only once every file is new
    try:
        for name, text in files:
            atomic_write(run_dir / name, text())
    except BaseException:
        for name, _ in files:
            with contextlib.suppress(OSError):
                (run_dir / name).unlink(missing_ok=True)
        raise
    return run_dir / SUMMARY


def timing_mode(summary: dict) -> bool:
    """A real backend's run whose accept/reject decisions came from the acceptance model
    (backend.acceptance=simulated): its times are real, its outputs are not the target's decoding."""
    return summary.get("backend") not in (None, "sim") and summary.get("lossless") is False


def completed(run_dir, config_yaml: str) -> dict | None:
    """The summary of a finished run in `run_dir` with exactly this resolved config, else None."""
    run_dir = Path(run_dir)
    s, c = run_dir / SUMMARY, run_dir / CONFIG
    if not (s.is_file() and c.is_file()):
        return None
    if c.read_text() != config_yaml:
        return None
    try:
        return json.loads(s.read_text())
    except json.JSONDecodeError:
        return None
