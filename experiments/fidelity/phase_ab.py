"""Issue 15, timing-mode fidelity: where does a real step's time go, against what the simulator charges?

    taskset -c 1 env OMP_NUM_THREADS=1 .venv/bin/python experiments/fidelity/phase_ab.py POL BATCH [PROFILE.csv]

Runs one timing-mode cell (experiment=fidelity_timing, alpha 0.85) with every model forward of the executor
timed (shape and seconds), then, in the same process, the profiler's own forward (profile._time_point) at each
distinct shape the run used: back to back (`profiler`), and as specdepth-profile interleave=true times it
(`interleaved`: a draft forward at position 0 after a target forward, at positions >= 1 after a target and a
draft forward). Prints per phase (draft position 0, draft positions >= 1, verify): the measured forward, the
profiler's forwards at the same shapes, the table's (PROFILE, default the study's profile.csv) prediction, and
the phase's host time around the forward (phase - forward)."""
import sys
import time
from collections import defaultdict

import numpy as np
import torch
from hydra import compose as hydra_compose
from hydra import initialize_config_dir

from specdepth.app import CONF_DIR, build
from specdepth import profile as P
from specdepth.cost import TableCost
from specdepth.hf_runner import Runner

pol, b = sys.argv[1], int(sys.argv[2])
prof = sys.argv[3] if len(sys.argv) > 3 else "experiments/fidelity/profile.csv"
torch.set_num_threads(1)
with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
    cfg = hydra_compose("config", overrides=["experiment=fidelity_timing", "acceptance.alpha=0.85", f"pol={pol}",
                                             f"workload.batch_size={b}", "threads=1", "engine.progress=false"])
parts = build(cfg)
ex = parts["executor"]
rec = []            # (phase, which, m, Q, ctx(max lens), want, seconds)
phase = {"name": None}
ph_t = defaultdict(list)


def wrap(runner, which):
    orig = runner.forward

    def fwd(rows_, toks, lens, qlens=None, want="last"):
        t0 = time.perf_counter()
        out = orig(rows_, toks, lens, qlens, want)
        rec.append((phase["name"], which, toks.shape[0], toks.shape[1], int(lens.max()), want,
                    time.perf_counter() - t0))
        return out
    runner.forward = fwd


wrap(ex.tr, "target")   # the Runners exist once build() prepared the workload
wrap(ex.dr, "draft")
od, ov = ex.draft, ex.verify


def draft(rows, position):
    phase["name"] = "d0" if position == 0 else "d1+"
    c, t, f = od(rows, position)
    ph_t[phase["name"]].append(t)
    return c, t, f


def verify(drafted):
    phase["name"] = "v"
    a, t, f = ov(drafted)
    ph_t["v"].append(t)
    return a, t, f


ex.draft, ex.verify = draft, verify
res = parts["engine"].run()
rec = [r for r in rec if r[0] is not None]
table = TableCost(parts["cost"].target, parts["cost"].draft, path=prof)
# the profiler's forward at every distinct shape (ctx rounded to 16), in this process
models = {"target": ex.target_model, "draft": ex.draft_model}
shapes = sorted({(w, m, Q, (c // 16) * 16) for _, w, m, Q, c, _, _ in rec})
prof_t, int_t = {}, {}
rng = np.random.default_rng(0)
for w, m, Q, c in shapes:
    runner = Runner(models[w], m, c + Q + 200)
    trunner = Runner(models["target"], m, c + Q + 200)
    toks, lens = rng.integers(0, 1024, (m, Q)), np.full(m, c, np.int64)
    t1 = rng.integers(0, 1024, (m, 1))
    prof_t[(w, m, Q, c)] = P._time_point(runner, toks, lens, Q, 2, 5, torch.device("cpu"))
    if w == "draft":
        for pos, before in ((0, lambda: trunner.forward(slice(0, m), t1, lens, None, "last")),
                            (1, lambda: (trunner.forward(slice(0, m), t1, lens, None, "last"),
                                         runner.forward(slice(0, m), t1, lens, None, "last")))):
            int_t[(pos, m, Q, c)] = P._time_point(runner, toks, lens, Q, 2, 5, torch.device("cpu"), before)
print(f"pol={pol} b={b}: {len(ph_t['v'])} steps, wall {res.wall_s:.3f} s")
for ph in ("d0", "d1+", "v"):
    rs = [r for r in rec if r[0] == ph]
    if not rs:
        continue
    fw = sum(r[6] for r in rs)
    pf = sum(prof_t[(r[1], r[2], r[3], (r[4] // 16) * 16)] for r in rs)
    it = (sum(int_t[(int(ph != "d0"), r[2], r[3], (r[4] // 16) * 16)] for r in rs) if ph != "v" else pf)
    tb = sum(table.lookup(r[1], r[2], r[3], r[4]) for r in rs)
    tot = sum(ph_t[ph])
    n = len(ph_t[ph])
    qs = defaultdict(int)
    for r in rs:
        qs[r[3]] += 1
    print(f"  {ph:4s} calls {n:4d} (query {dict(qs)}): phase {tot / n * 1e3:.3f} ms  forward {fw / n * 1e3:.3f}  "
          f"profiler {pf / n * 1e3:.3f}  interleaved {it / n * 1e3:.3f}  table {tb / n * 1e3:.3f}  "
          f"host {(tot - fw) / n * 1e3:.3f}")
