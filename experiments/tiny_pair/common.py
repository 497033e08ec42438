"""Shared pieces of the tiny_pair experiment: corpus discovery, the fixed train/held-out split,
the byte-level tokenizer and prompt construction.  Used by train.py and evaluate.py; needs only
the standard library plus torch/transformers/tokenizers/datasets (no specdepth engine)."""
from __future__ import annotations

import hashlib
import os
import sysconfig
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_ASSETS = REPO_ROOT / "src" / "specdepth" / "assets" / "tiny_pair"

# Token ids: 0..255 are the raw bytes, then three specials.
PAD_ID, BOS_ID, EOS_ID = 256, 257, 258
VOCAB_SIZE = 259
SPECIALS = ["<pad>", "<bos>", "<eos>"]

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


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode char map (what tokenizers' ByteLevel uses)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def build_tokenizer(model_max_length: int = 1024):
    """Byte-level tokenizer: token id == byte value (0..255), plus <pad>=256, <bos>=257, <eos>=258.
    No normalisation, no prefix space, no merges, no automatic bos/eos: decode(encode(s)) == s for any str."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    b2u = _bytes_to_unicode()
    vocab = {b2u[b]: b for b in range(256)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    assert tok.token_to_id("<pad>") == PAD_ID and tok.token_to_id("<eos>") == EOS_ID
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        clean_up_tokenization_spaces=False,
        model_max_length=model_max_length,
    )
    return fast


def make_prompts(held: list[str], n_prompts: int, seed: int, root: Path | None = None,
                 min_bytes: int = 200, max_bytes: int = 400) -> list[dict]:
    """Deterministic prompts: chunks of held-out files, cut at line boundaries, min_bytes..max_bytes long.
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
        if nb < min_bytes or not "".join(chunk).strip():
            continue
        used.add((rel, start))
        records.append({"text": "".join(chunk), "source": rel, "start_line": start + 1, "n_bytes": nb})
    return records
