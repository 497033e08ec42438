"""Every robustness draw's figures in one table, draws.csv, with a `draw` column (the draw's seed): one row per
figure line of the results.md that analyze.py writes, so that any draw's results.md is rendered again from the
table alone, byte for byte.

    .venv/bin/python experiments/robustness/draws.py show 2067 [--table experiments/robustness/draws.csv]
    .venv/bin/python experiments/robustness/draws.py list
    .venv/bin/python experiments/robustness/draws.py check 911d612   # each draw against its results.md at a commit

Sections (column `section`) and the columns each fills (the others are empty):
  draw            role (held out / development), name (the label), note (the runs' folder), n (complete cells), of
  goal            name (base, tpot, geo, oracle_expected, batch_scaled, confidence, no_goodput), worst, below, of,
                  geo, worst_none, met
  policy          name, n (cells), worst, cell (the worst cell), geo, below (< 0.99), below95, below_none,
                  tpot_worst, tpot_above, changes (empty tpot_worst: the row without TPOT and changes)
  regret          name (the ratio), geo, worst, below (< 0.98); name `missing`: the split could not be made
  below           name (policy), note (the limit), n; below_cell: name, cell, ratio, best, oracle_expected,
                  vs_oracle_expected (p / oracle_expected)
  below_none      name, n; below_none_cell: name, cell, ratio (of none), best
  warning         n; warning_run: name (policy), cell, note (the warnings)
Figures are kept as analyze.py printed them (the table is what the reports showed; the runs themselves stay in
outputs/). The per-draw scatter figure needs the per-cell ratios and is drawn only from a draw's runs.
"""
from __future__ import annotations

import argparse
import csv
import io
import subprocess
from pathlib import Path

from specdepth.results import atomic_write

HERE = Path(__file__).resolve().parent
TABLE = HERE / "draws.csv"
FIELDS = ("draw", "role", "section", "name", "cell", "n", "of", "worst", "geo", "below", "below95", "below_none",
          "tpot_worst", "tpot_above", "changes", "worst_none", "met", "ratio", "best", "oracle_expected",
          "vs_oracle_expected", "note")
