#!/usr/bin/env bash
# GPTQModel 7.6.0 in its own virtualenv (runs/peer-venv), never in qcal's: the interop test
# (tests/integration/test_gptqmodel_interop.py) and the peer benchmarks use it. torch is
# held on this machine's CPU build (2.13.0); BUILD_CUDA_EXT=0 skips the CUDA extension.
set -euo pipefail
cd "$(dirname "$0")/.."
PEER=$(realpath -m "${PEER_VENV:-runs/peer-venv}")
# Import checks run from / : `python -c` puts the working directory first on sys.path, and
# this repository's kernels/ folder would then shadow the `kernels` package GPTQModel's
# transformers imports (qcal installs its own as qcal_kernels, so only the checkout collides).
peer_imports() { (cd / && "$PEER/bin/python" -c "$1"); }
if peer_imports "import gptqmodel" 2>/dev/null; then
  echo "GPTQModel venv ready at $PEER"
  exit 0
fi
PYTHON=${PYTHON:-python3}
"$PYTHON" -m venv "$PEER"
BUILD_CUDA_EXT=0 "$PEER/bin/pip" install --quiet torch==2.13.0 gptqmodel==7.6.0
peer_imports "import gptqmodel; print('GPTQModel', gptqmodel.__version__, 'ready at $PEER')"
