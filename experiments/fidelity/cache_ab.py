"""Issue 15, timing-mode fidelity: does specdepth-profile time the target forward the executor pays?

    taskset -c 1 env OMP_NUM_THREADS=1 .venv/bin/python experiments/fidelity/cache_ab.py 8 6   # batch, rounds

One process, interleaved rounds: specdepth-profile's own walk (profile.measure, run.sh's query/context grid,
target, batch b) with the cache growth before the fix (OLD) and after it (slots), and the executor's target
forwards in an engine run of `none` (timing mode, experiment=fidelity_timing, batch b). Prints the medians over
rounds: the profile's (b, q=1, c=128) point, and the forward the profile predicts for the run's steps (linear in
context between its c=0/128/256 points, averaged over the steps' contexts) against the measured forwards."""
import statistics as st
import sys
import time

import numpy as np
import torch
from hydra import compose as hydra_compose
from hydra import initialize_config_dir

from specdepth.app import CONF_DIR, build
from specdepth import profile as P
from specdepth.hf_runner import SlotCache
NEW = SlotCache.reserve
def OLD(self, rows, length):   # SlotCache.reserve before the fix: doubling from the first length it saw
    if rows > self.cap_rows:
        self.cap_rows = min(self.max_rows, max(rows, 2 * self.cap_rows))
    if length > self.cap_len:
        self.cap_len = min(self.max_len, max(length, 2 * self.cap_len, 64))
b, rounds = int(sys.argv[1]), int(sys.argv[2])
torch.set_num_threads(1)
with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
    cfg = hydra_compose("config", overrides=["experiment=fidelity_timing", "acceptance.alpha=0.85", "pol=none",
                                             f"workload.batch_size={b}", "threads=1", "engine.progress=false"])
grid = ([b], [1, 2, 3, 4, 5, 7, 9, 17, 64], [0, 128, 256])
parts = build(cfg); model = parts["executor"].target_model
def walk(reserve):
    SlotCache.reserve = reserve
    try:
        rows = P.measure([("target", model)], grid, 2, 5, 1)
    finally:
        SlotCache.reserve = NEW
    return {c: s for w, bb, q, c, s, *_ in rows if q == 1}
def engine():
    parts = build(cfg); ex = parts["executor"]; rec = []; orig = ex.tr.forward
    def fwd(rows_, toks, lens, qlens=None, want="last"):
        t0 = time.perf_counter(); out = orig(rows_, toks, lens, qlens, want)
        if want == "all": rec.append((int(lens.max()), time.perf_counter() - t0))
        return out
    ex.tr.forward = fwd
    parts["engine"].run()
    return rec
res = {"old": [], "new": [], "pred_old": [], "pred_new": [], "real": [], "real128": []}
for r in range(rounds):
    order = ["old", "new", "eng"]; order = order[r % 3:] + order[:r % 3]
    for o in order:
        if o == "eng":
            rec = engine(); ctx = np.array([c for c, _ in rec])
            res["real"].append(np.mean([t for _, t in rec])); res["real128"].append(st.median(t for c, t in rec if 112 <= c <= 144))
        else:
            pt = walk(OLD if o == "old" else NEW); res[o].append(pt[128])
            res["pred_" + o].append(("ctx", pt))
for o in ("old", "new"):   # the profile's prediction over the run's contexts (the last engine run's contexts)
    res["pred_" + o] = [np.mean(np.interp(ctx, [0, 128, 256], [pt[0], pt[128], pt[256]])) for _, pt in res["pred_" + o]]
m = {k: st.median(v) * 1e3 for k, v in res.items()}
print(f"b={b} rounds={rounds}: point c128 q1: profile OLD {m['old']:.3f} NEW {m['new']:.3f} | executor fwd ctx112-144 {m['real128']:.3f} "
      f"(executor/OLD {m['real128']/m['old']:.3f}, /NEW {m['real128']/m['new']:.3f})")
print(f"b={b} whole run (mean per step): predicted OLD {m['pred_old']:.3f} NEW {m['pred_new']:.3f} | executor {m['real']:.3f} "
      f"(executor/OLD {m['real']/m['pred_old']:.3f}, /NEW {m['real']/m['pred_new']:.3f})")
