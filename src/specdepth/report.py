"""Collect the runs of a sweep directory into one table, and plot them.

    specdepth-report outputs/multirun/policy_grid              # table + CSV + PNG plots in <sweep>/report/
    specdepth-report outputs/multirun/policy_grid --no-plots --out /tmp/r

Reads every run's summary.json and config.yaml below the sweep dir (finished runs only), writes
`runs.csv` (one row per run: the summary, then the config keys the sweep varied, then the run dir),
prints markdown pivot tables (batch size x policy) and draws, against batch size with one line per
policy: throughput.png, tpot.png (p50 solid, p99 dashed), tokens_per_step.png and speedup.png (over
no speculation, i.e. the run with no draft tokens and otherwise the same config). A sweep that varies
other keys too (e.g. acceptance.mean) gets one panel (and one table) per combination of them.
Partial sweeps are fine: the report says which runs of the last sweep launched there are missing.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from pathlib import Path

from hydra.experimental.callback import Callback

from ._resolvers import config_hash, run_identity
from .results import _cell, atomic_savefig, atomic_write, timing_mode

KEYS = ("policy", "batch_size", "throughput_tok_s", "tokens_per_step", "acceptance_rate", "tpot_p50_s",
        "flops_per_token")
SUMMARY, CONFIG = "summary.json", "config.yaml"
NEEDED = ("policy", "batch_size", "throughput_tok_s")   # a summary.json without them is reported, not read


# ----------------------------------------------------------------------------------------------- collect
def _flatten(d, prefix: str = "") -> dict:
    out = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        if not d and prefix:
            out[prefix[:-1]] = "{}"
    else:
        out[prefix[:-1]] = json.dumps(d) if isinstance(d, list) else d
    return out


def _load_config(run_dir: Path) -> dict | None:
    p = run_dir / CONFIG
    if not p.is_file():
        return None
    try:
        from omegaconf import OmegaConf
        c = OmegaConf.to_container(OmegaConf.load(p))
        return c if isinstance(c, dict) else None
    except Exception:
        return None


def collect(sweep_dir) -> list[dict]:
    """Every finished run (a summary.json) below sweep_dir: its summary plus `run_dir`, and `config`
    (the flattened run identity from config.yaml; {} when there is none)."""
    rows = []
    sweep_dir = Path(sweep_dir)
    for s in sorted(sweep_dir.rglob(SUMMARY)):
        if any(part.startswith(".") for part in s.relative_to(sweep_dir).parts[:-1]):
            continue  # .submitit/, .hydra/
        row, why = _read_summary(s)
        if why is not None:
            continue
        cfg = _load_config(s.parent)
        row["run_dir"] = str(s.parent)
        row["config"] = _flatten(run_identity(cfg)) if cfg else {}
        row["_baseline_key"] = _baseline_key(cfg) if cfg else None
        rows.append(row)
    return rows


def _read_summary(path: Path) -> tuple[dict | None, str | None]:
    """(a run's summary, None), or (None, why it is no usable summary: not JSON, not an object, a key the
    report reads missing)."""
    try:
        row = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, OSError) as e:
        return None, f"{type(e).__name__}: {e}"
    if not isinstance(row, dict):
        return None, "not a JSON object"
    lacks = [k for k in NEEDED if k not in row or (row[k] is None and k != "throughput_tok_s")]
    if lacks:
        return None, f"lacks {', '.join(map(repr, lacks))} (not a specdepth summary.json)"
    return row, None


def _group_key(row: dict) -> tuple:
    return tuple(row.get(k) for k in ("backend", "model", "hardware", "cost", "acceptance", "workload", "batch_size"))


def _baseline_key(cfg: dict) -> str:
    """Everything of the run's config but the policy: runs with the same key differ only in policy."""
    ident = run_identity(cfg)
    ident.pop("policy", None)
    return config_hash(ident, 16)


def add_speedup(rows: list[dict]) -> list[dict]:
    """speedup_vs_none: throughput over the no-speculation run (0 draft tokens) of the same setting:
    the same config but the policy (or, for runs without config.yaml, the same model, hardware, cost,
    acceptance, workload and batch size)."""
    def key(r):
        return r.get("_baseline_key") or _group_key(r)

    base = {}
    for r in rows:
        if r.get("draft_tokens") == 0 and r.get("throughput_tok_s"):
            base[key(r)] = r["throughput_tok_s"]
    for r in rows:
        b = base.get(key(r))
        r["speedup_vs_none"] = (r["throughput_tok_s"] / b) if b and r.get("throughput_tok_s") else None
    return rows


