"""Analyse a robustness draw (issue 12): every policy against max(none, best fixed depth 1-8), per cell.

    .venv/bin/python experiments/robustness/analyze.py outputs/robustness/seed1 [--out DIR] [--readme FILE]
                                                       [--label "seed 1 (development)"]
                                                       [--table experiments/robustness/draws.csv --role "held out"]

Reads <draw>/cells.json and every <draw>/c<id>/<pol>/summary.json that run.py wrote. Per cell:
  base       max over none, fixed1..fixed8 of throughput_tok_s (end-to-end: prefill and tail included)
  ratio      a policy's throughput / base
  tpot       on poisson cells, a policy's TPOT p50 / the best (lowest) TPOT p50 of none, fixed1..fixed8
Per policy: worst and geometric-mean ratio, cells below 0.99 and 0.95, cells more than 1 % below `none`,
worst TPOT ratio on poisson cells, mean depth changes per request.
Goals (issue 12): goodput >= 0.99 x base in every cell, TPOT p50 <= 1.02 x best on poisson cells, geometric
mean >= 1.02, >= 0.98 x oracle_expected; batch_scaled and confidence >= 0.95 x base and >= 0.99 x none.
goodput's regret split per cell (ratios, 1 = no loss): luck = oracle / oracle_expected, estimation =
oracle_expected / goodput_true (goodput planning with the clock's true cost), cost-model error =
goodput_true / goodput. Where the draw has `oracle_causal` runs (oracle_expected without its look-ahead at the
confidences of tokens not drafted yet), estimation splits further into information = oracle_causal /
oracle_expected (what no causal policy can know) and estimation given it = goodput_true / oracle_causal.
Writes results.md and figures to --out (default: the draw dir), the README's results section when --readme is
given, and the draw's rows of the single table of every draw (draws.py) when --table is; results.md lists the
runs whose summary.json records a RuntimeWarning, if any (app.runtime_warnings).
`--show 74,127`: prints those cells' ratios for every policy (and TPOT on poisson cells), writes nothing.
`--stalls 217`: a cell's TPOT p50 per policy with and without the prefills that stalled its requests' decode;
`--stalls all`: over every poisson cell, each policy's TPOT p50 against the best of none / fixed 1-8, both ways.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import draws  # noqa: E402

from specdepth.report import replace_results  # noqa: E402
from specdepth.results import atomic_savefig, atomic_write  # noqa: E402

BASELINES = ("none",) + tuple(f"fixed{k}" for k in range(1, 9))
ADAPTIVE = ("goodput", "batch_scaled", "confidence", "ema", "heuristic", "bandit", "disable_by_batch",
            "batch_table")
BOUNDS = ("oracle", "oracle_expected", "oracle_causal", "goodput_true", "goodput_model")


def load(draw: Path) -> tuple[list[dict], dict]:
    if not (draw / "cells.json").is_file():
        raise SystemExit(f"{draw}: no cells.json here: expected a draw's folder, run.py's <out>/seed<seed>")
    cells = json.loads((draw / "cells.json").read_text())
    runs = {}
    for c in cells:
        d = draw / f"c{c['id']}"
        if not d.is_dir():
            continue
        for p in d.iterdir():
            s = p / "summary.json"
            if s.is_file():
                runs[c["id"], p.name] = json.loads(s.read_text())
    return cells, runs


def table(cells, runs) -> list[dict]:
    """One row per complete cell: base throughput, best TPOT, and per policy its ratios."""
    rows = []
    for c in cells:
        got = {p: runs[c["id"], p] for p in BASELINES + ADAPTIVE + BOUNDS if (c["id"], p) in runs}
        if not all(b in got for b in BASELINES):
            continue
        thr = {p: s["throughput_tok_s"] for p, s in got.items()}
        base = max(thr[b] for b in BASELINES)
        row = dict(cell=c, base=base, best=max(BASELINES, key=thr.get), thr=thr,
                   ratio={p: v / base for p, v in thr.items()},
                   vs_none={p: v / thr["none"] for p, v in thr.items()},
                   changes={p: s.get("depth_changes_per_request") for p, s in got.items()})
        if c["kind"] == "poisson":
            tp = {p: s["tpot_p50_s"] for p, s in got.items()}
            best_t = min(tp[b] for b in BASELINES)
            row["tpot"] = {p: v / best_t for p, v in tp.items()}
        rows.append(row)
    return rows


def _gm(xs):
    xs = [x for x in xs if x]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def _where(r) -> str:
    c = r["cell"]
    b = c["backend"]
    extra = "+oh" if b["step_overhead_s"] or b["position_overhead_s"] else ""
    return f"c{c['id']} {c['hardware']}/{c['model']}/{c['acc']}/{c['kind']}/b{c['batch']}/L{c['out_mean']}{extra}"


def policy_rows(rows, pols) -> list[dict]:
    out = []
    for p in pols:
        rs = [r for r in rows if p in r["ratio"]]
        if not rs:
            continue
        ratios = [r["ratio"][p] for r in rs]
        worst = min(rs, key=lambda r: r["ratio"][p])
        tp = [r["tpot"][p] for r in rs if "tpot" in r]
        ch = [r["changes"][p] for r in rs if r["changes"].get(p) is not None]
        fig = dict(name=p, n=len(rs), worst=f"{worst['ratio'][p]:.3f}", geo=f"{_gm(ratios):.3f}",
                   below=sum(x < 0.99 for x in ratios), below95=sum(x < 0.95 for x in ratios),
                   below_none=sum(r["vs_none"][p] < 0.99 for r in rs))
        if tp and ch:
            fig.update(cell=_where(worst), tpot_worst=f"{max(tp):.3f}", tpot_above=sum(x > 1.02 for x in tp),
                       changes=f"{sum(ch) / len(ch):.2f}")
        out.append(draws.row("policy", **fig))
    return out


def _met(ok: bool) -> str:
    return "MET" if ok else "NOT met"


def goals(rows) -> list[dict]:
    g = [r for r in rows if "goodput" in r["ratio"]]
    if not g:
        return [draws.row("goal", name="no_goodput")]
    worst = min(r["ratio"]["goodput"] for r in g)
    gm = _gm([r["ratio"]["goodput"] for r in g])
    tp = [r["tpot"]["goodput"] for r in g if "tpot" in r]
    out = [draws.row("goal", name="base", worst=f"{worst:.3f}", below=sum(r["ratio"]["goodput"] < 0.99 for r in g),
                     of=len(g), met=_met(worst >= 0.99))]
    if tp:
        out.append(draws.row("goal", name="tpot", worst=f"{max(tp):.3f}", below=sum(x > 1.02 for x in tp),
                             of=len(tp), met=_met(max(tp) <= 1.02)))
    out.append(draws.row("goal", name="geo", geo=f"{gm:.3f}", met=_met(gm >= 1.02)))
    oe = [r for r in g if "oracle_expected" in r["thr"]]
    if oe:
        rel = [r["thr"]["goodput"] / r["thr"]["oracle_expected"] for r in oe]
        out.append(draws.row("goal", name="oracle_expected", worst=f"{min(rel):.3f}",
                             below=sum(x < 0.98 for x in rel), of=len(rel), met=_met(min(rel) >= 0.98)))
    for p in ("batch_scaled", "confidence"):
        rs = [r for r in rows if p in r["ratio"]]
        if rs:
            w, wn = min(r["ratio"][p] for r in rs), min(r["vs_none"][p] for r in rs)
            out.append(draws.row("goal", name=p, worst=f"{w:.3f}", worst_none=f"{wn:.3f}",
                                 met=_met(w >= 0.95 and wn >= 0.99)))
    return out


def regret(rows) -> list[dict]:
    need = ("goodput", "goodput_true", "oracle", "oracle_expected")
    rs = [r for r in rows if all(p in r["thr"] for p in need)]
    if not rs:
        return [draws.row("regret", name="missing")]
    causal = all("oracle_causal" in r["thr"] for r in rs)   # estimation, split (policies/oracle_causal.py)
    parts = [("luck: oracle_expected / oracle", lambda t: t["oracle_expected"] / t["oracle"])]
    if causal:
        parts += [("information: oracle_causal / oracle_expected",
                   lambda t: t["oracle_causal"] / t["oracle_expected"]),
                  ("estimation given it: goodput_true / oracle_causal",
                   lambda t: t["goodput_true"] / t["oracle_causal"])]
    parts += [("estimation: goodput_true / oracle_expected", lambda t: t["goodput_true"] / t["oracle_expected"]),
              ("cost model: goodput / goodput_true", lambda t: t["goodput"] / t["goodput_true"]),
              ("total: goodput / oracle", lambda t: t["goodput"] / t["oracle"]),
              ("goodput / oracle_expected", lambda t: t["goodput"] / t["oracle_expected"])]
    if causal:
        parts.append(("goodput / oracle_causal", lambda t: t["goodput"] / t["oracle_causal"]))
    out = []
    for name, f in parts:
        xs = [f(r["thr"]) for r in rs]
        out.append(draws.row("regret", name=name, geo=f"{_gm(xs):.3f}", worst=f"{min(xs):.3f}",
                             below=sum(x < 0.98 for x in xs)))
    return out


def below(rows, p, limit) -> list[dict]:
    """The cells where policy p is below `limit` x max(none, best fixed): its ratio, the best baseline, and
    `oracle_expected`'s own ratio next to p / oracle_expected."""
    rs = sorted((r for r in rows if p in r["ratio"] and r["ratio"][p] < limit), key=lambda r: r["ratio"][p])
    out = [draws.row("below", name=p, note=limit, n=len(rs))]
    for r in rs:
        oe = {}
        if "oracle_expected" in r["thr"]:
            oe = dict(oracle_expected=f"{r['ratio']['oracle_expected']:.3f}",
                      vs_oracle_expected=f"{r['thr'][p] / r['thr']['oracle_expected']:.3f}")
        out.append(draws.row("below_cell", name=p, cell=_where(r), ratio=f"{r['ratio'][p]:.3f}", best=r["best"], **oe))
    return out


