#!/usr/bin/env python
"""Train the shipped tiny_pair: a Llama target (~5.4M params) and a draft (~0.5M params, <10% of the
target) distilled from it, over a byte-level BPE tokenizer (1024 tokens, learned here), on the *.py sources
of the running Python's standard library.

Phase 1 ("target"): the target is trained with next-token cross-entropy; on the same batches the draft is
trained online against the (detached) current target logits: loss = kl_w * KL(target || draft) + ce_w * CE.
Phase 2 ("distill"): the finished target is frozen and the draft is distilled further with the same loss.

Outputs (default src/specdepth/assets/tiny_pair/): target/ and draft/ (HF safetensors checkpoints in
float16, each with the same byte-level BPE tokenizer), prompts.jsonl (held-out prompts, via `datasets`),
train_log.txt and train_info.json.

CPU only; everything is reproducible from --seed (fixed step counts, seeded init and batch sampling).
Needs no network: the corpus is read from sysconfig.get_paths()["stdlib"].
"""
from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from specdepth.results import atomic_write  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=common.DEFAULT_ASSETS)
    p.add_argument("--world-size", type=int, default=2,
                   help="data-parallel CPU processes (gloo), one per core; batch sizes below are per process")
    p.add_argument("--threads", type=int, default=1, help="torch threads per process")
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--target-steps", type=int, default=720)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--target-lr", type=float, default=3e-3)
    p.add_argument("--distill-steps", type=int, default=40)
    p.add_argument("--distill-batch-size", type=int, default=4)
    p.add_argument("--draft-lr", type=float, default=3e-3)
    p.add_argument("--phase1-max-minutes", type=float, default=26.5,
                   help="wall-clock guard: end phase 1 early (logged) if it passes this many minutes since start")
    p.add_argument("--port", type=int, default=29517)
    p.add_argument("--kl-weight", type=float, default=1.0)
    p.add_argument("--ce-weight", type=float, default=0.1)
    p.add_argument("--warmup", type=int, default=60)
    p.add_argument("--n-prompts", type=int, default=200)
    p.add_argument("--log-every", type=int, default=25)
    # architecture
    p.add_argument("--target-hidden", type=int, default=256)
    p.add_argument("--target-layers", type=int, default=6)
    p.add_argument("--target-ffn", type=int, default=768)
    p.add_argument("--target-heads", type=int, default=8)
    p.add_argument("--draft-hidden", type=int, default=128)
    p.add_argument("--draft-layers", type=int, default=2)
    p.add_argument("--draft-ffn", type=int, default=320)
    p.add_argument("--draft-heads", type=int, default=4)
    p.add_argument("--max-positions", type=int, default=1024)
    p.add_argument("--vocab-size", type=int, default=common.VOCAB_SIZE, help="byte-level BPE tokens in all")
    return p.parse_args(argv)


class Logger:
    def __init__(self, path: Path):
        self.f = open(path, "w", buffering=1)

    def __call__(self, msg: str):
        tqdm.write(msg)
        self.f.write(msg + "\n")


def make_config(hidden, layers, ffn, heads, max_pos, vocab_size=common.VOCAB_SIZE):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=ffn,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=max_pos,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=common.BOS_ID,
        eos_token_id=common.EOS_ID,
        pad_token_id=common.PAD_ID,
        attention_dropout=0.0,
    )


def build_stream(tokenizer, files: list[str]) -> torch.Tensor:
    """<bos> file tokens <eos>, concatenated over files (sorted order)."""
    return torch.tensor([t for ids in common.encode_files(tokenizer, files) for t in ids], dtype=torch.long)


def sample_batch(stream: torch.Tensor, bsz: int, seq_len: int, gen: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, stream.numel() - seq_len - 1, (bsz,), generator=gen)
    return torch.stack([stream[s : s + seq_len + 1] for s in starts.tolist()])


def lr_at(step, total, peak, warmup, floor=0.1):
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(1, total - warmup)
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))


