"""Study `trees`: draft trees against chains under the shared budget, on the simulator.

    OMP_NUM_THREADS=1 .venv/bin/python experiments/trees/run_trees.py [--out experiments/trees] [--seeds 3]
        [--batches 1,4,16,64,256] [--profiles sharp,mid,flat,tiny_pair] [--deployments all] [--output-len 128]

Runs in-process (Hydra composes one base config per deployment; each run goes through specdepth.app.build and
Engine.run, the code path of `specdepth`). A cell is (deployment, acceptance profile, batch): llama3_8b (TP 1)
and llama3_70b (TP 4, experiment=llama3_70b_tp4) on h100_sxm, h200 and b200; per-rank tables (acceptance=ranked)
`sharp` (alpha 0.8, decay 0.1), `mid` (0.6, 0.3), `flat` (0.4, 0.6) and `tiny_pair` (the shipped pair's
measured table, conf/acceptance/tiny_pair_ranks.yaml, where present); batch b = engine.max_batch_size, a closed
workload of max(2 b, 16) requests of 512 prompt and `--output-len` output tokens at t = 0. Policies: none, fixed
chains (depth 1, 2, 3, 4, 6, 8), static trees (`tree{N}`: the best N-node tree for the cell's true table, as
Sequoia builds one from measured acceptance, N = 2, 4, 8, 16, 32, cut to the token cap; `eagle`: EAGLE's
default tree; `tree_best`: the cell's best static tree, tree_oracle's uniform choice at the first step, kept), goodput (adaptive chains), tree_goodput, tree_confidence and tree_oracle, each over `--seeds`
outcome replicates (seed 0..S-1: the same outcomes for every policy of a seed).
Writes runs.csv (one row per run), cells.csv and cells.md (per cell, means over seeds: the best of each family
and the ratios the README reports) and trees.png.
"""
from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

import numpy as np
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from specdepth import tree as T
from specdepth.app import CONF_DIR, build
from specdepth.engine import STEP_COLUMNS
from specdepth.metrics import summarize
from specdepth.policies.kit import TreePrice, best_order, plan_trees
from specdepth.policy import Policy
from specdepth.results import atomic_write, csv_text

HERE = Path(__file__).resolve().parent
MODELS = (("llama3_8b", 1, ("model=llama3_8b",)), ("llama3_70b", 4, ("experiment=llama3_70b_tp4",)))
DEPLOYMENTS = {f"{m}_{hw}": (m, tp, hw, ov) for m, tp, ov in MODELS for hw in ("h100_sxm", "h200", "b200")}
PROFILES = {"sharp": dict(alpha=0.8, decay=0.1), "mid": dict(alpha=0.6, decay=0.3), "flat": dict(alpha=0.4, decay=0.6)}
CHAINS = (1, 2, 3, 4, 6, 8)
TREES = (2, 4, 8, 16, 32)
ADAPTIVE = ("goodput", "tree_goodput", "tree_confidence", "tree_oracle")
COLUMNS = ("deployment", "model", "tp", "hardware", "profile", "batch", "requests", "policy", "family", "nodes",
           "seed", "throughput_tok_s", "nodes_per_row", "tokens_per_step", "wall_s")
_S = {c: i for i, c in enumerate(STEP_COLUMNS)}