def below_none(rows, p) -> list[dict]:
    """The cells where policy p is more than 1 % below `none` (issue 12: batch_scaled and confidence never are)."""
    rs = sorted((r for r in rows if p in r["vs_none"] and r["vs_none"][p] < 0.99), key=lambda r: r["vs_none"][p])
    return [draws.row("below_none", name=p, n=len(rs))] + [
        draws.row("below_none_cell", name=p, cell=_where(r), ratio=f"{r['vs_none'][p]:.3f}", best=r["best"])
        for r in rs]


def show(rows, ids) -> str:
    """Every policy's ratio to max(none, best fixed) (and TPOT p50 / best on poisson cells) in the cells `ids`."""
    out = []
    for r in (r for r in rows if r["cell"]["id"] in ids):
        c = r["cell"]
        out.append(f"{_where(r)} (best {r['best']}): workload {c['workload']}, acceptance {c['acceptance']}, "
                   f"backend {c['backend']}")
        for p, x in r["ratio"].items():
            tp = f", TPOT {r['tpot'][p]:.3f}" if "tpot" in r else ""
            out.append(f"  {p}: {x:.3f} (of none {r['vs_none'][p]:.3f}{tp})")
    missing = sorted(set(ids) - {r["cell"]["id"] for r in rows})
    if missing:
        out.append(f"(no complete cell {', '.join(f'c{i}' for i in missing)} in this draw)")
    return "\n".join(out)