def varying_keys(rows: list[dict]) -> list[str]:
    """Config keys (dotted) whose value differs between runs, in config order."""
    keys = list(dict.fromkeys(k for r in rows for k in r.get("config", {})))
    return [k for k in keys if len({json.dumps(r.get("config", {}).get(k), default=str) for r in rows}) > 1]


def _is_batch_key(k: str) -> bool:
    return k in ("workload.batch_size", "workload.max_concurrency")


def label_rows(rows: list[dict]) -> tuple[list[dict], list[str]]:
    """Adds `series` (the policy label, plus the policy keys the sweep varied when the label alone does
    not tell runs apart) and `facet` (the other varied keys, e.g. "acceptance.mean=0.9"; "" if none)."""
    vary = varying_keys(rows)
    pol = [k for k in vary if k == "policy" or k.startswith("policy.")]
    facet_keys = [k for k in vary if not (k in pol or _is_batch_key(k))]
    for r in rows:
        c = r.get("config", {})
        r["facet"] = ", ".join(f"{k}={c.get(k)}" for k in facet_keys)
    # does the label separate the runs of one (facet, batch size)?
    seen, ambiguous = {}, False
    for r in rows:
        k = (r["facet"], r.get("batch_size"), r.get("policy"))
        ident = tuple(r.get("config", {}).get(p) for p in pol)
        if seen.setdefault(k, ident) != ident:
            ambiguous = True
    for r in rows:
        c = r.get("config", {})
        extra = [f"{k.split('.', 1)[-1]}={c.get(k)}" for k in pol if k != "policy._target_" and k in c]
        r["series"] = f"{r.get('policy')} ({', '.join(extra)})" if ambiguous and extra else str(r.get("policy"))
    return rows, facet_keys


def _series_order(rows: list[dict]) -> list[str]:
    """Baselines (no draft tokens) first, then by name."""
    names = {}
    for r in rows:
        names.setdefault(r["series"], r.get("draft_tokens") == 0)
    return sorted(names, key=lambda s: (not names[s], s))


# ------------------------------------------------------------------------------------------- missing runs
def expected_jobs(sweep_dir) -> tuple[list[tuple[str, ...]], list[str]] | None:
    """The jobs of the last sweep launched in sweep_dir (its multirun.yaml, basic sweeper only), each as
    its sorted overrides minus the keys that do not change results; and those excluded keys."""
    p = Path(sweep_dir) / "multirun.yaml"
    if not p.is_file():
        return None
    try:
        from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
        from hydra.core.override_parser.overrides_parser import OverridesParser
        from omegaconf import OmegaConf

        m = OmegaConf.load(p)
        h = m.hydra
        if "BasicSweeper" not in str(h.sweeper.get("_target_", "")):
            return None
        params = h.sweeper.get("params") or {}
        args = [f"{k}={v}" for k, v in params.items()] + list(h.overrides.task)
        parsed = OverridesParser.create().parse_overrides(args)
        jobs = [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]
        exclude = list(h.job.config.override_dirname.get("exclude_keys") or [])
        return [_job_key(j, exclude) for j in jobs], exclude
    except Exception:
        return None


def _job_key(overrides, exclude) -> tuple[str, ...]:
    keep = []
    for o in overrides:
        k = o.split("=", 1)[0].lstrip("+~")
        if k.startswith("hydra.") or k in exclude:
            continue
        keep.append(o)
    return tuple(sorted(keep))


def _broken(sweep_dir: Path, done: set) -> dict:
    """Run dirs below sweep_dir that hold no usable result: {failed: {dir: error}, corrupt: {summary.json: why},
    unfinished: [dirs]} (failed: the job's error.txt; corrupt: a summary.json that cannot be read, _read_summary)."""
    failed, corrupt, unfinished = {}, {}, []
    for s in sorted(sweep_dir.rglob(SUMMARY)):
        if str(s.parent.resolve()) not in done and not any(
                part.startswith(".") for part in s.relative_to(sweep_dir).parts[:-1]):
            corrupt[str(s)] = _read_summary(s)[1]
    for d in sorted(p for p in sweep_dir.rglob("*") if p.is_dir() and (p / ".hydra").is_dir()):
        if str(d.resolve()) in done or (d / SUMMARY).is_file():
            continue
        if (d / "error.txt").is_file():
            failed[str(d)] = (d / "error.txt").read_text(errors="replace").strip()
        else:
            unfinished.append(str(d))
    return dict(failed=failed, corrupt=corrupt, unfinished=unfinished)


