# Two commands do all set-up on a fresh machine:
#   make run   - creates .venv, installs ftscope, runs the main job (plan) on the bundled IISWC example
#   make test  - installs what the tests need (the CPU torch wheel included) and runs pytest
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch is pinned to the local 2.13.0 CPU wheel: an unpinned torch pulls a multi-GB CUDA build.
TORCH := torch==2.13.0

.PHONY: run test install install-test clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.core: $(BIN)/python pyproject.toml
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.test: $(VENV)/.core
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e '.[measure,report,test]'
	touch $@

install: $(VENV)/.core
install-test: $(VENV)/.test

run: $(VENV)/.core
	$(BIN)/ftscope plan examples/iiswc-mixtral-qlora.yaml

test: $(VENV)/.test
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache
