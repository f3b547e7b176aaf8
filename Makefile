# acceld: `make run` tries it, `make test` proves it. Both set up what they need.

PYTHON ?= python3
VENV ?= .venv
PORT ?= 6666
STATE_PATH ?= ./.acceld
PYTEST_ARGS ?=

BIN := $(VENV)/bin
STAMP_RUN := $(VENV)/.acceld-installed
STAMP_TEST := $(VENV)/.acceld-test-installed
# A real Keystone for the auth tests, in its own venv, plus its prepared template.
STAMP_KEYSTONE := .keystone/template-30.0.0/template.json

.PHONY: run test bench venv clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP_RUN): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(STAMP_TEST): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@ $(STAMP_RUN)

venv: $(STAMP_RUN)

run: $(STAMP_RUN)
	$(BIN)/acceld all --port $(PORT) --state-path $(STATE_PATH)

$(STAMP_KEYSTONE): tests/support/keystone.py | $(STAMP_TEST)
	rm -rf .keystone/template-30.0.0
	$(BIN)/python -m tests.support.keystone

test: $(STAMP_TEST) $(STAMP_KEYSTONE)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) $(STATE_PATH) .pytest_cache