class StaticTree(Policy):
    """The best `nodes`-node tree for a known per-rank table, every row, every step (cut to the token cap)."""

    name = "static_tree"

    def __init__(self, nodes: int, table):
        self.order = best_order(np.asarray(table, float), int(nodes), 16)
        self._key = self._plan = None

    def plan(self, view):
        n = view.batch_size
        N = min(self.order.parent.size, (view.max_num_batched_tokens - n) // n)
        if self._key != (n, N):
            self._key, self._plan = (n, N), self.order.tree(N) if N > 0 else np.zeros(n, np.int64)
        return self._plan


class BestStaticTree(StaticTree):
    """The cell's best static tree (as Sequoia sizes one per hardware): tree_oracle's uniform choice at the run's
    first step (the true table, the cost model at the full batch's contexts), kept for the whole run."""

    name = "best_static_tree"

    def __init__(self, table, max_nodes: int = 64):
        self.table, self.max_nodes = np.asarray(table, float), int(max_nodes)
        self.order = None
        self._key = self._plan = None

    def plan(self, view):
        if self.order is None:
            n = view.batch_size
            N = min(self.max_nodes, (view.max_num_batched_tokens - n) // n)
            price = TreePrice().update(view.cost, view.context_lens)
            p = plan_trees(self.table, price, n, N, min(16, view.max_depth), steps=1)
            self.order = best_order(self.table, int(p.nodes), max(p.depth, 1))
        return super().plan(view)


def base(overrides) -> OmegaConf:
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("config", overrides=["engine.progress=false", "workload=closed", "workload.prompt_len=512",
                                             "acceptance=ranked", *overrides])


def profiles(names) -> dict:
    """Each profile's acceptance node (ranked) and its true table."""
    out = {}
    for name in names:
        if name == "tiny_pair":
            path = Path(CONF_DIR) / "acceptance" / "tiny_pair_ranks.yaml"
            if not path.exists():
                print("tiny_pair: conf/acceptance/tiny_pair_ranks.yaml not found, left out", file=sys.stderr)
                continue
            node = OmegaConf.to_container(OmegaConf.load(path))
        else:
            node = {"_target_": "specdepth.acceptance.Ranked", "table": None, "ranks": 8, **profile_params(name)}
        out[name] = (node, table_of(node))
    return out


def profile_params(name: str) -> dict:
    """A named profile of PROFILES, or `a<alpha>d<decay>` (a held-out draw: a0.7d0.25)."""
    if name in PROFILES:
        return PROFILES[name]
    m = re.fullmatch(r"a([0-9.]+)d([0-9.]+)", name)
    if m is None:
        raise SystemExit(f"run_trees.py: --profiles: unknown profile {name!r}; known: {', '.join(PROFILES)}, "
                         f"tiny_pair, or a<alpha>d<decay>")
    return dict(alpha=float(m.group(1)), decay=float(m.group(2)))


def deployment(name: str) -> tuple:
    """A deployment of DEPLOYMENTS, or <model>_<hardware> for another hardware entry (llama3_8b_a100_80g)."""
    if name in DEPLOYMENTS:
        return DEPLOYMENTS[name]
    for model, tp, ov in MODELS:
        if name.startswith(model + "_") and (Path(CONF_DIR) / "hardware" / f"{name[len(model) + 1:]}.yaml").is_file():
            return model, tp, name[len(model) + 1:], ov
    raise SystemExit(f"run_trees.py: --deployments: unknown deployment {name!r}; known: {', '.join(DEPLOYMENTS)} "
                     f"or <model>_<hardware> of conf/hardware")


def table_of(node: dict) -> np.ndarray:
    if node.get("table") is not None:
        return np.asarray(node["table"], float)
    a, d = node["alpha"], node.get("decay")
    return a * (1.0 - a if d is None else d) ** np.arange(node.get("ranks", 8))


def policies(table: np.ndarray) -> list[tuple[str, str, int, dict]]:
    """(label, family, nodes, policy node) of every policy a cell runs."""
    pols = [("none", "none", 0, {"_target_": "specdepth.policies.fixed.FixedDepth", "depth": 0})]
    pols += [(f"chain{k}", "chain", k, {"_target_": "specdepth.policies.fixed.FixedDepth", "depth": k}) for k in CHAINS]
    pols += [(f"tree{n}", "static_tree", n, {"_target_": "run_trees.StaticTree", "nodes": n, "table": table.tolist()})
             for n in TREES]
    pols.append(("eagle", "static_tree", len(T.EAGLE_CHOICES),
                 {"_target_": "specdepth.policies.tree_fixed.TreeFixed", "shape": "eagle", "widths": None}))
    pols.append(("tree_best", "static_tree", 0, {"_target_": "run_trees.BestStaticTree", "table": table.tolist()}))
    for name in ADAPTIVE:
        node = OmegaConf.to_container(OmegaConf.load(Path(CONF_DIR) / "policy" / f"{name}.yaml"))
        pols.append((name, name, 0, node))
    return pols


def run_one(cfg, batch: int, seed: int, pol: dict, output_len: int) -> dict:
    c = cfg.copy()
    c.workload.batch_size, c.engine.max_batch_size = max(2 * batch, 16), batch
    c.workload.output_len, c.seed, c.policy = output_len, seed, pol
    t0 = time.perf_counter()
    res = build(c)["engine"].run()
    wall = time.perf_counter() - t0
    s = summarize(res)
    st = np.array(res.steps, float).reshape(-1, len(STEP_COLUMNS))
    rows = st[:, _S["batch_size"]].sum()
    return dict(throughput_tok_s=round(s["throughput_tok_s"], 2),
                nodes_per_row=round(float(st[:, _S["drafted"]].sum() / max(rows, 1)), 4),
                tokens_per_step=round(s["tokens_per_step"], 4), wall_s=round(wall, 3))


def sweep(args) -> list[dict]:
    rows: list[dict] = []
    for dep in args.deployments:
        model, tp, hw, ov = deployment(dep)
        cfg0 = base([*ov, f"hardware={hw}"])
        for prof, (node, table) in profiles(args.profiles).items():
            cfg = cfg0.copy()
            cfg.acceptance = node
            pols = policies(table)
            for b in args.batches:
                for label, family, nodes, pol in pols:
                    for seed in range(args.seed_base, args.seed_base + args.seeds):
                        r = dict(deployment=dep, model=model, tp=tp, hardware=hw, profile=prof, batch=b,
                                 requests=max(2 * b, 16), policy=label, family=family, nodes=nodes, seed=seed)
                        r.update(run_one(cfg, b, seed, pol, args.output_len))
                        rows.append(r)
            print(f"{dep} {prof}: {len(rows)} runs, {sum(r['wall_s'] for r in rows):.0f} s", flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=HERE)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--seed-base", type=int, default=0, help="the first seed (a held-out draw: another base)")
    ap.add_argument("--batches", default="1,4,16,64,256")
    ap.add_argument("--profiles", default="sharp,mid,flat,tiny_pair")
    ap.add_argument("--deployments", default="all")
    ap.add_argument("--output-len", type=int, default=128)
    args = ap.parse_args(argv)
    args.batches = [int(b) for b in args.batches.split(",")]
    args.profiles = args.profiles.split(",")
    args.deployments = list(DEPLOYMENTS) if args.deployments == "all" else args.deployments.split(",")
    sys.path.insert(0, str(HERE))   # run_trees.StaticTree for Hydra's instantiate
    rows = sweep(args)
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write(args.out / "runs.csv", csv_text(COLUMNS, [[r[c] for c in COLUMNS] for r in rows]))
    import analyze_trees
    analyze_trees.main([str(args.out / "runs.csv"), "--out", str(args.out)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
