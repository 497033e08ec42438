"""Every real_pareto sweep's figures in one table, variants.csv, with a `variant` column (the default sweep is
`default`, a variant sweep is named after what it changed): one row per figure of the results.md that
analyze.py writes, so that any variant's results.md is rendered again from the table alone, byte for byte.

    .venv/bin/python experiments/real_pareto/variants.py show idle [--table experiments/real_pareto/variants.csv]
    .venv/bin/python experiments/real_pareto/variants.py list
    .venv/bin/python experiments/real_pareto/variants.py goodput [--metric e2e]   # goodput / base, every variant
    .venv/bin/python experiments/real_pareto/variants.py check 911d612   # each sweep against its results.md then

Sections (column `section`) and the columns each fills (the others are empty); figures are kept as printed:
  runs            note (the sweep's folder), n (cells)
  noise           ratio (mean % between two repetitions), hi (max %), n (pairs)
  verdict         metric, policy (the best adaptive one; empty: none ran at every batch), gap (its worst %),
                  lo (the per-batch best's worst %), note (met / missed)
  goal12          metric, policy, n (repetitions), ratio (worst), note (met / missed; `not run`: not at every batch)
  goal12_batch    metric, batch, ratio (mean of the repetitions), lo, hi (their min and max)
  throughput      metric, policy, batch, tok_s (`-`: not run), gap (% to max(none, best fixed))
  worst_gap       metric, policy, gap (`-` where none)
  baseline        metric, batch, tok_s, policy (the best of none and fixed depths)
  tps             metric, policy, batch, tps (tokens per step; `-`: not run)
  where           batch, steps, draft_extra, idle_extra, outside, total (goodput's decode time against none's)
The runs themselves stay in outputs/; the figures (PNG) are drawn from them by analyze.py.
"""
from __future__ import annotations

import argparse
import csv
import io
import subprocess
from pathlib import Path

from specdepth.results import atomic_write

HERE = Path(__file__).resolve().parent
TABLE = HERE / "variants.csv"
FIELDS = ("variant", "section", "metric", "policy", "batch", "tok_s", "gap", "tps", "ratio", "lo", "hi", "n",
          "steps", "draft_extra", "idle_extra", "outside", "total", "note")
METRICS = ("e2e", "decode")
WHERE_HEAD = [
    "Where `goodput`'s decode time goes against `none`'s (steps.csv, the same repetition, then the mean; a share of "
    "none's decode time): its drafting steps, and its idle steps, beyond what none takes to emit their tokens (idle: "
    "the policy's own time, the machine's drift between the two runs, steps with fewer rows once drafts put some "
    "rows ahead):", "",
    "| batch | drafting steps | drafting steps' extra | idle steps' extra | of which outside the forwards "
    "(steps.csv overhead_s: the policy's hooks, the engine's bookkeeping) | decode time / none's - 1 |",
    "|---:|---:|---:|---:|---:|---:|"]
FIGURES = "Figures: [real_pareto_e2e.png](real_pareto_e2e.png), [real_pareto_decode.png](real_pareto_decode.png)"


def row(section: str, **kw) -> dict:
    """One row of the table (every column present; values as printed)."""
    return {f: str(kw.get(f, "")) for f in FIELDS} | {"section": section}


def _pick(rows, section, metric=None) -> list[dict]:
    return [r for r in rows if r["section"] == section and (metric is None or r["metric"] == metric)]


def _verdict(r: dict) -> str:
    if not r["policy"]:
        return "no adaptive policy ran at every batch size"
    return (f"{r['metric']}: best adaptive policy over all batch sizes = **{r['policy']}**, worst gap {r['gap']}% "
            f"-> goal (>= -3%) **{r['note']}**. Per batch, the best adaptive policy chosen in hindsight: worst gap "
            f"{r['lo']}%.")


def _goal12(rows: list[dict], metric: str) -> list[str]:
    got = _pick(rows, "goal12", metric)
    if not got:   # a sweep analysed before the goal was added
        return []
    g = got[0]
    if g["note"] == "not run":
        return [f"{metric}: `{g['policy']}` did not run at every batch size"]
    bs = _pick(rows, "goal12_batch", metric)
    return [f"{metric}: `{g['policy']}` / max(none, best fixed), mean of {g['n']} repetitions [min-max over them]; "
            f"goal (issue 12) >= 0.98 at every batch: worst {g['ratio']} -> **{g['note']}**", "",
            "| " + " | ".join(f"b={r['batch']}" for r in bs) + " |", "|" + "---|" * len(bs),
            "| " + " | ".join(f"{r['ratio']} [{r['lo']}-{r['hi']}]" for r in bs) + " |"]


def _table(rows: list[dict], metric: str) -> list[str]:
    base = _pick(rows, "baseline", metric)
    batches = [r["batch"] for r in base]
    head = "| policy | " + " | ".join(f"b={b}" for b in batches)
    out = [f"**{metric}** throughput, tok/s, mean over repetitions (gap to max(none, best fixed) at that batch, "
           "computed within each repetition, then averaged):", "", head + " | worst gap |",
           "|---|" + "---|" * (len(batches) + 1)]
    thr = _pick(rows, "throughput", metric)
    for w in _pick(rows, "worst_gap", metric):
        cs = ["-" if r["tok_s"] == "-" else f"{r['tok_s']} ({r['gap']}%)" for r in thr if r["policy"] == w["policy"]]
        out.append(f"| {w['policy']} | " + " | ".join(cs) + f" | {w['gap'] if w['gap'] == '-' else w['gap'] + '%'} |")
    out.append("| **baseline** (of the mean) | " + " | ".join(f"{r['tok_s']} ({r['policy']})" for r in base) + " | |")
    out += ["", "tokens per step (mean emitted per sequence per verify):", "", head + " |",
            "|---|" + "---|" * len(batches)]
    tps = _pick(rows, "tps", metric)
    for p in dict.fromkeys(r["policy"] for r in tps):
        out.append(f"| {p} | " + " | ".join(r["tps"] for r in tps if r["policy"] == p) + " |")
    return out


