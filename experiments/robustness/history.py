"""Every held-out draw at a glance: per draw, the headline figures of goodput, `oracle_expected` (the bound that
knows the acceptance probabilities and the true cost, not the outcomes), batch_scaled and confidence, read from
the single table of every draw's figures (draws.csv, which analyze.py --table fills), so that a reader sees at
once how much of each draw's shortfall the bound shares (chance on short runs) and how the figures moved from
draw to draw.

    .venv/bin/python experiments/robustness/history.py [--table experiments/robustness/draws.csv] [--since 2046]

Prints a markdown table: per held-out draw, each policy's worst ratio to max(none, best fixed 1-8), cells below
0.99, geo-mean and cells more than 1 % below `none` (goodput and `oracle_expected` also their poisson cells with a
TPOT p50 above 1.02 x the best). A draw without one of the policies' rows is left out with a line on stderr.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import draws

POLICIES = ("goodput", "oracle_expected", "batch_scaled", "confidence")


def figures(rows: list[dict]) -> dict:
    """{draw: {policy: (worst, geo-mean, cells < 0.99, cells > 1 % below none, TPOT > 1.02)}} of the held-out
    draws, from their `policy` rows ("-": the draw had no poisson cell)."""
    held = {r["draw"] for r in rows if r["section"] == "draw" and r["role"] == "held out"}
    out = {int(d): {} for d in held}
    for r in rows:
        if r["draw"] in held and r["section"] == "policy" and r["name"] in POLICIES:
            out[int(r["draw"])][r["name"]] = (float(r["worst"]), float(r["geo"]), int(r["below"]),
                                              int(r["below_none"]), int(r["tpot_above"]) if r["tpot_worst"] else "-")
    return out


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
    ap.add_argument("--table", type=Path, default=draws.TABLE, help="the table of every draw (draws.csv)")
    ap.add_argument("--since", type=int, default=0, help="only draws with this seed or later")
    a = ap.parse_args(argv)
    found = []
    for seed, rows in sorted(figures(draws.read(a.table)).items()):
        missing = [p for p in POLICIES if p not in rows]
        if missing:
            print(f"history.py: draw {seed}: no row for {', '.join(missing)}, left out", file=sys.stderr)
            continue
        if seed >= a.since:
            found.append((seed, rows))
    if not found:
        raise SystemExit(f"history.py: no held-out draw with every one of {', '.join(POLICIES)} in {a.table}")
    print("\n".join(table(found)))


if __name__ == "__main__":
    main()