def missing(sweep_dir, rows: list[dict]) -> dict:
    """{expected: n or None, missing: [override strings], unfinished: [run dirs without summary.json],
    failed: {run dir: error}, corrupt: {run dir: why its summary.json cannot be read}}."""
    sweep_dir = Path(sweep_dir)
    done = {str(Path(r["run_dir"]).resolve()) for r in rows}
    broken = _broken(sweep_dir, done) if sweep_dir.is_dir() else dict(failed={}, corrupt={}, unfinished=[])
    exp = expected_jobs(sweep_dir)
    if exp is None:
        return dict(expected=None, missing=[], **broken)
    jobs, exclude = exp
    have = set()
    for r in rows:
        ov = Path(r["run_dir"]) / ".hydra" / "overrides.yaml"
        try:
            from omegaconf import OmegaConf
            have.add(_job_key(OmegaConf.to_container(OmegaConf.load(ov)), exclude))
        except Exception:
            pass
    miss = [" ".join(j) for j in dict.fromkeys(jobs) if j not in have]
    return dict(expected=len(set(jobs)), missing=miss, **broken)


# ------------------------------------------------------------------------------------------------ tables
def pivot_markdown(rows: list[dict], value: str = "throughput_tok_s", fmt: str = ",.0f",
                   series: str = "policy") -> str:
    """Rows = batch size, columns = policy (or another `series` key)."""
    if series == "series" and all("series" in r for r in rows):
        policies = _series_order(rows)
    else:
        policies = list(dict.fromkeys(r[series] for r in rows))
    sizes = sorted({r["batch_size"] for r in rows})
    cell = {(r["batch_size"], r[series]): r.get(value) for r in rows}
    out = ["| batch | " + " | ".join(policies) + " |", "|---:|" + "---:|" * len(policies)]
    for b in sizes:
        vals = [cell.get((b, p)) for p in policies]
        out.append(f"| {b} | " + " | ".join("-" if v is None else format(v, fmt) for v in vals) + " |")
    return "\n".join(out)


def _csv_value(v):
    if v is None:
        return ""
    if isinstance(v, (list, dict)):
        return json.dumps(v)
    return _cell(v)


def write_csv(rows: list[dict], path) -> Path:
    """One row per run: summary fields, then `cfg.<key>` for each key the sweep varied, then run_dir."""

    skip = {"run_dir", "config", "_baseline_key", "series", "facet"}
    cols = list(dict.fromkeys(k for r in rows for k in r if k not in skip))
    vary = varying_keys(rows)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(cols + [f"cfg.{k}" for k in vary] + ["run_dir"])
    for r in rows:
        w.writerow([_csv_value(r.get(c)) for c in cols] + [_csv_value(r["config"].get(k)) for k in vary]
                   + [r["run_dir"]])
    path = Path(path)
    atomic_write(path, buf.getvalue())
    return path


# ------------------------------------------------------------------------------------------------- plots
PLOTS = (  # file, title, y label, [(metric, scale, line style)]
    ("throughput.png", "Throughput", "output tokens / s", [("throughput_tok_s", 1.0, "-")]),
    ("tpot.png", "Time per output token (p50 solid, p99 dashed)", "ms",
     [("tpot_p50_s", 1e3, "-"), ("tpot_p99_s", 1e3, "--")]),
    ("tokens_per_step.png", "Tokens per step (per sequence)", "tokens / step", [("tokens_per_step", 1.0, "-")]),
    ("speedup.png", "Speed-up over no speculation", "x throughput of no speculation",
     [("speedup_vs_none", 1.0, "-")]),
)