def distill_loss(draft_logits, target_logits, labels, kl_w, ce_w):
    t_logp = F.log_softmax(target_logits.float(), -1)
    d_logp = F.log_softmax(draft_logits.float(), -1)
    kl = (t_logp.exp() * (t_logp - d_logp)).sum(-1).mean()
    ce = F.cross_entropy(draft_logits.reshape(-1, draft_logits.size(-1)), labels.reshape(-1))
    return kl_w * kl + ce_w * ce, kl, ce


@torch.no_grad()
def heldout_loss(model, stream, seq_len, nbytes, max_tokens=16384):
    """(nats per token, nats per byte) over the first max_tokens predictions of the held-out stream."""
    model.eval()
    n = min(stream.numel() - 1, max_tokens)
    tot, cnt, byt = 0.0, 0, 0
    for s in range(0, n, seq_len):
        x = stream[s : min(s + seq_len + 1, n + 1)].unsqueeze(0)
        if x.size(1) < 2:
            break
        logits = model(input_ids=x[:, :-1]).logits
        tot += F.cross_entropy(logits[0], x[0, 1:], reduction="sum").item()
        cnt += x.size(1) - 1
        byt += int(nbytes[x[0, 1:]].sum())
    model.train()
    return tot / cnt, tot / max(byt, 1)


def save_model(model, tokenizer, path: Path):
    if path.exists():
        shutil.rmtree(path)
    m = model.to(torch.float16)
    m.generation_config.bos_token_id = common.BOS_ID
    m.generation_config.eos_token_id = common.EOS_ID
    m.generation_config.pad_token_id = common.PAD_ID
    m.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    for f in path.iterdir():
        f.chmod(0o644)
    model.to(torch.float32)


def main(argv=None):
    args = parse_args(argv)
    if args.world_size > 1:
        import torch.multiprocessing as mp

        mp.spawn(worker, args=(args, sys.argv[1:]), nprocs=args.world_size, join=True)
    else:
        worker(0, args, sys.argv[1:])