def _tpot_split(d: Path) -> tuple[float, int, int, float] | None:
    """One run's (TPOT p50, requests whose decode held another request's prefill, requests, TPOT p50 without the
    prefill seconds inside each request's decode), from its steps.csv and requests.csv; None where it has none."""
    sf, rf = d / "steps.csv", d / "requests.csv"
    if not (sf.is_file() and rf.is_file()):
        return None
    with open(sf, newline="") as f:
        pre = [(float(r["time_s"]), float(r["prefill_s"])) for r in csv.DictReader(f) if float(r["prefill_s"]) > 0]
    with open(rf, newline="") as f:
        reqs = [r for r in csv.DictReader(f) if int(r["output_len"]) > 1]
    if not reqs:
        return None
    tp, net, hit = [], [], 0
    for r in reqs:
        a, b = float(r["first_token_s"]), float(r["finish_s"])
        inside = [x for t, x in pre if a < t < b]
        hit += bool(inside)
        tp.append(float(r["tpot_s"]))
        net.append(tp[-1] - sum(inside) / (int(r["output_len"]) - 1))
    return statistics.median(tp), hit, len(reqs), statistics.median(net)


def stalls_summary(draw: Path, pols=("goodput", "oracle_expected", "batch_scaled", "confidence")) -> str:
    """Over every poisson cell: each policy's TPOT p50 against the lowest of none and fixed 1-8, as is and with the
    prefill stalls taken out of both (the policy's decode alone)."""
    cells, _ = load(draw)
    got = {p: [] for p in pols}
    for c in cells:
        if c.get("kind") != "poisson":
            continue
        split = {p: _tpot_split(draw / f"c{c['id']}" / p) for p in (*BASELINES, *pols)}
        if any(v is None for v in split.values()):
            continue
        best = min(split[b][0] for b in BASELINES), min(split[b][3] for b in BASELINES)
        for p in pols:
            got[p].append((split[p][0] / best[0], split[p][3] / best[1]))
    out = [f"TPOT p50 / the lowest of none and fixed 1-8 on {len(next(iter(got.values())))} poisson cells: as is, and "
           "with the prefills that stalled each request's decode taken out"]
    for p, v in got.items():
        if v:
            out.append(f"  {p}: as is worst {max(x for x, _ in v):.3f}, > 1.02 in {sum(x > 1.02 for x, _ in v)}; "
                       f"decode alone worst {max(y for _, y in v):.3f}, > 1.02 in {sum(y > 1.02 for _, y in v)}")
    return "\n".join(out)