def where_lines(rows: list[dict]) -> list[str]:
    """The `where` rows as results.md prints them."""
    return WHERE_HEAD + [f"| {r['batch']} | {r['steps']} | {r['draft_extra']}% | {r['idle_extra']}% | "
                         f"{r['outside']}% | {r['total']}% |" for r in rows]


def render(rows: list[dict]) -> str:
    """One variant's results.md from its rows."""
    known = {"runs", "noise", "verdict", "goal12", "goal12_batch", "throughput", "worst_gap", "baseline", "tps",
             "where"}
    bad = sorted({r["section"] for r in rows} - known)
    if bad:
        raise SystemExit(f"variants.csv: variant {rows[0]['variant']}: unknown section {bad[0]!r}")
    runs = _pick(rows, "runs")[0]
    md = [f"Runs: `{runs['note']}` ({runs['n']} cells)."]
    for n in _pick(rows, "noise"):
        md += ["", f"Repeatability: the same cell's e2e throughput in any two repetitions differs by {n['ratio']}% on "
               f"average, {n['hi']}% at most ({n['n']} pairs): differences below that are noise."]
    for metric in METRICS:
        goal = _goal12(rows, metric)
        md += ["", _verdict(_pick(rows, "verdict", metric)[0]), ""] + (goal + [""] if goal else [])
        md += _table(rows, metric)
    where = _pick(rows, "where")
    if where:
        md += [""] + where_lines(where)
    md += ["", FIGURES]
    return "\n".join(md) + "\n"


def read(path: Path = TABLE) -> list[dict]:
    if not path.is_file():
        raise SystemExit(f"{path}: no such table (experiments/real_pareto/variants.csv holds every variant's figures)")
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    if rows and set(FIELDS) - set(rows[0]):
        raise SystemExit(f"{path}: missing columns {sorted(set(FIELDS) - set(rows[0]))}")
    return rows


def of_variant(rows: list[dict], variant: str) -> list[dict]:
    got = [r for r in rows if r["variant"] == variant]
    if not got:
        have = ", ".join(dict.fromkeys(r["variant"] for r in rows))
        raise SystemExit(f"variants.csv: no variant {variant!r}; it holds {have}")
    return got


def write(path: Path, variant: str, new: list[dict]) -> None:
    """Replace the variant's rows in the table (or add them), atomically; a rewritten variant goes last."""
    rows = [r for r in read(path) if r["variant"] != variant] if path.is_file() else []
    rows += [dict(r, variant=variant) for r in new]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=FIELDS, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    atomic_write(path, buf.getvalue())


def goodput(rows: list[dict], metric: str) -> str:
    """goodput / max(none, best fixed) per batch, mean of the repetitions, one line per variant."""
    out = []
    for v in dict.fromkeys(r["variant"] for r in rows):
        bs = _pick(of_variant(rows, v), "goal12_batch", metric)
        if bs:
            if not out:
                out += [f"| variant ({metric}) | " + " | ".join(f"b={r['batch']}" for r in bs) + " |",
                        "|---|" + "---:|" * len(bs)]
            out.append(f"| {v} | " + " | ".join(r["ratio"] for r in bs) + " |")
    return "\n".join(out)


def check(rows: list[dict], rev: str) -> list[str]:
    """Per variant: its results.md rendered from the table against the one git holds at `rev` (the variant folders
    before variants.csv; `default`: the results.md beside them): identical, DIFFERENT or absent."""
    out = []
    for v in dict.fromkeys(r["variant"] for r in rows):
        path = "results.md" if v == "default" else f"{v}/results.md"
        got = subprocess.run(["git", "show", f"{rev}:experiments/real_pareto/{path}"], cwd=HERE, capture_output=True,
                             text=True)
        verdict = "no results.md there" if got.returncode else (
            "identical" if render(of_variant(rows, v)) == got.stdout else "DIFFERENT")
        out.append(f"{v}: {verdict}")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=("show", "list", "goodput", "check"))
    ap.add_argument("variant", nargs="?", help="show: the sweep's name; check: a git revision")
    ap.add_argument("--metric", choices=METRICS, default="e2e")
    ap.add_argument("--table", type=Path, default=TABLE)
    a = ap.parse_args(argv)
    rows = read(a.table)
    if a.what == "list":
        for r in _pick(rows, "runs"):
            print(f"{r['variant']}: {r['note']}, {r['n']} cells")
    elif a.what == "goodput":
        print(goodput(rows, a.metric))
    elif a.variant is None:
        raise SystemExit(f"variants.py {a.what}: which {'variant' if a.what == 'show' else 'revision'}? e.g. "
                         "variants.py show idle (variants.py list names them), variants.py check 911d612")
    elif a.what == "check":
        lines = check(rows, a.variant)
        print("\n".join(lines))
        if any(not line.endswith(": identical") for line in lines):
            raise SystemExit(f"variants.py check: not every sweep's results.md at {a.variant} is the table's")
    else:
        print(render(of_variant(rows, a.variant)), end="")


if __name__ == "__main__":
    main()
