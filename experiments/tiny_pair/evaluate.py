#!/usr/bin/env python
"""Evaluate the tiny_pair (target + draft) on held-out data.  Standalone: needs torch/transformers/datasets only.

Measures
  * held-out loss (nats/token and nats/byte) of target and draft on the held-out stdlib files (same split as
    train.py), non-overlapping windows of --seq-len tokens, first --loss-tokens tokens of the held-out stream;
  * greedy speculative acceptance at depths 1..8 on the held-out prompts (prompts.jsonl):
      the target greedily continues each prompt for --gen-tokens tokens (HF generate, KV cache), giving the
      target's greedy path S.  On S, one teacher-forced forward of each model gives, at every generated
      position t, the target's greedy token g_t = argmax p_T(.|S_<t) and the draft's greedy token
      d_t = argmax p_D(.|S_<t) with its probability c_t.  Because greedy speculative decoding only ever
      conditions on the target's greedy path, "draft position j accepted given positions <j accepted" for
      a draft block starting at t is exactly [d_{t+j-1} == g_{t+j-1}] given all earlier matches in the
      block, i.e. accept length A_t = number of leading matches in m[t:t+8].  We report, over all block
      starts t (every generated position with 8 positions of room):
        - P(position j accepted | positions < j accepted) = #(A_t >= j) / #(A_t >= j-1), j = 1..8
        - P(position j accepted) = #(A_t >= j) / #starts  (unconditional; j=1 is the plain match rate)
        - expected accepted tokens per block E[min(A, k)] for k = 1..8
      and a direct simulation of k-deep greedy speculative decoding from the prompt end (blocks start where
      the previous one ended + 1 target token), for k = 1..8: mean accepted per block and tokens per target call.
  * calibration: at every generated position, the draft's confidence c_t (softmax prob of its greedy
    token) vs acceptance m_t (contexts are target-greedy, so the preceding tokens are the accepted ones);
    10 equal-width bins, plus ECE, Brier score and AUROC of c_t for predicting m_t.
  * position-1 agreement on natural held-out text (teacher forced on the real tokens) as a sanity check
    that the generated-path figures are not inflated by repetitive target output.

Writes --out (default experiments/tiny_pair/results.json) and prints markdown tables.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from specdepth.results import atomic_write  # noqa: E402

DEPTH = 8


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--assets", type=Path, default=common.DEFAULT_ASSETS)
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results.json")
    p.add_argument("--n-prompts", type=int, default=100)
    p.add_argument("--gen-tokens", type=int, default=96)
    p.add_argument("--gen-batch", type=int, default=50)
    p.add_argument("--loss-tokens", type=int, default=32768)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (1: on a shared 2-core CPU, 2 intra-op threads were several times slower)")
    p.add_argument("--bins", type=int, default=10)
    return p.parse_args(argv)


def load(path: Path):
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    m.eval()
    return m


@torch.inference_mode()
def heldout_loss_and_agreement(target, draft, stream: torch.Tensor, seq_len: int, max_tokens: int, nbytes,
                               batch: int = 8):
    """One pass over non-overlapping held-out windows: CE of both models (nats per token, and per byte of
    text the predicted tokens stand for), and the position-1 greedy agreement of draft and target on
    natural (teacher-forced) text."""
    n = min(stream.numel() - 1, max_tokens)
    n = (n // seq_len) * seq_len
    x = stream[: n + 1]
    windows = torch.stack([x[s : s + seq_len + 1] for s in range(0, n, seq_len)])
    tot = {"target": 0.0, "draft": 0.0}
    agree = 0
    for i in range(0, windows.size(0), batch):
        w = windows[i : i + batch]
        lab = w[:, 1:].reshape(-1)
        lt = target(input_ids=w[:, :-1]).logits
        ld = draft(input_ids=w[:, :-1]).logits
        tot["target"] += F.cross_entropy(lt.reshape(-1, lt.size(-1)), lab, reduction="sum").item()
        tot["draft"] += F.cross_entropy(ld.reshape(-1, ld.size(-1)), lab, reduction="sum").item()
        agree += (lt.argmax(-1) == ld.argmax(-1)).sum().item()
    n_tok = int(windows.size(0) * seq_len)
    n_bytes = int(nbytes[windows[:, 1:]].sum())
    return ({k: v / n_tok for k, v in tot.items()}, {k: v / n_bytes for k, v in tot.items()}, n_tok, n_bytes,
            agree / n_tok)


@torch.inference_mode()
def greedy_paths(target, tok, texts, gen_tokens, batch):
    """Target greedy continuation of each prompt (left-padded batched generate with KV cache)."""
    tok.padding_side = "left"
    out = []
    for i in range(0, len(texts), batch):
        enc = tok(texts[i : i + batch], return_tensors="pt", padding=True)
        g = target.generate(**enc, max_new_tokens=gen_tokens, min_new_tokens=gen_tokens, do_sample=False,
                            pad_token_id=tok.pad_token_id, eos_token_id=None)
        plen = enc["input_ids"].size(1)
        for j in range(g.size(0)):
            prompt_ids = enc["input_ids"][j][enc["attention_mask"][j].bool()].tolist()
            out.append((prompt_ids, g[j, plen:].tolist()))
        print(f"  generated {min(i + batch, len(texts))}/{len(texts)}", flush=True)
    return out


@torch.inference_mode()
def teacher_forced(target, draft, paths, batch=16):
    """Per generated position t: target greedy token, draft greedy token, draft prob of it."""
    recs = []
    for i in range(0, len(paths), batch):
        seqs = [p + g for p, g in paths[i : i + batch]]
        L = max(len(s) for s in seqs)
        x = torch.full((len(seqs), L), common.PAD_ID, dtype=torch.long)
        for j, s in enumerate(seqs):
            x[j, : len(s)] = torch.tensor(s)  # right padding: causal attention keeps real positions exact
        lt = target(input_ids=x).logits
        ld = draft(input_ids=x).logits
        pd = F.softmax(ld.float(), -1)
        for j, (p, g) in enumerate(paths[i : i + batch]):
            P, N = len(p), len(g)
            # logits at index t-1 predict token t; generated tokens occupy t = P..P+N-1
            sl = slice(P - 1, P + N - 1)
            gt = lt[j, sl].argmax(-1)
            conf, gd = pd[j, sl].max(-1)
            recs.append({"target": gt.numpy(), "draft": gd.numpy(), "conf": conf.numpy(),
                         "path": np.array(g), "prompt_len": P})
    return recs


def accept_lengths(m: np.ndarray, depth: int = DEPTH) -> np.ndarray:
    """A_t = leading matches in m[t:t+depth], for every t with full room."""
    n = len(m) - depth + 1
    A = np.zeros(max(n, 0), dtype=np.int64)
    for t in range(max(n, 0)):
        a = 0
        while a < depth and m[t + a]:
            a += 1
        A[t] = a
    return A


def simulate(m: np.ndarray, k: int):
    """Greedy speculative decoding with depth k along the target's greedy path; returns (accepted, blocks, tokens)."""
    t, acc, blocks, toks = 0, 0, 0, 0
    while t + k <= len(m):
        a = 0
        while a < k and m[t + a]:
            a += 1
        acc += a
        blocks += 1
        toks += a + 1  # accepted + the target's correction/bonus token
        t += a + 1
    return acc, blocks, toks


