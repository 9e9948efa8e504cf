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

# The main job: GPTQ (act-order) w4 on a Zipf-selected calibration set from the packaged
# corpus, then float vs quantized perplexity on held-out English (2.5-6 min on 2 cores).
quantize:
	$(VENV)/bin/qcal quantize --method gptq --desc-act --selector zipf --nsamples 32 \
	  --seqlen 512 --eval

eval:
	$(VENV)/bin/qcal eval --ppl --langs all
