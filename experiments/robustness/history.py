"""Every held-out draw at a glance: per draw, the headline figures of goodput, `oracle_expected` (the bound that
knows the acceptance probabilities and the true cost, not the outcomes), batch_scaled and confidence, read from
the tables analyze.py wrote (experiments/robustness/heldout_seed*/results.md and the latest, results.md), so
that a reader sees at once how much of each draw's shortfall the bound shares (chance on short runs) and how the
figures moved from draw to draw.

    .venv/bin/python experiments/robustness/history.py [--dir experiments/robustness] [--since 2046]

Prints a markdown table: per draw, each policy's worst ratio to max(none, best fixed 1-8), cells below 0.99,
geo-mean and cells more than 1 % below `none` (goodput and `oracle_expected` also their poisson cells with a TPOT
p50 above 1.02 x the best). A results.md without one of the policies' rows is left out with a line on stderr.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

POLICIES = ("goodput", "oracle_expected", "batch_scaled", "confidence")
_DRAW = re.compile(r"^Draw: `[^`]*seed(\d+)`")


def parse(text: str) -> tuple[int, dict] | None:
    """(seed, {policy: (worst, geo-mean, cells < 0.99, cells > 1 % below none, TPOT > 1.02)}) from one results.md,
    its 'Every policy' table (columns: policy, cells, worst (cell), geo-mean, < 0.99, < 0.95, > 1 % below none,
    worst TPOT, TPOT > 1.02, ...); None where the text is not one."""
    m = _DRAW.match(text)
    if not m:
        return None
    rows = {}
    for line in text.splitlines():
        cols = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cols) >= 9 and cols[0] in POLICIES and cols[1].isdigit():
            try:
                rows[cols[0]] = (float(cols[2].split()[0]), float(cols[3]), int(cols[4]), int(cols[6]),
                                 cols[8] if cols[8] == "-" else int(cols[8]))   # "-": the draw had no poisson cell
            except ValueError:
                continue
    return int(m.group(1)), rows


def table(found: list[tuple[int, dict]]) -> list[str]:
    head = ("| draw | goodput worst | < 0.99 | geo-mean | below none | TPOT > 1.02 | oracle_expected worst | < 0.99 | "
            "geo-mean | below none | TPOT > 1.02 | batch_scaled worst / < 0.99 / below none | confidence worst / "
            "< 0.99 / below none |")
    lines = [head, "|---|" + "---:|" * 12]
    for seed, r in sorted(found):
        g, o, b, c = (r[p] for p in POLICIES)
        lines.append(f"| {seed} | {g[0]:.3f} | {g[2]} | {g[1]:.3f} | {g[3]} | {g[4]} | {o[0]:.3f} | {o[2]} | "
                     f"{o[1]:.3f} | {o[3]} | {o[4]} | {b[0]:.3f} / {b[2]} / {b[3]} | {c[0]:.3f} / {c[2]} / {c[3]} |")
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, default=Path(__file__).resolve().parent,
                    help="the folder with results.md and heldout_seed*/results.md")
    ap.add_argument("--since", type=int, default=0, help="only draws with this seed or later")
    a = ap.parse_args(argv)
    files = sorted(a.dir.glob("heldout_seed*/results.md")) + [a.dir / "results.md"]
    found = []
    for f in files:
        if not f.is_file():
            continue
        got = parse(f.read_text())
        if got is None:
            print(f"history.py: {f}: not an analyze.py results.md, left out", file=sys.stderr)
            continue
        seed, rows = got
        missing = [p for p in POLICIES if p not in rows]
        if missing:
            print(f"history.py: {f}: no row for {', '.join(missing)}, left out", file=sys.stderr)
            continue
        if seed >= a.since:
            found.append((seed, rows))
    if not found:
        raise SystemExit(f"history.py: no analyze.py results.md with every one of {', '.join(POLICIES)} under {a.dir}")
    print("\n".join(table(found)))


if __name__ == "__main__":
    main()