def auroc(scores: np.ndarray, labels: np.ndarray) -> float:
    pos, neg = scores[labels], scores[~labels]
    if len(pos) == 0 or len(neg) == 0:
        return float("nan")
    order = np.argsort(np.concatenate([pos, neg]), kind="mergesort")
    ranks = np.empty(len(order))
    allv = np.concatenate([pos, neg])[order]
    # average ranks for ties
    r = np.arange(1, len(allv) + 1, dtype=float)
    _, idx, cnt = np.unique(allv, return_index=True, return_counts=True)
    for s, c in zip(idx, cnt):
        r[s : s + c] = r[s : s + c].mean()
    ranks[order] = r
    return float((ranks[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    t0 = time.time()
    from datasets import load_dataset
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.assets / "target")
    target, draft = load(args.assets / "target"), load(args.assets / "draft")
    n_t = sum(p.numel() for p in target.parameters())
    n_d = sum(p.numel() for p in draft.parameters())

    # held-out loss
    _, held = common.split_files()
    stream = torch.tensor([t for ids in common.encode_files(tok, held) for t in ids], dtype=torch.long)
    nbytes = torch.tensor(common.token_bytes(tok))
    print(f"held-out loss on {min(args.loss_tokens, stream.numel())} tokens of {len(held)} held-out files ...", flush=True)
    loss, loss_b, n_loss, n_loss_bytes, agree_nat = heldout_loss_and_agreement(
        target, draft, stream, args.seq_len, args.loss_tokens, nbytes)
    print(f"  done ({time.time() - t0:.0f}s)", flush=True)

    # acceptance on prompts
    ds = load_dataset("json", data_files=str(args.assets / "prompts.jsonl"), split="train")
    texts = ds["text"][: args.n_prompts]
    print(f"target greedy generation: {len(texts)} prompts x {args.gen_tokens} tokens ...", flush=True)
    paths = greedy_paths(target, tok, texts, args.gen_tokens, args.gen_batch)
    recs = teacher_forced(target, draft, paths)
    path_mismatch = sum(int((r["target"] != r["path"]).sum()) for r in recs)
    As, ms, confs = [], [], []
    sim = {k: [0, 0, 0] for k in range(1, DEPTH + 1)}
    for r in recs:
        m = r["target"] == r["draft"]
        ms.append(m)
        confs.append(r["conf"])
        As.append(accept_lengths(m))
        for k in sim:
            a, b, tk = simulate(m, k)
            sim[k][0] += a; sim[k][1] += b; sim[k][2] += tk
    A = np.concatenate(As)
    m_all = np.concatenate(ms)
    c_all = np.concatenate(confs).astype(np.float64)
    cond, uncond, exp_acc = [], [], []
    for j in range(1, DEPTH + 1):
        num, den = (A >= j).sum(), (A >= j - 1).sum()
        cond.append({"position": j, "p_accept_given_prev": float(num / den) if den else float("nan"),
                     "n_given_prev": int(den), "p_accept_unconditional": float(num / len(A))})
        exp_acc.append({"depth": j, "mean_accepted": float(np.minimum(A, j).mean()),
                        "sim_mean_accepted_per_block": sim[j][0] / max(sim[j][1], 1),
                        "sim_tokens_per_target_call": sim[j][2] / max(sim[j][1], 1)})

    # calibration
    edges = np.linspace(0, 1, args.bins + 1)
    b = np.clip(np.digitize(c_all, edges[1:-1]), 0, args.bins - 1)
    calib = []
    ece = 0.0
    for i in range(args.bins):
        sel = b == i
        n = int(sel.sum())
        row = {"bin": f"[{edges[i]:.1f}, {edges[i + 1]:.1f}{']' if i == args.bins - 1 else ')'}", "n": n,
               "frac": n / len(c_all),
               "mean_conf": float(c_all[sel].mean()) if n else None,
               "accept_rate": float(m_all[sel].mean()) if n else None}
        if n:
            ece += n / len(c_all) * abs(row["mean_conf"] - row["accept_rate"])
        calib.append(row)
    brier = float(((c_all - m_all) ** 2).mean())
    auc = auroc(c_all, m_all.astype(bool))

    results = {
        "assets": str(args.assets),
        "params": {"target": n_t, "draft": n_d, "ratio": n_d / n_t},
        "heldout_loss_nats_per_token": loss,
        "heldout_loss_nats_per_byte": loss_b,
        "heldout_loss_tokens": n_loss,
        "heldout_loss_bytes": n_loss_bytes,
        "natural_text_position1_agreement": agree_nat,
        "prompts": len(texts), "gen_tokens": args.gen_tokens,
        "block_starts": int(len(A)), "generated_positions": int(len(m_all)),
        "generate_vs_teacher_forced_target_mismatches": path_mismatch,
        "first_position_acceptance": cond[0]["p_accept_given_prev"],
        "per_position": cond,
        "expected_accepted": exp_acc,
        "calibration": {"bins": calib, "ece": ece, "brier": brier, "auroc": auc,
                        "mean_conf": float(c_all.mean()), "mean_accept": float(m_all.mean())},
        "eval_seconds": time.time() - t0,
        "torch": torch.__version__, "threads": torch.get_num_threads(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(args.out, json.dumps(results, indent=2) + "\n")

    print()
    print(f"params: target {n_t:,}, draft {n_d:,} ({n_d / n_t:.2%})")
    print(f"held-out loss ({n_loss} tokens, {n_loss_bytes} bytes): target {loss['target']:.4f} nats/token = "
          f"{loss_b['target']:.4f} nats/byte, draft {loss['draft']:.4f} nats/token = {loss_b['draft']:.4f} nats/byte")
    print(f"natural held-out text, position-1 greedy agreement: {agree_nat:.4f}")
    print(f"{len(texts)} prompts x {args.gen_tokens} target-greedy tokens; {len(A)} block starts; "
          f"generate/teacher-forced target mismatches: {path_mismatch}")
    print()
    print("| position j | P(accept j \\| 1..j-1 accepted) | n | P(accept 1..j) | E[accepted] at depth j | simulated tokens/target call |")
    print("|---|---|---|---|---|---|")
    for c, e in zip(cond, exp_acc):
        print(f"| {c['position']} | {c['p_accept_given_prev']:.3f} | {c['n_given_prev']} | {c['p_accept_unconditional']:.3f} | "
              f"{e['mean_accepted']:.3f} | {e['sim_tokens_per_target_call']:.3f} |")
    print()
    print("| draft confidence | n | share | mean confidence | acceptance rate |")
    print("|---|---|---|---|---|")
    for r in calib:
        mc = f"{r['mean_conf']:.3f}" if r["n"] else "-"
        ar = f"{r['accept_rate']:.3f}" if r["n"] else "-"
        print(f"| {r['bin']} | {r['n']} | {r['frac']:.3f} | {mc} | {ar} |")
    print()
    print(f"ECE {ece:.4f}  Brier {brier:.4f}  AUROC {auc:.4f}  (mean conf {c_all.mean():.3f}, mean accept {m_all.mean():.3f})")
    print(f"wrote {args.out}  ({time.time() - t0:.0f}s)")


if __name__ == "__main__":
    main()
