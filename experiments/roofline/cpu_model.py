"""Save a ~24M-parameter Llama with random weights (no download) as a checkpoint directory, for
`specdepth-profile` to time on this CPU (the measured curve of experiments/roofline/README.md).

    .venv/bin/python experiments/roofline/cpu_model.py /tmp/specdepth_cpu24m

LlamaConfig(vocab 32000, hidden 256, 8 layers, 8 heads, 4 KV heads, intermediate 1024), float32, seed 0.
"""
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def main(path: str) -> None:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=32000, hidden_size=256, num_hidden_layers=8, num_attention_heads=8,
                      num_key_value_heads=4, intermediate_size=1024, max_position_embeddings=4096)
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(path)
    print(f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters -> {path}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/specdepth_cpu24m")
