"""Collect the acceptance traces of the real sweep for the simulator's replay (experiment=fidelity_sim).

    .venv/bin/python experiments/fidelity/prepare.py [outputs/multirun/real_pareto] [outputs/fidelity_traces]

For every finished real run <real>/r<rep>/b<batch>/<pol>/ (summary.json present) copies its
acceptance_trace.jsonl to <out>/r<rep>/b<batch>/<pol>.jsonl: the simulated run of the same cell replays the
exact accept/reject sequence the real run verified. A run that verified no draft token (no speculation, or
an adaptive policy that never drafted) recorded an empty trace; acceptance=trace needs at least one token,
so that cell gets the same (rep, batch)'s fixed1 trace (it is only read if the simulated policy drafts).
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

FALLBACK = ("fixed1", "fixed2", "fixed4", "fixed8")


def has_tokens(path: Path) -> bool:
    if not path.is_file():
        return False
    with path.open() as f:
        for line in f:
            if line.strip() and json.loads(line).get("accepted"):
                return True
    return False


def prepare(real: Path, out: Path) -> dict:
    cells = {}
    for s in sorted(real.glob("r*/b*/*/summary.json")):
        rd = s.parent
        rep, b, pol = rd.relative_to(real).parts
        cells[(rep, b, pol)] = rd / "acceptance_trace.jsonl"
    made = {}
    for (rep, b, pol), tr in cells.items():
        src = tr if has_tokens(tr) else None
        if src is None:
            for alt in FALLBACK:
                t = cells.get((rep, b, alt))
                if t is not None and has_tokens(t):
                    src = t
                    break
        if src is None:
            print(f"warning: no trace with draft tokens for {rep}/{b}/{pol}", file=sys.stderr)
            continue
        dst = out / rep / b / f"{pol}.jsonl"
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
        made[(rep, b, pol)] = str(src)
    return made


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    real = Path(argv[0] if argv else "outputs/multirun/real_pareto")
    out = Path(argv[1] if len(argv) > 1 else "outputs/fidelity_traces")
    made = prepare(real, out)
    own = sum(1 for (r, b, p), src in made.items() if Path(src).parent.name == p)
    print(f"{len(made)} traces -> {out} ({own} the cell's own, {len(made) - own} borrowed)")


if __name__ == "__main__":
    main()
