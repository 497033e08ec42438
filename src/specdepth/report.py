"""Collect the runs of a sweep directory into one table.

    specdepth-report outputs/multirun/main
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hydra.experimental.callback import Callback

KEYS = ("policy", "batch_size", "throughput_tok_s", "tokens_per_step", "acceptance_rate", "tpot_p50_s",
        "flops_per_token")


def collect(sweep_dir) -> list[dict]:
    """Every finished run (a summary.json) below sweep_dir, with its run dir."""
    rows = []
    for s in sorted(Path(sweep_dir).rglob("summary.json")):
        try:
            row = json.loads(s.read_text())
        except json.JSONDecodeError:
            continue
        row["run_dir"] = str(s.parent)
        rows.append(row)
    return rows


def _group_key(row: dict) -> tuple:
    return tuple(row.get(k) for k in ("backend", "model", "hardware", "cost", "acceptance", "workload", "batch_size"))


def add_speedup(rows: list[dict]) -> list[dict]:
    """speedup_vs_none: throughput over the no-speculation run (0 draft tokens) of the same setting."""
    base = {}
    for r in rows:
        if r.get("draft_tokens") == 0 and r.get("throughput_tok_s"):
            base[_group_key(r)] = r["throughput_tok_s"]
    for r in rows:
        b = base.get(_group_key(r))
        r["speedup_vs_none"] = (r["throughput_tok_s"] / b) if b and r.get("throughput_tok_s") else None
    return rows


def pivot_markdown(rows: list[dict], value: str = "throughput_tok_s", fmt: str = ",.0f") -> str:
    """Rows = batch size, columns = policy."""
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    sizes = sorted({r["batch_size"] for r in rows})
    cell = {(r["batch_size"], r["policy"]): r.get(value) for r in rows}
    out = ["| batch | " + " | ".join(policies) + " |", "|---:|" + "---:|" * len(policies)]
    for b in sizes:
        vals = [cell.get((b, p)) for p in policies]
        out.append(f"| {b} | " + " | ".join("-" if v is None else format(v, fmt) for v in vals) + " |")
    return "\n".join(out)


def render(sweep_dir) -> str:
    rows = add_speedup(collect(sweep_dir))
    if not rows:
        return f"no finished runs (summary.json) under {sweep_dir}"
    parts = [f"{len(rows)} runs under {sweep_dir}", "", "Throughput (output tokens/s):", pivot_markdown(rows)]
    if any(r.get("speedup_vs_none") is not None for r in rows):
        parts += ["", "Speed-up over no speculation:", pivot_markdown(rows, "speedup_vs_none", ".2f")]
    return "\n".join(parts)


class ReportCallback(Callback):
    """Hydra callback: print the sweep's table when a multirun ends."""

    def on_multirun_end(self, config, **kwargs) -> None:
        print(render(config.hydra.sweep.dir), flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="specdepth-report", description=__doc__)
    ap.add_argument("sweep_dir")
    a = ap.parse_args(argv)
    if not Path(a.sweep_dir).is_dir():
        print(f"specdepth-report: error: not a directory: {a.sweep_dir}", file=sys.stderr)
        return 2
    print(render(a.sweep_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
