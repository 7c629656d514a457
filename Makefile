# Two commands do all set-up on a fresh machine:
#   make run   - creates .venv, installs ftscope, estimates and plans the bundled IISWC example across GPUs
#   make test  - installs what the tests need (the CPU torch wheel included) and runs pytest
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch is pinned to the local 2.13.0 CPU wheel: an unpinned torch pulls a multi-GB CUDA build.
TORCH := torch==2.13.0

.PHONY: run test fuzz bad-inputs install install-test chromium clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.core: $(BIN)/python pyproject.toml
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.test: $(VENV)/.core
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e '.[measure,report,serve,test,lightning]'
	touch $@

# The report test opens the HTML in headless Chromium (Debian's package); it skips, saying why, if this fails.
chromium:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  ( (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null 2>&1 \
	    || echo "chromium could not be installed: the report browser test will be skipped" )

install: $(VENV)/.core
install-test: $(VENV)/.test

run: $(VENV)/.core
	$(BIN)/ftscope estimate examples/iiswc-mixtral-qlora.yaml
	$(BIN)/ftscope plan examples/iiswc-mixtral-qlora.yaml

test: $(VENV)/.test chromium
	$(BIN)/python -m pytest

# Long randomized property tests (CI runs them derandomized): FUZZ_RUNS rounds of fresh random examples.
FUZZ_RUNS ?= 10
PROPERTY_TESTS := tests/spec/test_scenario.py tests/spec/test_workload.py tests/plan/test_solvers.py \
	tests/estimate/test_memory.py tests/estimate/test_estimate.py tests/measure/test_search.py
fuzz: $(VENV)/.test
	for i in $$(seq $(FUZZ_RUNS)); do HYPOTHESIS_PROFILE=fuzz $(BIN)/python -m pytest -q -x -p no:cacheprovider \
	  -m "not slow" $(PROPERTY_TESTS) || exit 1; done

# Every bad-input case as a real subprocess (a few minutes): the summary line the README quotes.
bad-inputs: $(VENV)/.core
	$(BIN)/python benchmarks/bad_inputs.py

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache
