# Thin wrappers; every target uses the project's virtualenv made by `make setup`.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup test test-fast lint quantize eval

setup:
	bash scripts/setup.sh

test:
	$(PY) -m pytest -q

test-fast:
	$(PY) -m pytest -q -m "unit"

lint:
	$(VENV)/bin/ruff check qcal kernels scripts tests

quantize:
	$(VENV)/bin/qcal quantize

eval:
	$(VENV)/bin/qcal eval --ppl --langs all
