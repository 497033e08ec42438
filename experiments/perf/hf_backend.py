"""Benchmark of the real backend (backend=hf) against HF transformers, side by side in one process.

    .venv/bin/python experiments/perf/hf_backend.py [--device cpu|cuda] [--threads 1] [--repeats 3] [--json out.json]

Builds a ~20M-parameter Llama target and a ~7M draft (1 layer + the 4096-token embeddings with random weights (seeded; the draft is the
target's embeddings, first layer and LM head; the target's later layers have scaled-down output
projections, so greedy drafts are often accepted) in a temp dir, then:
  (1) batch 1, greedy, fixed k: our tokens/s vs HF assisted generation with the same pair and k
      (num_assistant_tokens=k, schedule constant, assistant_confidence_threshold=0 on the draft's
      generation_config); both outputs are checked equal.                               goal >= 1.25x
  (2) batch 8, depth 0 (policy=none): our tokens/s vs HF `generate` on the same batch. goal >= 0.95x
  (3) framework overhead = (step time - time inside model forwards) / step time, over the runs of (1)
      and (2).                                                                           goal <= 10%
Times are wall clock of generation only (models loaded beforehand, one warm-up run each), best of
--repeats, ours and HF's interleaved. No network; runs unchanged on CUDA (`--device cuda`, a few minutes).
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def build_pair(root: Path, vocab=4096, hidden=512, layers=5, heads=8, intermediate=1408, seed=0):
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    words = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, vocab)}}
    tk = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tk.decoder = decoders.WordPiece(prefix="##")
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                  pad_token="<unk>")

    def cfg(n_layers):
        return LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                           num_hidden_layers=n_layers, num_attention_heads=heads, num_key_value_heads=heads,
                           max_position_embeddings=2048, bos_token_id=None, eos_token_id=None, pad_token_id=0)
    torch.manual_seed(seed)
    target = LlamaForCausalLM(cfg(layers)).eval()
    draft = LlamaForCausalLM(cfg(1)).eval()
    with torch.no_grad():   # layers 1.. write little into the residual stream: the 1-layer draft often agrees
        for layer in target.model.layers[1:]:
            layer.self_attn.o_proj.weight.mul_(0.15)
            layer.mlp.down_proj.weight.mul_(0.15)
    sd = {k: v for k, v in target.state_dict().items() if not k.startswith("model.layers.") or
          k.startswith("model.layers.0.")}
    draft.load_state_dict(sd)
    for name, m in (("target", target), ("draft", draft)):
        m.generation_config.eos_token_id = None
        m.generation_config.pad_token_id = 0
        m.save_pretrained(root / name)
        tok.save_pretrained(root / name)
    return sum(p.numel() for p in target.parameters()), sum(p.numel() for p in draft.parameters())


def compose(overrides):
    from hydra import compose as hc
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from specdepth.app import CONF_DIR
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return hc("config", overrides=overrides)


class Ours:
    """One HFExecutor (models loaded once); each run builds a fresh engine over it."""

    def __init__(self, root, device, policy, batch, prompt_len, output_len, seed=0):
        from specdepth.app import build
        self.cfg = compose([
            "backend=hf", f"model.target={root / 'target'}", f"model.draft={root / 'draft'}", "model.target_arch=null",
            "model.draft_arch=null", "model.prompts=null", "model.dtype=float32", f"model.device={device}",
            "model.name=bench20m", *policy, "workload=closed", f"workload.batch_size={batch}",
            f"workload.prompt_len={prompt_len}", f"workload.output_len={output_len}", "engine.progress=false",
            f"seed={seed}"])
        self.build = build
        self.parts = build(self.cfg)
        self.prompts = [r.prompt_ids for r in self.parts["engine"].requests]

    def run(self):
        from specdepth.engine import Engine
        p = self.parts
        ex = p["executor"]
        reqs = [type(r)(r.request_id, r.arrival_s, r.prompt_len, r.output_len, list(r.prompt_ids))
                for r in p["engine"].requests]
        ex.outputs.clear()
        # prepare() builds fresh caches; the run's new RowTable holds the executor's per-row columns
        eng = Engine(p["policy"], ex, p["cost"], p["engine"].cfg, reqs)
        f0 = ex.forward_s
        t0 = time.perf_counter()
        res = eng.run()
        wall = time.perf_counter() - t0
        tokens = sum(r[2] for r in res.requests)
        step_s = sum(s[14] for s in res.steps)
        return dict(tokens=tokens, wall_s=wall, tok_s=tokens / wall, step_s=step_s, forward_s=ex.forward_s - f0,
                    outputs=[g["output_ids"] for g in res.extra["generations.jsonl"]],
                    acceptance=(sum(s[5] for s in res.steps) / max(1, sum(s[4] for s in res.steps))))


def hf_generate(target, draft, prompts, output_len, k=None):
    import torch
    x = torch.tensor(prompts, device=target.device)
    kw = dict(max_new_tokens=output_len, min_new_tokens=output_len, do_sample=False, eos_token_id=None,
              pad_token_id=0)
    if draft is not None:
        draft.generation_config.num_assistant_tokens = k
        draft.generation_config.num_assistant_tokens_schedule = "constant"
        draft.generation_config.assistant_confidence_threshold = 0.0
        kw["assistant_model"] = draft
    with torch.inference_mode():
        if target.device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = target.generate(x, **kw)
        if target.device.type == "cuda":
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    tokens = (out.shape[1] - x.shape[1]) * x.shape[0]
    return dict(tokens=tokens, wall_s=wall, tok_s=tokens / wall, outputs=out[:, x.shape[1]:].tolist())


def best(runs):
    return max(runs, key=lambda r: r["tok_s"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (both sides)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    import torch
    from transformers import AutoModelForCausalLM

    from specdepth.results import atomic_write
    torch.set_num_threads(a.threads)
    root = Path(tempfile.mkdtemp(prefix="hfbench_"))
    nt, nd = build_pair(root)
    print(f"target {nt / 1e6:.1f}M params, draft {nd / 1e6:.1f}M params, device {a.device}, threads {a.threads}, "
          f"prompt {a.prompt_len}, output {a.output_len}", flush=True)
    target = AutoModelForCausalLM.from_pretrained(root / "target", dtype=torch.float32).to(a.device).eval()
    draft = AutoModelForCausalLM.from_pretrained(root / "draft", dtype=torch.float32).to(a.device).eval()

    figures = {}
    # (1) batch 1, greedy, fixed k vs HF assisted generation
    ours1 = Ours(root, a.device, ["policy=fixed", f"policy.depth={a.k}"], 1, a.prompt_len, a.output_len)
    ours1.run()
    hf_generate(target, draft, ours1.prompts, a.output_len, a.k)   # warm-ups
    o_runs, h_runs = [], []
    for _ in range(a.repeats):
        o_runs.append(ours1.run())
        h_runs.append(hf_generate(target, draft, ours1.prompts, a.output_len, a.k))
    o, h = best(o_runs), best(h_runs)
    same = o["outputs"] == h["outputs"]
    figures["batch1_fixed_k"] = dict(ours_tok_s=o["tok_s"], hf_assisted_tok_s=h["tok_s"], ratio=o["tok_s"] / h["tok_s"],
                                     acceptance=o["acceptance"], identical_outputs=same, k=a.k)
    print(f"(1) batch 1, greedy, fixed k={a.k}: ours {o['tok_s']:.1f} tok/s vs HF assisted {h['tok_s']:.1f} tok/s "
          f"= {o['tok_s'] / h['tok_s']:.2f}x (acceptance {o['acceptance']:.2f}, identical outputs: {same})", flush=True)

    # (2) batch 8, depth 0 vs HF generate on the same batch
    ours2 = Ours(root, a.device, ["policy=none"], 8, a.prompt_len, a.output_len, seed=1)
    ours2.run()
    hf_generate(target, None, ours2.prompts, a.output_len)
    o_runs2, h_runs2 = [], []
    for _ in range(a.repeats):
        o_runs2.append(ours2.run())
        h_runs2.append(hf_generate(target, None, ours2.prompts, a.output_len))
    o2, h2 = best(o_runs2), best(h_runs2)
    same2 = o2["outputs"] == h2["outputs"]
    figures["batch8_depth0"] = dict(ours_tok_s=o2["tok_s"], hf_generate_tok_s=h2["tok_s"], ratio=o2["tok_s"] / h2["tok_s"],
                                    identical_outputs=same2)
    print(f"(2) batch 8, depth 0: ours {o2['tok_s']:.1f} tok/s vs HF generate {h2['tok_s']:.1f} tok/s "
          f"= {o2['tok_s'] / h2['tok_s']:.2f}x (identical outputs: {same2})", flush=True)

    # (3) framework overhead over every run of ours
    for name, runs in (("batch1_fixed_k", o_runs), ("batch8_depth0", o_runs2)):
        step = sum(r["step_s"] for r in runs)
        fwd = sum(r["forward_s"] for r in runs)
        figures[name]["overhead"] = (step - fwd) / step
    all_runs = o_runs + o_runs2
    step = sum(r["step_s"] for r in all_runs)
    fwd = sum(r["forward_s"] for r in all_runs)
    figures["overhead"] = (step - fwd) / step
    print(f"(3) framework overhead (step time outside model forwards): {figures['overhead'] * 100:.1f}% "
          f"(batch 1 fixed k: {figures['batch1_fixed_k']['overhead'] * 100:.1f}%, batch 8 depth 0: "
          f"{figures['batch8_depth0']['overhead'] * 100:.1f}%)", flush=True)
    figures["setup"] = dict(device=a.device, threads=a.threads, target_params=nt, draft_params=nd,
                            prompt_len=a.prompt_len, output_len=a.output_len, repeats=a.repeats,
                            torch=torch.__version__)
    if a.json:
        atomic_write(Path(a.json), json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
