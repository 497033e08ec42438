"""How much does a profile of this machine move between two measurements? (the timing noise floor)

    .venv/bin/python experiments/fidelity/profile_drift.py experiments/fidelity/profile.csv experiments/fidelity/profile_recheck.csv

Prints, for every (model, batch, query, context) point in both CSVs, seconds in each and the ratio B / A - 1,
then the mean and max |ratio - 1|.
"""
from __future__ import annotations

import csv
import statistics
import sys


def read(path):
    with open(path, newline="") as f:
        return {(r["model"], int(r["batch"]), int(r["query"]), int(r["context"])): float(r["seconds"])
                for r in csv.DictReader(f)}


def main(argv=None):
    a_path, b_path = (sys.argv[1:] if argv is None else argv)[:2]
    a, b = read(a_path), read(b_path)
    common = sorted(set(a) & set(b))
    print("| model | batch | query | context | A ms | B ms | B / A - 1 |\n|---|---|---|---|---|---|---|")
    d = []
    for k in common:
        r = b[k] / a[k] - 1
        d.append(abs(r))
        print(f"| {k[0]} | {k[1]} | {k[2]} | {k[3]} | {a[k] * 1e3:.2f} | {b[k] * 1e3:.2f} | {100 * r:+.1f}% |")
    if d:
        print(f"\n{len(d)} points: mean |B / A - 1| = {100 * statistics.fmean(d):.1f}%, max {100 * max(d):.1f}%")


if __name__ == "__main__":
    main()
