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
    """Decoder-only transformer shape (Llama family: GQA attention, gated MLP), dense or a mixture of
    experts: with `experts` > 0 every layer's MLP is `experts` routed experts of width
    `expert_intermediate`, `experts_per_token` of them active per token, plus `shared_experts` always-active
    experts of the same width (`intermediate` is then unused). `max_context`: the longest sequence (prompt +
    output) the model takes (config.json's max_position_embeddings); None = unchecked."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    head_dim: int | None = None
    tie_embeddings: bool = False
    dtype: str = "bfloat16"
    max_context: int | None = None
    experts: int = 0
    experts_per_token: int = 0
    expert_intermediate: int | None = None
    shared_experts: int = 0

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
        if spec.get("max_context") is not None:
            out["max_context"] = as_int(spec["max_context"], f"{key}.max_context", min=1)
        out.update(cls._moe_spec(spec, key))
        return cls(**out)

    @staticmethod
    def _moe_spec(spec: dict, key: str) -> dict:
        """The mixture-of-experts numbers of a spec, validated ({} for a dense model)."""
        experts = as_int(spec.get("experts") or 0, f"{key}.experts", min=0)
        if not experts:
            for name in ("experts_per_token", "expert_intermediate", "shared_experts"):
                if spec.get(name):
                    raise ConfigError(f"{key}.{name} is set but {key}.experts is 0 (a dense model)")
            return {}
        if spec.get("expert_intermediate") is None:
            raise ConfigError(f"{key}.expert_intermediate (each expert's MLP width) is missing for a mixture of experts")
        return dict(experts=experts,
                    experts_per_token=as_int(spec.get("experts_per_token"), f"{key}.experts_per_token",
                                             min=1, max=experts),
                    expert_intermediate=as_int(spec["expert_intermediate"], f"{key}.expert_intermediate", min=1),
                    shared_experts=as_int(spec.get("shared_experts") or 0, f"{key}.shared_experts", min=0))

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
                        tie_embeddings=c.get("tie_word_embeddings", False),
                        max_context=c.get("max_position_embeddings"))
            spec.update(_hf_moe(c))
        except KeyError as e:
            raise ConfigError(f"{cfg_file}: missing {e.args[0]!r}, cannot derive {key}") from None
        dt = dtype or str(c.get("torch_dtype") or c.get("dtype") or "bfloat16").replace("torch.", "")
        spec["dtype"] = dt if dt in DTYPE_BYTES else "bfloat16"
        return cls.build(spec, key)

    # ---- derived sizes -------------------------------------------------------------------------
    @property
    def signature(self) -> str:
        """The shape that sets a forward's time, as one token (specdepth-profile's `arch` column), e.g.
        `L32-H4096-A32-KV8-I14336-V128256-D128-bfloat16`."""
        return (f"L{self.layers}-H{self.hidden}-A{self.heads}-KV{self.kv_heads}-I{self.intermediate}-V{self.vocab}"
                f"-D{self.hd}-{self.dtype}")

    @property
    def hd(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def bytes_per_param(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def attn_params(self) -> int:
        return self.hidden * self.hd * (self.heads * 2 + self.kv_heads * 2)  # q, o, k, v projections

    @property
    def expert_params(self) -> int:
        """One routed expert's gated MLP (gate, up, down) in one layer."""
        return 3 * self.hidden * (self.expert_intermediate or 0)

    @property
    def layer_params(self) -> int:
        """Every parameter of one layer (MoE: all experts and the router)."""
        if self.is_moe:
            moe = (self.experts + self.shared_experts) * self.expert_params + self.hidden * self.experts
            return self.attn_params + moe
        mlp = 3 * self.hidden * self.intermediate                             # gate, up, down
        return self.attn_params + mlp

    @property
    def active_layer_params(self) -> int:
        """Parameters one token multiplies in one layer (MoE: its experts, the shared ones, the router)."""
        if not self.is_moe:
            return self.layer_params
        active = (self.experts_per_token + self.shared_experts) * self.expert_params + self.hidden * self.experts
        return self.attn_params + active

    @property
    def matmul_params(self) -> int:
        """Parameters multiplied per token: every layer plus the LM head (embedding lookup is free).
        MoE: the activated parameters only."""
        if self.is_moe:
            return self.layers * self.active_layer_params + self.vocab * self.hidden
        return self.layers * self.layer_params + self.vocab * self.hidden

    @property
    def params(self) -> int:
        emb = self.vocab * self.hidden * (1 if self.tie_embeddings else 2)
        return self.layers * self.layer_params + emb

    @property
    def weight_bytes(self) -> int:
        """Bytes streamed from memory per forward: every layer's weights and the LM head, once (MoE: with
        every expert, the most a forward reads; cost.MoEWeights counts the experts a forward touches)."""
        if self.is_moe:
            return (self.layers * self.layer_params + self.vocab * self.hidden) * self.bytes_per_param
        return self.matmul_params * self.bytes_per_param

    @property
    def resident_bytes(self) -> int:
        """Bytes the weights occupy in GPU memory (embedding and LM head counted once when tied)."""
        return self.params * self.bytes_per_param

    @property
    def kv_bytes_per_token(self) -> int:
        return self.layers * 2 * self.kv_heads * self.hd * self.bytes_per_param

    @property
    def attn_flops_coeff(self) -> int:
        """FLOPs per (query, key) pair over all layers: QK^T and AV, 2 FLOPs per multiply-add."""
        return 4 * self.layers * self.heads * self.hd


def _hf_moe(c: dict) -> dict:
    """The mixture-of-experts numbers of a config.json (Qwen-MoE, Mixtral and DeepSeek spellings)."""
    experts = c.get("num_experts") or c.get("num_local_experts") or c.get("n_routed_experts") or 0
    if not experts:
        return {}
    width = c.get("moe_intermediate_size") or c["intermediate_size"]   # Mixtral: experts are the MLP
    shared = c.get("n_shared_experts") or 0
    if not shared and c.get("shared_expert_intermediate_size"):
        shared = max(1, round(c["shared_expert_intermediate_size"] / width))
    return dict(experts=experts, experts_per_token=c.get("num_experts_per_tok"), expert_intermediate=width,
                shared_experts=shared)


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
