"""Shared fixtures: tiny random Llama target/draft pairs saved as real checkpoint directories (config.json,
safetensors, a word-level fast tokenizer), built offline in a few hundred milliseconds, plus a Hydra
`compose` helper. Any test can use them: `model.target=<dir> model.draft=<dir>` runs the full app path.

    def test_x(tiny_pair):            # {"target": Path, "draft": Path, "vocab": 64}
    build_tiny_llama(path, vocab=64, layers=2, seed=0)            # one model
    build_tiny_pair(root, vocab=64, draft_noise=0.5)              # target + a noisy copy as draft
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# 2 CPU cores shared by several test runs: more than one torch thread per process oversubscribes them and
# a tiny forward goes from ~7 ms to ~400 ms (OpenMP spin-waits). Override with OMP_NUM_THREADS.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def build_tokenizer(vocab: int):
    """A fast word-level tokenizer: tokens `<unk>`, `<s>`, `</s>`, then `w3` ... `w{vocab-1}`; words split on
    whitespace, so the text "w5 w17 w3" is the ids [5, 17, 3]."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for i in range(3, vocab):
        words[f"w{i}"] = i
    tok = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")   # joins words with spaces
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   pad_token="<unk>")


def tiny_llama_config(vocab=64, hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, max_pos=512,
                      init_range=0.2):
    from transformers import LlamaConfig

    # no EOS: the backend ignores EOS, and so must the reference `generate`
    return LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                       num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                       max_position_embeddings=max_pos, initializer_range=init_range, bos_token_id=None,
                       eos_token_id=None, pad_token_id=0, tie_word_embeddings=False)


def build_tiny_llama(path, *, seed=0, tokenizer=True, base=None, noise=0.0, **config):
    """Save a random Llama (LlamaConfig(**config) via `tiny_llama_config`) at `path`. With `base` (a model),
    start from a copy of its weights plus Gaussian noise of `noise` x each tensor's std: a draft that agrees
    with the target often but not always. Returns the model (float32, eval)."""
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = tiny_llama_config(**config)
    model = LlamaForCausalLM(cfg).eval()
    if base is not None:
        sd = {k: v.clone() for k, v in base.state_dict().items()}
        g = torch.Generator().manual_seed(seed + 1)
        for k, v in sd.items():
            if v.is_floating_point() and noise:
                std = float(v.std()) if v.numel() > 1 else 0.0
                v.add_(torch.randn(v.shape, generator=g) * noise * std)
        model.load_state_dict(sd)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    Path(path).mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    if tokenizer:
        tok = tokenizer if not isinstance(tokenizer, bool) else build_tokenizer(cfg.vocab_size)
        tok.save_pretrained(path)
    return model


def build_tiny_pair(root, *, vocab=64, draft_noise=0.5, seed=0, draft_seed=None, **config):
    """target/ and draft/ under `root`. draft_noise: the draft is the target plus noise (None = an unrelated
    random model with seed draft_seed). Returns {"target": Path, "draft": Path, "vocab": vocab}."""
    root = Path(root)
    tok = build_tokenizer(vocab)
    target = build_tiny_llama(root / "target", seed=seed, tokenizer=tok, vocab=vocab, **config)
    if draft_noise is None:
        build_tiny_llama(root / "draft", seed=draft_seed if draft_seed is not None else seed + 17, tokenizer=tok,
                         vocab=vocab, **config)
    else:
        build_tiny_llama(root / "draft", seed=seed + 1, tokenizer=tok, base=target, noise=draft_noise, vocab=vocab,
                         **config)
    return {"target": root / "target", "draft": root / "draft", "vocab": vocab}


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory):
    """A 64-token-vocabulary target (2 layers, hidden 64) and a noisy copy as draft: it accepts roughly
    40% of the greedy drafts, so both acceptances and rejections happen."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    return build_tiny_pair(tmp_path_factory.mktemp("tiny_pair"), vocab=64, draft_noise=0.1)


@pytest.fixture(scope="session")
def tiny_pair_small_vocab(tmp_path_factory):
    """A 12-token-vocabulary pair whose draft is an unrelated random model (it disagrees with the target):
    for distribution tests. Softer logits (init_range 0.08) keep every token's probability non-trivial."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    return build_tiny_pair(tmp_path_factory.mktemp("tiny_small"), vocab=12, draft_noise=None, hidden=32,
                           intermediate=64, layers=2, init_range=0.08)


def compose(*overrides, hydra_cfg: bool = False):
    """The app's config with Hydra overrides, outside of a Hydra app (tests call `specdepth.app.run`): the
    one compose helper of the suite. Each argument is an override or a list of them; hydra_cfg=True keeps
    the `hydra` node (sweeper params, launcher). Also the `compose` fixture."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from specdepth.app import CONF_DIR

    flat = [o for x in overrides for o in ([x] if isinstance(x, str) else x)]
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return hydra_compose("config", overrides=flat, return_hydra_config=hydra_cfg)


@pytest.fixture(name="compose")
def compose_fixture():
    return compose


def hf_overrides(pair, *extra):
    """Overrides running backend=hf on a fixture pair on the CPU in float32."""
    return ["backend=hf", f"model.target={pair['target']}", f"model.draft={pair['draft']}", "model.target_arch=null",
            "model.draft_arch=null", "model.dtype=float32", "model.device=cpu", "model.prompts=null",
            "model.device_map=null", "engine.progress=false", "resume=false", *extra]