def stalls(draw: Path, cid: int, pols=None) -> str:
    """A poisson cell's TPOT p50 per policy, and how much of it is other requests' prefills: a step that prefills
    an admitted prompt stalls every running request's decode, so a request's TPOT holds the prefill seconds of the
    steps inside its decode (after its first token, before it finishes) over its output tokens. Per policy: TPOT
    p50, the requests with such a step, and TPOT p50 with those seconds taken out (`_tpot_split`)."""
    d = draw / f"c{cid}"
    if not d.is_dir():
        raise SystemExit(f"analyze.py: --stalls: no cell c{cid} in {draw}")
    out = [f"c{cid}: TPOT p50 (ms), requests whose decode held another request's prefill, TPOT p50 without it"]
    for p in pols or [*BASELINES, *ADAPTIVE, *BOUNDS]:
        got = _tpot_split(d / p)
        if got is not None:
            out.append(f"  {p}: {1e3 * got[0]:.2f}, {got[1]} of {got[2]}, {1e3 * got[3]:.2f}")
    return "\n".join(out)


def figure(rows, out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for p, m in (("goodput", "o"), ("batch_scaled", "s"), ("confidence", "^"), ("oracle_expected", "x")):
        pts = [(r["cell"]["batch"], r["ratio"][p]) for r in rows if p in r["ratio"]]
        if pts:
            ax.scatter(*zip(*pts), marker=m, s=14, alpha=0.7, label=p)
    ax.axhline(0.99, color="k", lw=0.8, ls="--")
    ax.axhline(0.95, color="grey", lw=0.8, ls=":")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size")
    ax.set_ylabel("throughput / max(none, best fixed)")
    ax.legend(fontsize=8)
    ax.set_title("robustness draw: every cell")
    fig.tight_layout()
    path = out / "ratio_by_batch.png"
    atomic_savefig(fig, path, dpi=110)
    plt.close(fig)
    return path


def figures(draw: Path, label: str, role: str = "") -> list[dict]:
    """The draw's rows of draws.csv: every figure its results.md shows."""
    cells, runs = load(draw)
    rows = table(cells, runs)
    out = [draws.row("draw", role=role, name=label, note=draw, n=len(rows), of=len(cells))]
    out += goals(rows) + policy_rows(rows, ADAPTIVE + BOUNDS + BASELINES) + regret(rows)
    for p, lim in (("goodput", 0.99), ("batch_scaled", 0.95), ("confidence", 0.95)):
        out += below(rows, p, lim)
    for p in ("goodput", "batch_scaled", "confidence", "oracle_expected"):
        out += below_none(rows, p)
    warned = runtime_warned(cells, runs)
    if warned:
        out += [draws.row("warning", n=len(warned))] + warned
    return out


def report(draw: Path, label: str) -> str:
    return draws.render(figures(draw, label))


def runtime_warned(cells, runs) -> list[dict]:
    """One row per run whose summary.json `warnings` holds a RuntimeWarning that app.runtime_warnings recorded
    (older runs recorded none: their draws show no such section, which does not say they had none)."""
    by_id = {c["id"]: c for c in cells}
    out = []
    for (cid, pol), s in sorted(runs.items()):
        found = [w for w in s.get("warnings") or [] if "Warning at " in w]
        if found:
            out.append(draws.row("warning_run", name=pol, cell=_where(dict(cell=by_id[cid])), note="; ".join(found)))
    return out


def draw_seed(draw: Path) -> int:
    """The seed in a draw's folder name (run.py's <out>/seed<seed>)."""
    digits = draw.name.removeprefix("seed")
    if not digits.isdigit():
        raise SystemExit(f"analyze.py --table: {draw}: expected run.py's folder <out>/seed<seed>")
    return int(digits)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("draw", type=Path)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--readme", type=Path, default=None)
    ap.add_argument("--label", default="")
    ap.add_argument("--table", type=Path, default=None,
                    help="also put the draw's figures into this table (experiments/robustness/draws.csv)")
    ap.add_argument("--role", default="held out", help="the draw's role in --table: held out or development")
    ap.add_argument("--show", default=None, help="c1,c2 or 1,2: print these cells' ratios only (writes nothing)")
    ap.add_argument("--stalls", default=None, help="a cell id: its TPOT p50 with and without other requests' "
                    "prefills, per policy; all: every poisson cell's, against the baselines (writes nothing)")
    a = ap.parse_args(argv)
    if a.stalls is not None:
        if a.stalls.strip() == "all":
            print(stalls_summary(a.draw))
            return
        try:
            cid = int(a.stalls.strip().lstrip("c"))
        except ValueError:
            raise SystemExit(f"analyze.py: --stalls {a.stalls!r}: expected a cell id, e.g. 217 or c217") from None
        print(stalls(a.draw, cid))
        return
    if a.show is not None:
        try:
            ids = {int(x.strip().lstrip("c")) for x in a.show.split(",") if x.strip()}
        except ValueError:
            raise SystemExit(f"analyze.py: --show {a.show!r}: expected cell ids, e.g. 74,127 or c74,c127") from None
        cells, runs = load(a.draw)
        print(show(table(cells, runs), ids))
        return
    out = a.out or a.draw
    out.mkdir(parents=True, exist_ok=True)
    fig = figures(a.draw, a.label or a.draw.name, a.role)
    text = draws.render(fig)
    atomic_write(out / "results.md", text)
    if a.table is not None:
        draws.write(a.table, draw_seed(a.draw), fig)
    cells, runs = load(a.draw)
    figure(table(cells, runs), out)
    if a.readme is not None:
        replace_results(a.readme, text)
    print(text)


if __name__ == "__main__":
    main()
