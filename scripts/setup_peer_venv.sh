#!/usr/bin/env bash
# GPTQModel 7.6.0 in its own virtualenv (runs/peer-venv), never in qcal's: the interop test
# (tests/integration/test_gptqmodel_interop.py) and the peer benchmarks use it. torch is
# held on this machine's CPU build (2.13.0); BUILD_CUDA_EXT=0 skips the CUDA extension.
set -euo pipefail
cd "$(dirname "$0")/.."
PEER=${PEER_VENV:-runs/peer-venv}
if "$PEER/bin/python" -c "import gptqmodel" 2>/dev/null; then
  echo "GPTQModel venv ready at $PEER"
  exit 0
fi
PYTHON=${PYTHON:-python3}
"$PYTHON" -m venv "$PEER"
BUILD_CUDA_EXT=0 "$PEER/bin/pip" install --quiet torch==2.13.0 gptqmodel==7.6.0
"$PEER/bin/python" -c "import gptqmodel; print('GPTQModel', gptqmodel.__version__, 'ready at $PEER')"
