"""backend=hf refuses bad inputs with a clear error, before anything is written."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from conftest import build_tiny_llama, build_tokenizer, compose, hf_overrides  # noqa: E402
from specdepth.app import CONF_DIR, run  # noqa: E402
from specdepth.errors import BackendError, ConfigError, PolicyError, SpecdepthError  # noqa: E402
from specdepth.policy import Policy  # noqa: E402

RESULT_FILES = {"summary.json", "steps.csv", "requests.csv", "generations.jsonl", "acceptance_trace.jsonl",
                "config.yaml"}


class OverDeep(Policy):
    """Asks for more depth than engine.max_depth allows."""

    def __init__(self, depth: int = 4):
        self.depth = depth

    def plan(self, view):
        return np.full(view.batch_size, view.max_depth + 3, dtype=np.int64)


class Oracle(Policy):
    requires_oracle = True

    def __init__(self, depth: int = 4):
        pass

    def plan(self, view):
        return np.asarray(view.oracle_accept, dtype=np.int64)


def _fails(pair, tmp_path, exc, match, *extra):
    base = [] if any(e.startswith("workload=") for e in extra) else [
        "workload.batch_size=2", "workload.prompt_len=4", "workload.output_len=4"]
    cfg = compose(hf_overrides(pair, *base, *extra))
    with pytest.raises(exc, match=match):
        run(cfg, tmp_path / "run")
    left = set(p.name for p in (tmp_path / "run").glob("*")) if (tmp_path / "run").exists() else set()
    assert not (left & RESULT_FILES), f"half-written results: {left}"


@pytest.fixture(scope="module")
def other_vocab_draft(tmp_path_factory):
    d = tmp_path_factory.mktemp("other_vocab") / "draft"
    build_tiny_llama(d, vocab=48, tokenizer=build_tokenizer(48), seed=3)
    return d


def test_mismatched_vocabularies(tiny_pair, tmp_path, other_vocab_draft):
    pair = dict(tiny_pair, draft=other_vocab_draft)
    _fails(pair, tmp_path, BackendError, r"model.draft: .*different vocabulary")


def test_draft_vocab_too_small_without_tokenizer(tiny_pair, tmp_path):
    d = tmp_path / "d"
    build_tiny_llama(d, vocab=32, tokenizer=False, seed=4)
    _fails(dict(tiny_pair, draft=d), tmp_path, BackendError, r"model.draft: its vocabulary has 32 rows")


def test_empty_prompt(tiny_pair, tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"text": "w5 w6"}) + "\n" + json.dumps({"text": ""}) + "\n")
    _fails(tiny_pair, tmp_path, ConfigError, r"row 1 .*empty prompt", "workload=dataset", f"workload.path={f}")
    # a prompt that tokenizes to nothing is refused by the backend, naming the request
    f.write_text(json.dumps({"text": "w5 w6"}) + "\n" + json.dumps({"text": "   "}) + "\n")
    _fails(tiny_pair, tmp_path, ConfigError, r"empty prompt", "workload=dataset", f"workload.path={f}")


def test_empty_prompt_ids(tiny_pair, tmp_path):
    from specdepth.cost import ConstantCost
    from specdepth.engine import Engine, EngineConfig
    from specdepth.hf import HFExecutor
    from specdepth.models import ModelPair
    from specdepth.policies.fixed import FixedDepth
    from specdepth.workload import Request
    mp = ModelPair(target=str(tiny_pair["target"]), draft=str(tiny_pair["draft"]), dtype="float32", device="cpu")
    cost = ConstantCost(mp.target_arch)
    cfg = EngineConfig(progress=False)
    ex = HFExecutor(cost=cost, model=mp, decode={"temperature": 0.0}, engine=cfg)
    with pytest.raises(ConfigError, match="request 1: empty prompt"):
        Engine(FixedDepth(2), ex, cost, cfg, [Request(0, 0.0, 2, 3, prompt_ids=[4, 5]),
                                               Request(1, 0.0, 0, 3, prompt_ids=[])])
    with pytest.raises(ConfigError, match="request 0: output_len must be >= 1"):
        Engine(FixedDepth(2), ex, cost, cfg, [Request(0, 0.0, 2, 0, prompt_ids=[4, 5])])


def test_output_len_zero(tiny_pair, tmp_path):
    _fails(tiny_pair, tmp_path, ConfigError, r"workload.output_len must be >= 1", "workload.output_len=0")
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"text": "w5 w6"}) + "\n")
    _fails(tiny_pair, tmp_path, ConfigError, r"workload.output_len must be >= 1", "workload=dataset",
           f"workload.path={f}", "workload.output_len=0")


def test_prompt_longer_than_context(tiny_pair, tmp_path):
    # refused before the models load (app.build checks the requests against the checkpoints' max_context)
    _fails(tiny_pair, tmp_path, ConfigError, r"= 600 \+ 4 \+ 16 = 620 tokens \(request 0\) exceed the context of "
           r"model target \(512 tokens", "workload.prompt_len=600")
    _fails(tiny_pair, tmp_path, ConfigError, r"= 526 tokens \(request 0\) exceed the context of model target \(512",
           "workload.prompt_len=400", "workload.output_len=110")


def test_policy_invalid_allocation(tiny_pair, tmp_path):
    _fails(tiny_pair, tmp_path, PolicyError, r"depth 7 > engine.max_depth=4", "engine.max_depth=4",
           "policy=fixed", f"policy._target_={__name__}.OverDeep")


def test_oracle_policy_refused(tiny_pair, tmp_path):
    _fails(tiny_pair, tmp_path, ConfigError, r"backend=sim", "policy=fixed", f"policy._target_={__name__}.Oracle")


def test_builtin_oracle_policies_refused(tiny_pair, tmp_path):
    from hydra.utils import get_class
    from omegaconf import OmegaConf
    for f in sorted(Path(CONF_DIR, "policy").glob("*.yaml")):
        if getattr(get_class(OmegaConf.load(f)["_target_"]), "requires_oracle", False):
            _fails(tiny_pair, tmp_path / f.stem, ConfigError, r"backend=sim", f"policy={f.stem}")


def test_missing_model_and_draft(tiny_pair, tmp_path):
    _fails(dict(tiny_pair, target=tmp_path / "nope"), tmp_path, SpecdepthError, r"model.target_arch")
    cfg = hf_overrides(tiny_pair, "model.draft=null", "model.draft_arch=null")
    with pytest.raises(ConfigError, match="model.draft: backend=hf needs a draft"):
        run(compose(cfg), tmp_path / "r2")


def test_bad_decode(tiny_pair, tmp_path):
    _fails(tiny_pair, tmp_path, ConfigError, r"decode.temperature must be >= 0", "decode.temperature=-1")
    _fails(tiny_pair, tmp_path, ConfigError, r"decode.top_p must be > 0", "decode.top_p=0")
