"""Every `specdepth` / `specdepth-profile` command in README.md and docs/*.md is valid as written: its overrides
parse and compose against the real configs (groups, keys, launcher and sweeper plugins), and a command whose
config carries a sweep grid says --multirun (or the preset sweeps by itself). The cheap ones run for real
from a fresh directory (marked slow), the README's custom-policy example included."""
from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser

from sdtest import ROOT
from specdepth.app import CONF_DIR
from test_bad_inputs import _main

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def commands():
    """(file, command line) of every specdepth command in a ```bash block (continuations joined, comments cut)."""
    out = []
    for doc in DOCS:
        for block in re.findall(r"```bash\n(.*?)```", doc.read_text(), re.S):
            text = re.sub(r"\\\n\s*", " ", block)
            for line in text.splitlines():
                line = line.split("#", 1)[0].strip()
                if re.match(r"^(PYTHONPATH=\S+ )?specdepth(-profile)?( |$)", line):
                    out.append((doc.name, line))
    return out


CMDS = commands()


def _overrides(line: str):
    words = shlex.split(line)
    env = [w for w in words if re.match(r"^[A-Z_]+=", w)]
    words = words[len(env):]
    prog, args = words[0], words[1:]
    multirun = "--multirun" in args or "-m" in args
    args = [re.sub(r"<[^>]+>", "x", a) for a in args if a not in ("--multirun", "-m")]
    return prog, args, multirun


def _first_point(args):
    """Sweep overrides (a,b,c) replaced by their first value: one point of the grid, to compose."""
    parser = OverridesParser.create()
    out = []
    for o in parser.parse_overrides(args):
        if o.is_sweep_override():
            out.append(f"{o.get_key_element()}={next(o.sweep_string_iterator())}")
        else:
            out.append(o.input_line)
    return out


def test_the_docs_have_commands():
    assert len(CMDS) >= 20
    assert any("experiment=policy_grid" in c for _, c in CMDS)


@pytest.mark.parametrize("doc,line", CMDS, ids=[f"{d}:{c[:70]}" for d, c in CMDS])
def test_doc_command_composes(doc, line):
    prog, args, multirun = _overrides(line)
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("profile" if prog == "specdepth-profile" else "config", overrides=_first_point(args),
                      return_hydra_config=True)
    grid = cfg.hydra.sweeper.get("params") or {}
    if grid and prog == "specdepth":
        assert multirun or str(cfg.hydra.mode) == "RunMode.MULTIRUN", \
            f"{doc}: `{line}` carries a sweep grid but runs one run: add --multirun"


README = (ROOT / "README.md").read_text()
CHEAP = [c for d, c in CMDS if d == "README.md" and c.startswith(("specdepth ", "PYTHONPATH")) or c == "specdepth"]
CHEAP = [c for c in CHEAP if "experiment=" not in c and "<" not in c]


@pytest.mark.slow
def test_cheap_readme_commands_run_as_written(tmp_path):
    """The README's tour, from an empty directory: the single runs (simulator and the shipped real pair),
    the custom policy (its module written from the README's own code block), the sweep and its report."""
    pytest.importorskip("transformers")
    from transformers import AutoModelForCausalLM  # noqa: F401
    code_block = re.search(r"```python\n(.*?)```", README, re.S).group(1)
    (tmp_path / "mymodule.py").write_text(code_block)
    assert len(CHEAP) >= 6, CHEAP
    sys.path.insert(0, str(tmp_path))   # PYTHONPATH=.
    try:
        for line in CHEAP:
            prog, args, multirun = _overrides(line)
            code, out = _main((["--multirun"] if multirun else []) + args + ["engine.progress=false"], tmp_path)
            assert code == 0, f"`{line}` failed:\n{out[-3000:]}"
    finally:
        sys.path.remove(str(tmp_path))
    from specdepth.report import main as report_main
    assert report_main([str(tmp_path / "outputs/multirun/default"), "--no-plots"]) == 0


def test_every_policy_preset_key_is_documented_in_its_row_of_docs_policies():
    """docs/policies.md has a row per conf/policy preset, and that row names every key the preset sets (a new
    option lands in the docs with its config)."""
    import yaml
    rows = {m.group(1): line for line in (ROOT / "docs" / "policies.md").read_text().splitlines()
            if (m := re.match(r"\| `([a-z_0-9]+)` \|", line))}
    missing = {}
    for f in sorted((ROOT / "conf" / "policy").glob("*.yaml")):
        keys = [k for k in (yaml.safe_load(f.read_text()) or {}) if not k.startswith("_")]
        row = rows.get(f.stem)
        gone = keys if row is None else [k for k in keys if f"`{k}`" not in row and f"`{k}:" not in row]
        if gone:
            missing[f.stem] = gone
    assert len(rows) >= 13 and not missing, missing