def worker(rank, args, argv):
    import os

    import torch.distributed as dist

    t_start = time.time()
    ws = args.world_size
    torch.set_num_threads(args.threads)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    from transformers import LlamaForCausalLM

    if ws > 1:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(args.port))
        dist.init_process_group("gloo", rank=rank, world_size=ws)
    main_rank = rank == 0

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    log = Logger(out / "train_log.txt") if main_rank else (lambda msg: None)
    log(f"# tiny_pair train.py  argv={argv}")
    log(f"# python {sys.version.split()[0]}  torch {torch.__version__}  processes {ws} x threads {torch.get_num_threads()}  "
        f"stdlib {common.stdlib_root()}")

    train_files, held_files = common.split_files()
    tokenizer = common.build_tokenizer(train_files, args.max_positions, args.vocab_size)
    sample = common.read_text(held_files[0])
    assert tokenizer.decode(tokenizer(sample)["input_ids"]) == sample
    nbytes = torch.tensor(common.token_bytes(tokenizer))
    train_stream = build_stream(tokenizer, train_files)
    held_stream = build_stream(tokenizer, held_files)
    train_bytes = sum(len(common.read_bytes(r)) for r in train_files)
    log(f"# tokenizer: byte-level BPE, {len(tokenizer)} tokens; corpus: {len(train_files)} train files "
        f"({train_bytes} bytes, {train_stream.numel()} tokens, {train_bytes / train_stream.numel():.2f} bytes/token), "
        f"{len(held_files)} held-out files ({held_stream.numel()} tokens)")

    torch.manual_seed(args.seed)  # identical init on every rank
    target = LlamaForCausalLM(make_config(args.target_hidden, args.target_layers, args.target_ffn,
                                          args.target_heads, args.max_positions, len(tokenizer)))
    draft = LlamaForCausalLM(make_config(args.draft_hidden, args.draft_layers, args.draft_ffn,
                                         args.draft_heads, args.max_positions, len(tokenizer)))
    n_t = sum(p.numel() for p in target.parameters())
    n_d = sum(p.numel() for p in draft.parameters())
    log(f"# params: target {n_t:,}  draft {n_d:,}  ratio {n_d / n_t:.3%}")
    assert n_d <= 0.10 * n_t, "draft must be <= 10% of the target"
    if ws > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP

        target_m, draft_m = DDP(target), DDP(draft)
    else:
        target_m, draft_m = target, draft

    opt_t = torch.optim.AdamW(target.parameters(), lr=args.target_lr, betas=(0.9, 0.95), weight_decay=0.1)
    opt_d = torch.optim.AdamW(draft.parameters(), lr=args.draft_lr, betas=(0.9, 0.95), weight_decay=0.1)
    gen = torch.Generator().manual_seed(args.seed + 1 + 1000 * rank)
    draft_total = args.target_steps + args.distill_steps
    log(f"# global batch: phase 1 {ws} x {args.batch_size} x {args.seq_len} tokens, "
        f"phase 2 {ws} x {args.distill_batch_size} x {args.seq_len} tokens")

    def stop_flag(cond: bool) -> bool:
        # all ranks agree (rank 0's clock decides)
        if ws == 1:
            return cond
        f = torch.tensor([1.0 if (cond and main_rank) else 0.0])
        dist.broadcast(f, 0)
        return bool(f.item())

    # ---- phase 1: target CE, draft distilled online from the current target
    target.train(); draft.train()
    t1 = time.time()
    steps_done = 0
    stopped_early = False
    bar = tqdm(range(args.target_steps), desc="phase1 target", dynamic_ncols=True, mininterval=2.0,
               disable=not main_rank)
    for step in bar:
        if step % 10 == 0 and stop_flag(time.time() - t_start > 60 * args.phase1_max_minutes):
            log(f"# wall-clock guard: phase 1 stopped after {step} of {args.target_steps} steps "
                f"({time.time() - t_start:.0f}s > {args.phase1_max_minutes} min)")
            stopped_early = True
            break
        x = sample_batch(train_stream, args.batch_size, args.seq_len, gen)
        inp, lab = x[:, :-1], x[:, 1:]
        for g in opt_t.param_groups:
            g["lr"] = lr_at(step, args.target_steps, args.target_lr, args.warmup)
        for g in opt_d.param_groups:
            g["lr"] = lr_at(step, draft_total, args.draft_lr, args.warmup)
        t_logits = target_m(input_ids=inp).logits
        loss_t = F.cross_entropy(t_logits.reshape(-1, t_logits.size(-1)), lab.reshape(-1))
        opt_t.zero_grad(set_to_none=True)
        loss_t.backward()
        torch.nn.utils.clip_grad_norm_(target.parameters(), 1.0)
        opt_t.step()
        d_logits = draft_m(input_ids=inp).logits
        loss_d, kl, ce_d = distill_loss(d_logits, t_logits.detach(), lab, args.kl_weight, args.ce_weight)
        opt_d.zero_grad(set_to_none=True)
        loss_d.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt_d.step()
        steps_done = step + 1
        bar.set_postfix(t_ce=f"{loss_t.item():.3f}", d_kl=f"{kl.item():.3f}", d_ce=f"{ce_d.item():.3f}")
        if (step + 1) % args.log_every == 0 or step == 0 or step + 1 == args.target_steps:
            log(f"phase1 step {step + 1:4d}/{args.target_steps}  target_ce {loss_t.item():.4f}  "
                f"draft_kl {kl.item():.4f}  draft_ce {ce_d.item():.4f}  lr {opt_t.param_groups[0]['lr']:.2e}  "
                f"elapsed {time.time() - t_start:.0f}s")
    bar.close()
    phase1_s = time.time() - t1
    ho_t = heldout_loss(target, held_stream, args.seq_len, nbytes) if main_rank else (float("nan"),) * 2
    log(f"# phase1 done in {phase1_s:.0f}s ({steps_done} steps); held-out (first 16k tokens) target CE "
        f"{ho_t[0]:.4f} nats/token, {ho_t[1]:.4f} nats/byte")

    # ---- phase 2: frozen final target, draft distillation
    target.eval()
    for p in target.parameters():
        p.requires_grad_(False)
    t2 = time.time()
    bar = tqdm(range(args.distill_steps), desc="phase2 distill", dynamic_ncols=True, mininterval=2.0,
               disable=not main_rank)
    for i in bar:
        step = args.target_steps + i
        x = sample_batch(train_stream, args.distill_batch_size, args.seq_len, gen)
        inp, lab = x[:, :-1], x[:, 1:]
        for g in opt_d.param_groups:
            g["lr"] = lr_at(step, draft_total, args.draft_lr, args.warmup)
        with torch.no_grad():
            t_logits = target(input_ids=inp).logits
        d_logits = draft_m(input_ids=inp).logits
        loss_d, kl, ce_d = distill_loss(d_logits, t_logits, lab, args.kl_weight, args.ce_weight)
        opt_d.zero_grad(set_to_none=True)
        loss_d.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt_d.step()
        bar.set_postfix(d_kl=f"{kl.item():.3f}", d_ce=f"{ce_d.item():.3f}")
        if (i + 1) % args.log_every == 0 or i == 0 or i + 1 == args.distill_steps:
            log(f"phase2 step {i + 1:4d}/{args.distill_steps}  draft_kl {kl.item():.4f}  draft_ce {ce_d.item():.4f}  "
                f"elapsed {time.time() - t_start:.0f}s")
    bar.close()
    phase2_s = time.time() - t2
    if ws > 1:
        dist.barrier()
    if not main_rank:
        dist.destroy_process_group()
        return
    ho_d = heldout_loss(draft, held_stream, args.seq_len, nbytes)
    log(f"# phase2 done in {phase2_s:.0f}s; held-out (first 16k tokens) draft CE {ho_d[0]:.4f} nats/token, "
        f"{ho_d[1]:.4f} nats/byte")

    # ---- save
    save_model(target, tokenizer, out / "target")
    save_model(draft, tokenizer, out / "draft")
    from datasets import Dataset

    prompts = common.make_prompts(held_files, args.n_prompts, args.seed)
    Dataset.from_list(prompts).to_json(str(out / "prompts.jsonl"), lines=True, orient="records")
    total_s = time.time() - t_start
    info = {
        "command": "python experiments/tiny_pair/train.py " + " ".join(argv),
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "params": {"target": n_t, "draft": n_d, "ratio": n_d / n_t},
        "corpus": {"stdlib": str(common.stdlib_root()), "python": sys.version.split()[0],
                   "train_files": len(train_files), "heldout_files": len(held_files),
                   "train_tokens": train_stream.numel(), "heldout_tokens": held_stream.numel(),
                   "split_rule": f"held out iff int(sha1(relpath)[:8],16) % 1000 < {common.HELDOUT_PERMILLE}"},
        "phase1_steps_done": steps_done, "phase1_stopped_by_wall_clock_guard": stopped_early,
        "tokens_seen_target": steps_done * ws * args.batch_size * args.seq_len,
        "tokenizer": {"kind": "byte-level BPE", "vocab_size": len(tokenizer),
                      "train_bytes_per_token": train_bytes / train_stream.numel()},
        "heldout_ce_16k_tokens": {"nats_per_token": {"target": ho_t[0], "draft": ho_d[0]},
                                  "nats_per_byte": {"target": ho_t[1], "draft": ho_d[1]}},
        "time_s": {"phase1": phase1_s, "phase2": phase2_s, "total": total_s},
        "torch": torch.__version__, "processes": ws, "threads_per_process": torch.get_num_threads(),
        "n_prompts": len(prompts),
    }
    atomic_write(out / "train_info.json", json.dumps(info, indent=2) + "\n")
    log(f"# saved to {out}; {len(prompts)} prompts; total wall time {total_s:.0f}s ({total_s / 60:.1f} min)")
    if ws > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
