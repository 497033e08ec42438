# Two commands do all setup on a fresh machine:
#   make run    create .venv, install, run the main job (embedded default study, seconds)
#   make test   create .venv, install, run the test suite
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch is pinned to the CPU build that this project's machines hold (see constraints.txt).
# GPU users: install their CUDA torch into the venv first, then `make CONSTRAINTS= test`.
CONSTRAINTS ?= constraints.txt
PIP_C := $(if $(CONSTRAINTS),-c $(CONSTRAINTS),)
PYTEST_ARGS ?=

.PHONY: run test test-fast setup clean bench
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(PIP_C) -e ".[all]"
	touch $@

run: setup
	$(BIN)/specdepth experiment=main

test: setup
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow" $(PYTEST_ARGS)

bench: setup
	$(BIN)/python experiments/perf/sim_throughput.py

clean:
	rm -rf $(VENV) outputs multirun .pytest_cache
