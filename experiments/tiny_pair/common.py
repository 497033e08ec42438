"""Shared pieces of the tiny_pair experiment: corpus discovery, the fixed train/held-out split,
the byte-level BPE tokenizer and prompt construction.  Used by train.py and evaluate.py; needs only
the standard library plus torch/transformers/tokenizers/datasets (no specdepth engine)."""
from __future__ import annotations

import hashlib
import os
import sysconfig
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_ASSETS = REPO_ROOT / "src" / "specdepth" / "assets" / "tiny_pair"

# Tokenizer: byte-level BPE (GPT-2 style: bytes mapped to printable characters, merges learned on the
# training files), VOCAB_SIZE tokens in all, the three specials first.
SPECIALS = ["<pad>", "<bos>", "<eos>"]
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
VOCAB_SIZE = 1024

# Split rule (fixed, documented): a file is held out iff
#   int(sha1(relative_path_utf8).hexdigest()[:8], 16) % 1000 < HELDOUT_PERMILLE
# where relative_path is the path relative to sysconfig.get_paths()["stdlib"], with "/" separators.
HELDOUT_PERMILLE = 50  # ~5 %
EXCLUDED_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"]).resolve()


def list_stdlib_files(root: Path | None = None) -> list[str]:
    """Relative paths (sorted, '/'-separated) of the stdlib's *.py files, minus site-packages and test dirs."""
    root = Path(root) if root is not None else stdlib_root()
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in EXCLUDED_DIRS)
        for fn in filenames:
            if fn.endswith(".py"):
                rel = (Path(dirpath) / fn).relative_to(root).as_posix()
                out.append(rel)
    return sorted(out)


def is_heldout(rel: str, permille: int = HELDOUT_PERMILLE) -> bool:
    h = int(hashlib.sha1(rel.encode("utf-8")).hexdigest()[:8], 16)
    return h % 1000 < permille


def split_files(root: Path | None = None, permille: int = HELDOUT_PERMILLE):
    files = list_stdlib_files(root)
    train = [f for f in files if not is_heldout(f, permille)]
    held = [f for f in files if is_heldout(f, permille)]
    return train, held


def read_bytes(rel: str, root: Path | None = None) -> bytes:
    root = Path(root) if root is not None else stdlib_root()
    return (root / rel).read_bytes()


def read_text(rel: str, root: Path | None = None) -> str:
    return read_bytes(rel, root).decode("utf-8", errors="replace")


def build_tokenizer(train_files: list[str], model_max_length: int = 1024, vocab_size: int = VOCAB_SIZE,
                    root: Path | None = None):
    """Byte-level BPE trained on the training files: the 256 bytes (GPT-2's byte-to-unicode alphabet) plus
    merges up to `vocab_size` tokens, with <pad>=0, <bos>=1, <eos>=2 first. ByteLevel pre-tokenizer (GPT-2's
    regex, no prefix space) and decoder; no normaliser, no automatic bos/eos, so decode(encode(s)) == s for
    any string. Deterministic: same files, same merges."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), min_frequency=2)
    tok.train_from_iterator((read_text(rel, root) for rel in train_files), trainer=trainer,
                            length=len(train_files))
    assert [tok.token_to_id(t) for t in SPECIALS] == [PAD_ID, BOS_ID, EOS_ID]
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        clean_up_tokenization_spaces=False,
        model_max_length=model_max_length,
    )


def token_bytes(tokenizer) -> "list[int]":
    """Bytes of text each token id stands for (0 for the specials): converts nats/token to nats/byte."""
    # a byte-level token's string has one (mapped) character per byte
    toks = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    return [0 if i in (PAD_ID, BOS_ID, EOS_ID) else len(t) for i, t in enumerate(toks)]


def encode_files(tokenizer, files: list[str], root: Path | None = None) -> "list[list[int]]":
    """<bos> tokens <eos> per file."""
    texts = [read_text(rel, root) for rel in files]
    enc = tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=False)
    return [[BOS_ID] + e.ids + [EOS_ID] for e in enc]


def make_prompts(held: list[str], n_prompts: int, seed: int, root: Path | None = None,
                 min_bytes: int = 200, max_bytes: int = 400) -> list[dict]:
    """Deterministic prompts: chunks of held-out files, whole lines (the last without its newline),
    min_bytes..max_bytes long.
    Round-robin over held-out files (sorted), random start line per chunk (seeded)."""
    import random

    rng = random.Random(seed)
    files = []
    for rel in held:
        try:
            text = read_bytes(rel, root).decode("utf-8")
        except UnicodeDecodeError:
            continue
        lines = text.splitlines(keepends=True)
        if len(text.encode("utf-8")) >= min_bytes + 256:
            files.append((rel, lines))
    records: list[dict] = []
    used: set[tuple[str, int]] = set()
    attempts = 0
    while len(records) < n_prompts and attempts < 50 * n_prompts:
        rel, lines = files[attempts % len(files)]
        attempts += 1
        start = rng.randrange(len(lines))
        if (rel, start) in used:
            continue
        chunk, nb = [], 0
        for ln in lines[start:]:
            lb = len(ln.encode("utf-8"))
            if nb + lb > max_bytes:
                break
            chunk.append(ln)
            nb += lb
        # end at the end of a line but without its newline: the BPE merges a newline with the next line's
        # indentation into one token, so a prompt ending in a bare newline token is out of distribution
        text = "".join(chunk).rstrip("\n")
        nb = len(text.encode("utf-8"))
        if nb < min_bytes or not text.strip():
            continue
        used.add((rel, start))
        records.append({"text": text, "source": rel, "start_line": start + 1, "n_bytes": nb})
    return records
