"""The shipped offline target/draft pair (src/specdepth/assets/tiny_pair, made by experiments/tiny_pair/train.py)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ASSETS = Path(__file__).resolve().parents[1] / "src" / "specdepth" / "assets" / "tiny_pair"
TARGET, DRAFT, PROMPTS = ASSETS / "target", ASSETS / "draft", ASSETS / "prompts.jsonl"

pytestmark = pytest.mark.skipif(not (TARGET / "config.json").exists(), reason="tiny_pair assets not present")

TEXTS = [
    "hello world",
    "  two leading spaces, trailing space \n",
    "ünïcødé — 日本語テキスト 🎉 emoji, \u00a0nbsp, tab\tend",
    "def f(x):\n    if x:\n        return {'a': [1, 2]}\n\treturn None\r\n\n\n",
    "",
    "\x00\x01 control chars \x7f",
]


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(TARGET)


@pytest.fixture(scope="module")
def models():
    from transformers import AutoModelForCausalLM

    t = AutoModelForCausalLM.from_pretrained(TARGET, dtype=torch.float32).eval()
    d = AutoModelForCausalLM.from_pretrained(DRAFT, dtype=torch.float32).eval()
    return t, d


def test_files_present_and_small():
    for d in (TARGET, DRAFT):
        assert (d / "model.safetensors").is_file()
        assert (d / "tokenizer.json").is_file()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (TARGET / name).read_bytes() == (DRAFT / name).read_bytes()
    total = sum(f.stat().st_size for f in ASSETS.rglob("*") if f.is_file())
    assert total <= 25 * 1024 * 1024
    assert PROMPTS.stat().st_size < 1024 * 1024


def test_tokenizer_round_trip(tokenizer):
    from transformers import AutoTokenizer

    draft_tok = AutoTokenizer.from_pretrained(DRAFT)
    specials = {tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id}
    for text in TEXTS:
        ids = tokenizer(text)["input_ids"]
        assert tokenizer.decode(ids) == text          # byte-level: any string survives
        assert not specials & set(ids)                # no bos/eos added
        assert draft_tok(text)["input_ids"] == ids
    assert len(tokenizer) == len(draft_tok) == 1024
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) == (0, 1, 2)
    code = TEXTS[3] * 4
    assert len(tokenizer(code)["input_ids"]) < 0.6 * len(code.encode("utf-8"))   # BPE merges compress code


def test_models_load_offline_and_match(models, tokenizer):
    t, d = models
    assert t.config.model_type == d.config.model_type == "llama"
    assert t.config.vocab_size == d.config.vocab_size == len(tokenizer)
    assert t.config.max_position_embeddings >= 1024 and d.config.max_position_embeddings >= 1024
    assert next(t.parameters()).dtype == torch.float32
    n_t = sum(p.numel() for p in t.parameters())
    n_d = sum(p.numel() for p in d.parameters())
    assert 4_000_000 <= n_t <= 10_000_000
    assert n_d <= 0.10 * n_t
    ids = torch.tensor([tokenizer("import os\n")["input_ids"]])
    with torch.no_grad():
        assert t(input_ids=ids).logits.shape == (1, ids.shape[1], len(tokenizer))
        assert d(input_ids=ids).logits.shape == (1, ids.shape[1], len(tokenizer))


def test_checkpoints_are_float16():
    import json

    for d in (TARGET, DRAFT):
        cfg = json.loads((d / "config.json").read_text())
        assert cfg.get("dtype", cfg.get("torch_dtype")) == "float16"
        from safetensors import safe_open

        with safe_open(str(d / "model.safetensors"), "pt") as f:
            assert all(f.get_slice(k).get_dtype() == "F16" for k in f.keys())


def test_prompts_load_with_datasets():
    datasets = pytest.importorskip("datasets")
    ds = datasets.load_dataset("json", data_files=str(PROMPTS), split="train")
    assert 50 <= len(ds) <= 1000
    assert {"text", "source"} <= set(ds.column_names)
    for row in ds.select(range(10)):
        assert 100 <= len(row["text"].encode("utf-8")) <= 1024
        assert row["source"].endswith(".py")


def test_target_greedy_generation_is_plausible(models, tokenizer):
    import json

    t, d = models
    prompt = json.loads(PROMPTS.read_text().splitlines()[0])["text"]
    assert not prompt.endswith("\n")   # a bare trailing newline token is out of distribution for the BPE
    enc = tokenizer(prompt, return_tensors="pt")
    with torch.no_grad():
        out = t.generate(**enc, max_new_tokens=64, do_sample=False, pad_token_id=tokenizer.pad_token_id)
        out_d = d.generate(**enc, max_new_tokens=16, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    new = out[0, enc["input_ids"].shape[1]:].tolist()
    assert len(new) >= 16
    assert len(set(new)) >= 4  # not degenerate (not a single repeated token)
    assert tokenizer.pad_token_id not in new and tokenizer.bos_token_id not in new
    text = tokenizer.decode(new, skip_special_tokens=True)
    assert sum(c.isalpha() for c in text) >= 5  # produces code-like text, not only whitespace/punctuation
    assert out_d.shape[1] > enc["input_ids"].shape[1]
