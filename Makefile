# Two commands do all setup on a fresh machine:
#   make run    create .venv, install, run the main job (the first time ~2-3 min with the install, then ~12 s)
#   make test   create .venv, install, run the test suite
#   make test-min   the hf tests again on the oldest transformers pyproject allows (CI runs both)
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# setuptools' notice on every editable install of a package mapped from several directories (src/specdepth,
# policies, conf) says nothing about this project: the install step silences that one warning.
# torch is pinned to the CPU build that this project's machines hold (see constraints.txt).
# GPU users: install their CUDA torch into the venv first, then `make CONSTRAINTS= test`.
CONSTRAINTS ?= constraints.txt
PIP_C := $(if $(CONSTRAINTS),-c $(CONSTRAINTS),)
PYTEST_ARGS ?=
# test-min: a venv that sees .venv's packages (its torch, this checkout) and holds of its own only the minimum
# transformers of src/specdepth/versions.py and what that release needs (.ci/min_env.sh)
MIN_VENV ?= $(VENV)/min
HF_TESTS ?= tests/test_hf_*.py tests/test_tiny_pair.py

.PHONY: run test test-fast test-min setup clean bench
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	PYTHONWARNINGS="ignore:Editable installation" $(BIN)/python -m pip install -q $(PIP_C) -e ".[all]"
	touch $@

run: setup
	$(BIN)/specdepth experiment=main

test: setup
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow" $(PYTEST_ARGS)

$(MIN_VENV)/.installed: $(VENV)/.installed src/specdepth/versions.py .ci/min_env.sh
	.ci/min_env.sh $(VENV) $(MIN_VENV) $$($(BIN)/python -m specdepth.versions --min transformers)
	touch $@

test-min: $(MIN_VENV)/.installed
	$(MIN_VENV)/bin/python -m pytest -q $(HF_TESTS) $(PYTEST_ARGS)

bench: setup
	$(BIN)/python experiments/perf/sim_throughput.py

clean:
	rm -rf $(VENV) outputs multirun .pytest_cache