POLICY_HEAD = ["| policy | cells | worst / base | geo-mean / base | < 0.99 | < 0.95 | > 1 % below none | worst TPOT / "
               "best (poisson) | TPOT > 1.02 | depth changes / request |",
               "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
REGRET_HEAD = ["| | geo-mean | worst | cells < 0.98 |", "|---|---:|---:|---:|"]


def row(section: str, **kw) -> dict:
    """One row of the table (every column present; values as printed)."""
    return {f: str(kw.get(f, "")) for f in FIELDS} | {"section": section}


def _goal(r: dict) -> str:
    name = r["name"]
    if name == "no_goodput":
        return "(no goodput runs)"
    if name == "base":
        return (f"- `goodput` >= 0.99 x max(none, best fixed) in every cell: worst {r['worst']}, {r['below']} of "
                f"{r['of']} cells below -> {r['met']}")
    if name == "tpot":
        return (f"- `goodput` TPOT p50 <= 1.02 x best on poisson cells: worst {r['worst']}, {r['below']} of "
                f"{r['of']} above -> {r['met']}")
    if name == "geo":
        return f"- `goodput` geometric mean >= 1.02: {r['geo']} -> {r['met']}"
    if name == "oracle_expected":
        return (f"- `goodput` >= 0.98 x `oracle_expected` in every cell: worst {r['worst']}, {r['below']} of "
                f"{r['of']} below -> {r['met']}")
    return (f"- `{name}` >= 0.95 x base everywhere and >= 0.99 x none: worst {r['worst']} / base, "
            f"{r['worst_none']} / none -> {r['met']}")


def _policy(r: dict) -> str:
    if not r["tpot_worst"]:
        return (f"| {r['name']} | {r['n']} | {r['worst']} | {r['geo']} | {r['below']} | {r['below95']} | "
                f"{r['below_none']} | - | - | - |")
    return (f"| {r['name']} | {r['n']} | {r['worst']} ({r['cell']}) | {r['geo']} | {r['below']} | {r['below95']} | "
            f"{r['below_none']} | {r['tpot_worst']} | {r['tpot_above']} | {r['changes']} |")


def _below_cell(r: dict) -> str:
    if r["oracle_expected"]:
        oe = f"; oracle_expected {r['oracle_expected']}, {r['name']} / oracle_expected {r['vs_oracle_expected']}"
    elif r["vs_oracle_expected"]:   # the form analyze.py printed before it named both ratios
        oe = f", vs oracle_expected {r['vs_oracle_expected']}"
    else:
        oe = ""
    return f"  - {r['cell']}: {r['ratio']} (best {r['best']}{oe})"


def render(rows: list[dict]) -> str:
    """One draw's results.md from its rows, in their order."""
    out, prev = [], None
    for r in rows:
        s = r["section"]
        if s == "draw":
            out += [f"Draw: `{r['note']}` ({r['name']}), {r['n']} complete cells of {r['of']}.", "", "### Goals", ""]
        elif s == "goal":
            out.append(_goal(r))
        elif s == "policy":
            if prev != "policy":
                out += ["", "### Every policy (end-to-end throughput / max(none, best fixed 1-8))", ""] + POLICY_HEAD
            out.append(_policy(r))
        elif s == "regret":
            if prev != "regret":
                out += ["", "### goodput's regret split (ratios; 1 = no loss)", ""]
                if r["name"] != "missing":
                    out += REGRET_HEAD
            out.append("(the regret split needs goodput, goodput_true, oracle and oracle_expected runs)"
                       if r["name"] == "missing" else f"| {r['name']} | {r['geo']} | {r['worst']} | {r['below']} |")
        elif s == "below":
            out += ["", f"Cells where `{r['name']}` is below {r['note']}: {r['n']}"]
        elif s == "below_cell":
            out.append(_below_cell(r))
        elif s == "below_none":
            out += ["", f"Cells where `{r['name']}` is more than 1 % below `none`: {r['n']}"]
        elif s == "below_none_cell":
            out.append(f"  - {r['cell']}: {r['ratio']} of none (best {r['best']})")
        elif s == "warning":
            out += ["", f"Runs whose summary.json records a RuntimeWarning (numerical trouble): {r['n']}"]
        elif s == "warning_run":
            out.append(f"  - {r['cell']} {r['name']}: {r['note']}")
        else:
            raise SystemExit(f"draws.csv: draw {r['draw']}: unknown section {s!r}")
        prev = s
    return "\n".join(out) + "\n"


def read(path: Path = TABLE) -> list[dict]:
    if not path.is_file():
        raise SystemExit(f"{path}: no such table (experiments/robustness/draws.csv holds every draw's figures)")
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    if rows and set(FIELDS) - set(rows[0]):
        raise SystemExit(f"{path}: missing columns {sorted(set(FIELDS) - set(rows[0]))}")
    return rows


def of_draw(rows: list[dict], draw: int) -> list[dict]:
    got = [r for r in rows if r["draw"] == str(draw)]
    if not got:
        have = sorted({int(r["draw"]) for r in rows})
        raise SystemExit(f"draws.csv: no draw {draw}; it holds {', '.join(map(str, have))}")
    return got


def write(path: Path, draw: int, new: list[dict]) -> None:
    """Replace draw's rows in the table (or add them), atomically; draws stay in seed order."""
    old = [r for r in read(path) if r["draw"] != str(draw)] if path.is_file() else []
    rows = sorted(old + [dict(r, draw=str(draw)) for r in new], key=lambda r: int(r["draw"]))
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=FIELDS, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    atomic_write(path, buf.getvalue())


def stored(rev: str, draw: int, role: str) -> str | None:
    """The results.md analyze.py wrote for a draw, as git holds it at `rev` (the per-seed folders before draws.csv,
    or the latest draw's results.md beside it); None where that commit has none."""
    folder = "heldout_seed" if role == "held out" else "dev_seed"
    for path in (f"{folder}{draw}/results.md", "results.md"):
        got = subprocess.run(["git", "show", f"{rev}:experiments/robustness/{path}"], cwd=HERE, capture_output=True,
                             text=True)
        if got.returncode == 0 and got.stdout.startswith(f"Draw: `outputs/robustness/seed{draw}`"):
            return got.stdout
    return None


def check(rows: list[dict], rev: str) -> list[str]:
    """Per draw: its results.md rendered from the table against the one at `rev`: identical, DIFFERENT or absent."""
    out = []
    for r in (r for r in rows if r["section"] == "draw"):
        old = stored(rev, int(r["draw"]), r["role"])
        verdict = "no results.md there" if old is None else (
            "identical" if render(of_draw(rows, int(r["draw"]))) == old else "DIFFERENT")
        out.append(f"{r['draw']}: {verdict}")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=("show", "list", "check"))
    ap.add_argument("draw", nargs="?", help="show: the draw's seed; check: a git revision")
    ap.add_argument("--table", type=Path, default=TABLE)
    a = ap.parse_args(argv)
    rows = read(a.table)
    if a.what == "list":
        for r in rows:
            if r["section"] == "draw":
                print(f"{r['draw']}: {r['role']}, {r['name']}, {r['n']} of {r['of']} cells")
        return
    if a.draw is None:
        what = "draw" if a.what == "show" else "revision"
        raise SystemExit(f"draws.py {a.what}: which {what}? e.g. draws.py show 2067, draws.py check 911d612")
    if a.what == "check":
        lines = check(rows, a.draw)
        print("\n".join(lines))
        if any(not line.endswith(": identical") for line in lines):
            raise SystemExit(f"draws.py check: not every draw's results.md at {a.draw} is the table's")
        return
    try:
        draw = int(a.draw)
    except ValueError:
        raise SystemExit(f"draws.py show: {a.draw!r}: expected a draw's seed, e.g. 2067") from None
    print(render(of_draw(rows, draw)), end="")


if __name__ == "__main__":
    main()
