#!/usr/bin/env python
"""The shipped tiny pair's per-rank acceptance: at which rank of the draft's candidates the target's token sits.

Greedy speculative decoding only ever conditions on the target's greedy path: the draft proposes after an
accepted prefix, which is the target's own greedy output. So for each prompt of the pair's prompt pool
(model.prompts of conf/model/tiny_pair.yaml, the prompts backend=hf draws from) the target continues the
prompt greedily for --gen-tokens tokens (S), one teacher-forced draft forward over S gives the draft's
distribution at every generated position t >= 1 (position 0 comes from the prefill, never drafted), and the
rank of the target's token g_t there is the number of tokens the draft scores above it (0: the draft's top
candidate, a chain's accepted draft; r: a tree node of rank r would be accepted). table[r] = the share of
positions at rank r, for r < --ranks; the rest (rank >= --ranks) is the mass the table leaves out.

Writes --out (default conf/acceptance/tiny_pair_ranks.yaml): a `ranked` acceptance preset
(specdepth.acceptance.Ranked) with the measured table and the command that produced it, and prints the table
with the counts. The simulator's rank model draws each depth's rank independently; on this pair the
acceptance at a depth rises after accepted depths (experiments/tiny_pair/README.md), which the preset's
independent ranks do not model: it is the per-position marginal.

    OMP_NUM_THREADS=1 python experiments/trees/measure_ranks.py [--prompts 100 --gen-tokens 96 --ranks 8]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=int, default=100, help="prompts from the pool, in file order")
    p.add_argument("--prompt-len", type=int, default=128, help="keep each prompt's last N tokens")
    p.add_argument("--gen-tokens", type=int, default=96, help="target greedy tokens per prompt")
    p.add_argument("--ranks", type=int, default=8, help="table entries (ranks 0..N-1)")
    p.add_argument("--out", type=Path, default=ROOT / "conf" / "acceptance" / "tiny_pair_ranks.yaml")
    return p.parse_args(argv)


def load_pair():
    """The shipped pair as conf/model/tiny_pair.yaml names it (target, draft, prompt pool), float32, CPU."""
    import torch
    from hydra import compose, initialize_config_dir
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specdepth.app import CONF_DIR
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("config", overrides=["model=tiny_pair"])
    m = cfg.model
    load = lambda p: AutoModelForCausalLM.from_pretrained(str(p), dtype=torch.float32).eval()   # noqa: E731
    return load(m.target), load(m.draft), AutoTokenizer.from_pretrained(str(m.tokenizer or m.target)), m.prompts


def prompt_ids(tok, path: str, n: int, length: int) -> list[list[int]]:
    out = []
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            ids = rec["prompt_ids"] if "prompt_ids" in rec else tok(rec.get("text", rec.get("prompt")))["input_ids"]
            if ids:
                out.append(list(ids)[-length:])
            if len(out) == n:
                break
    return out


def ranks_along_greedy(target, draft, prompts: list[list[int]], gen: int) -> np.ndarray:
    """int64 [positions]: the draft's rank of the target's greedy token at each generated position t >= 1."""
    import torch
    out = []
    with torch.inference_mode():
        for ids in prompts:
            x = torch.tensor([ids])
            s = target.generate(x, max_new_tokens=gen, do_sample=False, eos_token_id=None, pad_token_id=0)
            P = len(ids)
            logits = draft(input_ids=s).logits[0].float()          # [P + gen, V]: after each prefix of S
            # the draft's distribution before generated token t sits at row P + t - 1
            at = logits[P:P + gen - 1]                               # before tokens 1..gen-1
            g = s[0, P + 1:P + gen]
            score = at.gather(-1, g[:, None])
            out.append((at > score).sum(-1).numpy())
    return np.concatenate(out).astype(np.int64)


def write_preset(path: Path, table: np.ndarray, n: int, prompts: int, command: str) -> None:
    vals = ", ".join(f"{v:.4f}" for v in table)
    text = (f"# The shipped tiny pair's measured per-rank acceptance (greedy, CPU): table[r] = the share of the target's\n"
            f"# greedy tokens that are the draft's rank-r candidate, along the target's greedy path ({n} positions\n"
            f"# over {prompts} prompts of model.prompts); the rest ({1 - table.sum():.4f}) sits at rank >= {table.size}.\n"
            f"# Ranks are drawn independently per depth (the per-position marginal). Produced by:\n"
            f"#   {command}\n"
            f"_target_: specdepth.acceptance.Ranked\n"
            f"table: [{vals}]\n")
    from specdepth.results import atomic_write
    atomic_write(path, text)


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    t0 = time.perf_counter()
    target, draft, tok, pool = load_pair()
    prompts = prompt_ids(tok, pool, args.prompts, args.prompt_len)
    ranks = ranks_along_greedy(target, draft, prompts, args.gen_tokens)
    counts = np.bincount(np.minimum(ranks, args.ranks), minlength=args.ranks + 1)
    table = counts[:args.ranks] / ranks.size
    cmd = "OMP_NUM_THREADS=1 python experiments/trees/measure_ranks.py" + "".join(
        f" --{k.replace('_', '-')} {v}" for k, v in (("prompts", args.prompts), ("prompt_len", args.prompt_len),
                                                       ("gen_tokens", args.gen_tokens), ("ranks", args.ranks)))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_preset(args.out, table, int(ranks.size), len(prompts), cmd)
    print(f"{ranks.size} positions over {len(prompts)} prompts ({time.perf_counter() - t0:.1f} s)")
    print("| rank | positions | share | cumulative |")
    print("|---|---|---|---|")
    cum = 0.0
    for r in range(args.ranks + 1):
        cum += counts[r] / ranks.size
        label = str(r) if r < args.ranks else f">= {args.ranks}"
        print(f"| {label} | {counts[r]} | {counts[r] / ranks.size:.4f} | {cum:.4f} |")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
