"""Merge profile CSVs of the same grid (specdepth-profile) into one: each point's median over the inputs.

    .venv/bin/python experiments/fidelity/merge_profiles.py OUT.csv A.csv B.csv [C.csv ...]

run.sh profiles the machine once before each repetition of the real sweep and once after the last; the merged
table (experiments/fidelity/clock_profile.csv) is what the machine did while the real runs ran, which is
what the simulated clock charges (backend.clock_profile). Points missing from any input are an error.
"""
from __future__ import annotations

import csv
import io
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
from specdepth.results import atomic_write  # noqa: E402

KEY = ("model", "batch", "query", "context")


def read(path: Path) -> tuple[list[str], dict]:
    with path.open(newline="") as fh:
        rd = csv.DictReader(fh)
        cols = list(rd.fieldnames or [])
        if not set(KEY + ("seconds",)) <= set(cols):
            raise SystemExit(f"{path}: not a specdepth-profile CSV (columns {cols})")
        return cols, {tuple(r[k] for k in KEY): r for r in rd}


def merge(out: Path, inputs: list[Path]) -> int:
    cols, first = read(inputs[0])
    others = [read(p)[1] for p in inputs[1:]]
    rows = []
    for key, r in first.items():
        vals = [float(r["seconds"])]
        for p, o in zip(inputs[1:], others):
            if key not in o:
                raise SystemExit(f"{p}: lacks point {dict(zip(KEY, key))} of {inputs[0]}")
            vals.append(float(o[key]["seconds"]))
        rows.append({**r, "seconds": repr(statistics.median(vals))})
    buf = io.StringIO()
    wr = csv.DictWriter(buf, cols, lineterminator="\n")
    wr.writeheader()
    wr.writerows(rows)
    atomic_write(out, buf.getvalue())
    return len(rows)


def main(argv=None):
    a = sys.argv[1:] if argv is None else argv
    if len(a) < 2:
        raise SystemExit(__doc__)
    n = merge(Path(a[0]), [Path(p) for p in a[1:]])
    print(f"{n} points, median of {len(a) - 1} profiles -> {a[0]}")


if __name__ == "__main__":
    main()
