"""Model architectures (the numbers the cost model needs) and target/draft pairs.

A `ModelPair` names the pair's weights (hub ids or local directories, used by the real backend) and
carries each model's architecture (used by the simulator's cost model and by the FLOP counter of both
backends). When an architecture is left `null` it is read from the checkpoint's `config.json`, so a
local model directory needs no hand-copied numbers. Nothing here imports torch.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path

from .errors import ConfigError, as_choice, as_int

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8": 1, "fp8": 1}


@dataclass(frozen=True)
class ModelArch:
    """Decoder-only transformer shape (Llama family: GQA attention, gated MLP)."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    head_dim: int | None = None
    tie_embeddings: bool = False
    dtype: str = "bfloat16"

    @classmethod
    def build(cls, spec, key: str) -> "ModelArch":
        if isinstance(spec, ModelArch):
            return spec
        try:
            spec = dict(spec)
        except (TypeError, ValueError):
            raise ConfigError(f"{key} must be a mapping of architecture numbers, got {spec!r}") from None
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(spec) - known)
        if unknown:
            raise ConfigError(f"{key} has unknown keys {unknown}; known: {sorted(known)}")
        required = ("layers", "hidden", "heads", "kv_heads", "intermediate", "vocab")
        missing = [name for name in required if name not in spec]
        if missing:
            raise ConfigError(f"{key} is missing {missing}")
        out = {}
        for name in required:
            out[name] = as_int(spec[name], f"{key}.{name}", min=1)
        if spec.get("head_dim") is not None:
            out["head_dim"] = as_int(spec["head_dim"], f"{key}.head_dim", min=1)
        elif out["hidden"] % out["heads"]:
            raise ConfigError(f"{key}.hidden ({out['hidden']}) is not divisible by heads ({out['heads']}); set head_dim")
        if out["heads"] % out["kv_heads"]:
            raise ConfigError(f"{key}.kv_heads ({out['kv_heads']}) must divide heads ({out['heads']})")
        out["tie_embeddings"] = bool(spec.get("tie_embeddings", False))
        out["dtype"] = as_choice(spec.get("dtype", "bfloat16"), f"{key}.dtype", DTYPE_BYTES)
        return cls(**out)

    @classmethod
    def from_hf_config(cls, path: str | Path, key: str, dtype: str | None = None) -> "ModelArch":
        """Read the architecture from a checkpoint directory's config.json (no torch needed)."""
        cfg_file = Path(path) / "config.json"
        if not cfg_file.is_file():
            raise ConfigError(f"{key} is null, so the architecture is read from {cfg_file}, which does not exist; "
                              f"give the numbers in {key} or point the model at a local checkpoint")
        try:
            c = json.loads(cfg_file.read_text())
        except json.JSONDecodeError as e:
            raise ConfigError(f"{cfg_file}: invalid JSON ({e})") from None
        c = c.get("text_config", c)
        try:
            spec = dict(layers=c["num_hidden_layers"], hidden=c["hidden_size"], heads=c["num_attention_heads"],
                        kv_heads=c.get("num_key_value_heads") or c["num_attention_heads"],
                        intermediate=c["intermediate_size"], vocab=c["vocab_size"], head_dim=c.get("head_dim"),
                        tie_embeddings=c.get("tie_word_embeddings", False))
        except KeyError as e:
            raise ConfigError(f"{cfg_file}: missing {e.args[0]!r}, cannot derive {key}") from None
        dt = dtype or str(c.get("torch_dtype") or c.get("dtype") or "bfloat16").replace("torch.", "")
        spec["dtype"] = dt if dt in DTYPE_BYTES else "bfloat16"
        return cls.build(spec, key)

    # ---- derived sizes -------------------------------------------------------------------------
    @property
    def hd(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def bytes_per_param(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def layer_params(self) -> int:
        attn = self.hidden * self.hd * (self.heads * 2 + self.kv_heads * 2)  # q, o, k, v projections
        mlp = 3 * self.hidden * self.intermediate                             # gate, up, down
        return attn + mlp

    @property
    def matmul_params(self) -> int:
        """Parameters multiplied per token: every layer plus the LM head (embedding lookup is free)."""
        return self.layers * self.layer_params + self.vocab * self.hidden

    @property
    def params(self) -> int:
        emb = self.vocab * self.hidden * (1 if self.tie_embeddings else 2)
        return self.layers * self.layer_params + emb

    @property
    def weight_bytes(self) -> int:
        """Bytes streamed from memory per forward: every layer's weights and the LM head, once."""
        return self.matmul_params * self.bytes_per_param

    @property
    def kv_bytes_per_token(self) -> int:
        return self.layers * 2 * self.kv_heads * self.hd * self.bytes_per_param

    @property
    def attn_flops_coeff(self) -> int:
        """FLOPs per (query, key) pair over all layers: QK^T and AV, 2 FLOPs per multiply-add."""
        return 4 * self.layers * self.heads * self.hd


class ModelPair:
    """A target model and its draft. Hub ids or local paths; architectures given or read from config.json."""

    def __init__(self, target: str, draft: str | None = None, target_arch=None, draft_arch=None,
                 name: str | None = None, dtype: str = "bfloat16", device: str = "auto", device_map=None,
                 tokenizer: str | None = None, prompts: str | None = None, init: str = "pretrained"):
        if not target or not isinstance(target, str):
            raise ConfigError(f"model.target must be a hub id or a local path, got {target!r}")
        self.target = target
        self.draft = draft
        self.name = name or Path(target).name
        self.dtype = as_choice(dtype, "model.dtype", DTYPE_BYTES)
        self.device = as_choice(device, "model.device", {"auto", "cpu", "cuda", "mps"} | {f"cuda:{i}" for i in range(16)})
        self.device_map = device_map
        self.tokenizer = tokenizer or target
        self.prompts = prompts
        # "pretrained": load the checkpoints' weights; "random": only their config.json, random weights built
        # on the device (timing runs of any shape, no weights on disk, no download)
        self.init = as_choice(init, "model.init", ("pretrained", "random"))
        if self.init == "random" and device_map is not None:
            raise ConfigError("model.device_map: not supported with model.init=random (one device)")
        self.target_arch = (ModelArch.build(target_arch, "model.target_arch") if target_arch is not None
                            else ModelArch.from_hf_config(target, "model.target_arch", dtype))
        if draft_arch is not None:
            self.draft_arch = ModelArch.build(draft_arch, "model.draft_arch")
        elif draft:
            self.draft_arch = ModelArch.from_hf_config(draft, "model.draft_arch", dtype)
        else:
            self.draft_arch = None

    def __repr__(self):
        return f"ModelPair({self.name}: {self.target} + {self.draft})"
