"""Greedy continuations of the shipped target on the first held-out prompts (the examples quoted in README.md).

    .venv/bin/python experiments/tiny_pair/sample.py [--n 5] [--tokens 64] [--keep-newline]

--keep-newline puts back the newline the prompts end without (the out-of-distribution case of README.md).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--assets", type=Path, default=common.DEFAULT_ASSETS)
    ap.add_argument("--n", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--keep-newline", action="store_true")
    a = ap.parse_args(argv)
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(a.assets / "target")
    model = AutoModelForCausalLM.from_pretrained(a.assets / "target", dtype=torch.float32).eval()
    lines = (a.assets / "prompts.jsonl").read_text().splitlines()[: a.n]
    for i, line in enumerate(lines):
        prompt = json.loads(line)["text"] + ("\n" if a.keep_newline else "")
        enc = tok(prompt, return_tensors="pt")
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=a.tokens, do_sample=False, pad_token_id=tok.pad_token_id)
        new = tok.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        print(f"{i}: ...{prompt[-50:]!r}\n   -> {new!r}")


if __name__ == "__main__":
    main()
