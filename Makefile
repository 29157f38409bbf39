# Set-up is part of every target: a fresh machine needs only python3 (>= 3.11) and make.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
EVIDENCE ?= evidence/demo
PYTEST_WORKERS ?= 2

.PHONY: demo test fixtures nightly-gpu clean
NIGHTLY_OUT ?= evidence/nightly

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $@

fixtures: $(STAMP)
	$(BIN)/lockstep fixtures build

# The main job: the parity matrix over the built-in fixtures, writing evidence and the report.
demo: fixtures
	rm -rf $(EVIDENCE)
	$(BIN)/lockstep run --evidence-dir $(EVIDENCE)
	$(BIN)/lockstep report $(EVIDENCE) -o $(EVIDENCE)/report.html

# The test suite (what CI runs).
test: fixtures
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) -q

# The nightly GPU evidence run (a CUDA machine): GPU suites under --require-gpu with the
# nightly Hypothesis profile, the parity matrix with native-cuda, evidence and the report.
nightly-gpu: $(STAMP)
	$(BIN)/python -m pip install -q -e '.[cuda13]'
	OUT=$(NIGHTLY_OUT) PY=$(BIN)/python LOCKSTEP_HYPOTHESIS_PROFILE=nightly scripts/gpu_run.sh

clean:
	rm -rf $(VENV) .lockstep evidence .pytest_cache .hypothesis