def plot(rows: list[dict], out_dir) -> list[Path]:
    """The PNGs of PLOTS in out_dir: x = batch size (log 2), one line per series, one panel per facet."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    facets = sorted({r["facet"] for r in rows})
    series = _series_order(rows)
    colors = {s: f"C{i % 10}" for i, s in enumerate(series)}
    written = []
    n = len(facets)
    ncol = min(n, 3)
    nrow = (n + ncol - 1) // ncol
    for fname, title, ylabel, metrics in PLOTS:
        if not any(r.get(m) is not None for r in rows for m, _, _ in metrics):
            continue
        fig, axes = plt.subplots(nrow, ncol, figsize=(5.2 * ncol, 3.8 * nrow), squeeze=False)
        for ax in axes.flat[n:]:
            ax.set_visible(False)
        for ax, facet in zip(axes.flat, facets):
            sub = [r for r in rows if r["facet"] == facet]
            for s in series:
                pts = sorted((r["batch_size"], r) for r in sub if r["series"] == s and r.get("batch_size"))
                for m, scale, style in metrics:
                    xy = [(b, r[m] * scale) for b, r in pts if r.get(m) is not None]
                    if not xy:
                        continue
                    ax.plot([x for x, _ in xy], [y for _, y in xy], style, marker="o", ms=3, color=colors[s],
                            label=s if style == "-" else None)
            if fname == "speedup.png":
                ax.axhline(1.0, color="grey", lw=0.8, ls=":")
            ax.set_xscale("log", base=2)
            sizes = sorted({r["batch_size"] for r in sub if r.get("batch_size")})
            if sizes:
                ax.set_xticks(sizes, [str(b) for b in sizes])
                ax.minorticks_off()
            ax.set_xlabel("batch size")
            ax.set_ylabel(ylabel)
            ax.set_title(facet or title, fontsize=9 if facet else 10)
            ax.grid(alpha=0.3)
        handles, labels = axes.flat[0].get_legend_handles_labels()
        faceted = facets != [""]
        if faceted:
            fig.suptitle(title, fontsize=11)
        if handles:
            fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 6), fontsize=8, frameon=False)
        fig.tight_layout(rect=(0, 0.07 if handles else 0, 1, 0.96 if faceted else 1))
        path = out_dir / fname
        try:
            atomic_savefig(fig, path, dpi=110)
        finally:
            plt.close(fig)
        written.append(path)
    return written


# ------------------------------------------------------------------------------------------------ report
def render(sweep_dir, rows: list[dict] | None = None, gaps: dict | None = None) -> str:
    """The markdown report: per facet, throughput and speed-up by batch size x policy; what is missing."""
    rows = add_speedup(collect(sweep_dir)) if rows is None else rows
    if gaps is None:
        gaps = missing(sweep_dir, rows)
    parts = []
    if not rows:
        bad = len(gaps.get("corrupt") or {})
        parts.append(f"no finished runs (summary.json) under {sweep_dir}"
                     + (f"; {bad} summary.json cannot be read (CORRUPT below)" if bad else ""))
    else:
        label_rows(rows)
        parts.append(f"{len(rows)} runs under {sweep_dir}")
        timed = sum(1 for r in rows if timing_mode(r))
        if timed:
            parts.append(f"TIMING MODE: {timed} of them ran a real backend with backend.acceptance=simulated "
                         "(real forwards and wall clock, accept/reject from the acceptance model; not lossless)")
        for facet in sorted({r["facet"] for r in rows}):
            sub = [r for r in rows if r["facet"] == facet]
            if facet:
                parts += ["", f"### {facet}"]
            parts += ["", "Throughput (output tokens/s):", pivot_markdown(sub, series="series")]
            if any(r.get("speedup_vs_none") is not None for r in sub):
                parts += ["", "Speed-up over no speculation:",
                          pivot_markdown(sub, "speedup_vs_none", ".2f", series="series")]
    parts += _optuna_text(sweep_dir)
    parts += _gaps_text(gaps)
    return "\n".join(parts)


def _optuna_text(sweep_dir) -> list[str]:
    """The Optuna sweeper's result (optimization_results.yaml), when the sweep was a study."""
    p = Path(sweep_dir) / "optimization_results.yaml"
    if not p.is_file():
        return []
    try:
        from omegaconf import OmegaConf
        r = OmegaConf.to_container(OmegaConf.load(p))
        params = ", ".join(f"{k}={v}" for k, v in (r.get("best_params") or {}).items())
        value = r.get("best_value")
        return ["", f"Optuna best: {value:,.1f} ({params})" if isinstance(value, (int, float))
                else f"Optuna best: {value} ({params})"]
    except Exception:
        return []


def _gaps_text(gaps: dict, limit: int = 20) -> list[str]:
    out = []
    if gaps["expected"] is not None:
        miss = gaps["missing"]
        if miss:
            out += ["", f"MISSING: {len(miss)} of {gaps['expected']} runs of the last sweep here have no "
                        f"summary.json (rerun the same sweep command: finished runs are skipped):"]
            out += [f"  {m}" for m in miss[:limit]]
            if len(miss) > limit:
                out.append(f"  ... and {len(miss) - limit} more")
        else:
            out += ["", f"complete: all {gaps['expected']} runs of the last sweep here are finished"]
    for kind, head in (("failed", "FAILED: {n} runs (their error.txt; the sweep's failures.jsonl):"),
                       ("corrupt", "CORRUPT: {n} runs whose summary.json cannot be read (rerun with resume=false):")):
        items = gaps.get(kind) or {}
        if items:
            out += ["", head.format(n=len(items))]
            out += [f"  {d}: {why}" for d, why in list(items.items())[:limit]]
    if gaps["unfinished"]:
        out += ["", f"{len(gaps['unfinished'])} run dirs without summary.json (killed or still running):"]
        out += [f"  {d}" for d in gaps["unfinished"][:limit]]
    return out


def report(sweep_dir, out_dir=None, plots: bool = True) -> tuple[str, list[Path]]:
    """Write runs.csv (+ PNGs) to out_dir (default <sweep_dir>/report); returns (markdown, files)."""
    sweep_dir = Path(sweep_dir)
    rows = add_speedup(collect(sweep_dir))
    gaps = missing(sweep_dir, rows)
    text = render(sweep_dir, rows, gaps)
    files = []
    if rows:
        out_dir = Path(out_dir) if out_dir is not None else sweep_dir / "report"
        files.append(write_csv(rows, out_dir / "runs.csv"))
        if plots:
            files += plot(rows, out_dir)
    return text, files


RESULTS_BEGIN, RESULTS_END = "<!-- results:begin -->", "<!-- results:end -->"


def replace_results(readme, text: str) -> bool:
    """Put `text` between the README's results markers (atomically); False when the file or a marker is
    missing. The studies' analyze.py scripts keep their README tables current with this."""
    p = Path(readme)
    if not p.is_file():
        return False
    old = p.read_text()
    if RESULTS_BEGIN not in old or RESULTS_END not in old:
        return False
    head, rest = old.split(RESULTS_BEGIN, 1)
    atomic_write(p, head + RESULTS_BEGIN + "\n" + text + RESULTS_END + rest.split(RESULTS_END, 1)[1])
    return True


class ReportCallback(Callback):
    """Hydra callback: print the sweep's table when a multirun ends (and, with files=true, write the CSV
    and plots to <sweep dir>/report)."""

    def __init__(self, files: bool = False, plots: bool = False) -> None:
        self.files, self.plots = files, plots

    def on_multirun_end(self, config, **kwargs) -> None:
        sweep_dir = config.hydra.sweep.dir
        if self.files:
            text, written = report(sweep_dir, plots=self.plots)
            if written:
                text += f"\n\nwritten: {', '.join(str(p) for p in written)}"
        else:
            text = render(sweep_dir)
        print(text, flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="specdepth-report", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sweep_dir", help="a sweep dir, e.g. outputs/multirun/<name>")
    ap.add_argument("--out", help="where runs.csv and the PNGs go (default: <sweep_dir>/report)")
    ap.add_argument("--no-plots", action="store_true", help="only the table and runs.csv")
    a = ap.parse_args(argv)
    if not Path(a.sweep_dir).is_dir():
        print(f"specdepth-report: error: not a directory: {a.sweep_dir}", file=sys.stderr)
        return 2
    try:
        text, files = report(a.sweep_dir, a.out, plots=not a.no_plots)
    except ImportError as e:
        print(f"specdepth-report: error: {e} (plots need matplotlib: pip install 'specdepth[report]', "
              f"or pass --no-plots)", file=sys.stderr)
        return 2
    except OSError as e:
        where = e.filename if e.filename is not None else (a.out or Path(a.sweep_dir) / "report")
        print(f"specdepth-report: error: cannot write {where}: {e.strerror or e} (pass --out a directory that "
              f"can be created)", file=sys.stderr)
        return 2
    print(text)
    if files:
        print("\nwritten:\n" + "\n".join(f"  {p}" for p in files))
        return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())
