"""Reading the JSONL input files (workload=file, model.prompts, acceptance=trace) strictly: every problem is
a ConfigError naming the file and line: text that is not UTF-8, a line that is not a JSON object, a key the
format does not have (`arival_s`), a field of the wrong type (`prompt_ids` given as a string)."""
from __future__ import annotations

import json
import numbers
from pathlib import Path

from .errors import ConfigError


def records(path, key: str, known, what: str):
    """(where, record) for every non-blank line of the JSONL file `path` (config key `key`); `where` is
    "file:line". Refuses a missing file, non-UTF-8 text, invalid JSON, non-objects and keys outside `known`."""
    p = Path(str(path))
    if not p.is_file():
        raise ConfigError(f"{key}: {what} file not found: {p}")
    with p.open("rb") as f:
        for lineno, raw in enumerate(f, 1):
            where = f"{p}:{lineno}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ConfigError(f"{where}: not UTF-8 text (byte {raw[e.start]:#04x} at column {e.start + 1}); "
                                  f"{key} must be a UTF-8 JSONL file") from None
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ConfigError(f"{where}: invalid JSON ({e})") from None
            if not isinstance(rec, dict):
                raise ConfigError(f"{where}: expected a JSON object, got {type(rec).__name__}")
            unknown = sorted(set(rec) - set(known))
            if unknown:
                raise ConfigError(f"{where}: unknown key {unknown[0]!r}"
                                  + (f" (also {', '.join(map(repr, unknown[1:]))})" if unknown[1:] else "")
                                  + f"; a {what} line has {', '.join(sorted(known))}")
            yield where, rec


def token_ids(value, where: str, field: str = "prompt_ids") -> list[int]:
    """A list of non-negative integer token ids (not a string, not floats, not empty)."""
    if not isinstance(value, list):
        raise ConfigError(f"{where}: {field} must be a list of integer token ids, got {type(value).__name__} "
                          f"{str(value)[:40]!r}")
    for i, x in enumerate(value):
        if isinstance(x, bool) or not isinstance(x, numbers.Integral) or x < 0:
            raise ConfigError(f"{where}: {field}[{i}] must be a non-negative integer token id, got {x!r}")
    if not value:
        raise ConfigError(f"{where}: {field} is empty")
    return [int(x) for x in value]


def number_list(value, where: str, field: str) -> list:
    """A list of numbers (JSON numbers, not strings or booleans)."""
    if not isinstance(value, list) or any(isinstance(x, bool) or not isinstance(x, numbers.Real) for x in value):
        raise ConfigError(f"{where}: {field} must be a list of numbers, got {str(value)[:40]!r}")
    return value


# model.prompts lines: one of text / prompt / prompt_ids; source, start_line, n_bytes: provenance, ignored
PROMPT_KEYS = ("text", "prompt", "prompt_ids", "source", "start_line", "n_bytes")


def prompt_record(where: str, rec: dict):
    """A model.prompts line's prompt: its text (str) or its token ids (list of int); exactly one of them."""
    given = [k for k in ("text", "prompt", "prompt_ids") if rec.get(k) is not None]
    if len(given) != 1:
        raise ConfigError(f"{where}: expected exactly one of 'text', 'prompt' or 'prompt_ids', got "
                          f"{given or 'none'}")
    if given[0] == "prompt_ids":
        return token_ids(rec["prompt_ids"], where)
    text = rec[given[0]]
    if not isinstance(text, str):
        raise ConfigError(f"{where}: {given[0]} must be a string, got {type(text).__name__}")
    return text


def too_large_draft_vocab(pair, draft_rows: int, target_model) -> str:
    """The message refusing a draft whose vocabulary is larger than the target's (it could propose a token
    the target has no row for)."""
    rows = int(target_model.get_output_embeddings().weight.shape[0])
    return (f"model.draft: its vocabulary has {draft_rows} rows, more than model.target's {rows} "
            f"({pair.draft} vs {pair.target}); the draft could propose tokens the target cannot score: "
            f"use a draft with the target's vocabulary")
