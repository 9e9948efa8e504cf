#!/usr/bin/env bash
# The one prepared GPU check: the GPU tests, then the GPU part of scripts/bench_kernels.py.
#
# Run from the repository root on a machine with a CUDA GPU, torch and triton installed
# (no network, no installs: the repo is used in place through PYTHONPATH, and the GPU
# code needs only torch, triton and pytest). Outputs go under $OUT (default /tmp/qcal-gpu):
#   env.txt          GPU, driver, python/torch/triton versions
#   gpu_tests.log    pytest -m gpu tests/gpu
#   bench.log        the benchmark's progress
#   kernels.json/md  results/kernels.{json,md} with the GPU section added: copy them to results/
# Exit status: 0 only if both the tests and the benchmark succeeded.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/qcal-gpu}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
export QCAL_AUTOTUNE=1 HF_HUB_OFFLINE=1
unset TRITON_INTERPRET QCAL_KERNEL

{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.memory --format=csv 2>&1
  "$PY" -c 'import sys, torch, triton; print(sys.version.split()[0], "torch", torch.__version__,
"triton", triton.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())' 2>&1
} >"$OUT/env.txt"
cat "$OUT/env.txt"

echo "== GPU tests"
timeout 270 "$PY" -m pytest -q -m gpu tests/gpu --noconftest -p no:cacheprovider --maxfail=20 \
  2>&1 | tee "$OUT/gpu_tests.log"
tests_rc=${PIPESTATUS[0]}

echo "== GPU benchmark"
timeout 300 "$PY" scripts/bench_kernels.py --part gpu --out "$OUT/kernels" \
  --merge results/kernels.json 2>&1 | tee "$OUT/bench.log"
bench_rc=${PIPESTATUS[0]}

echo "tests rc=$tests_rc bench rc=$bench_rc; outputs in $OUT: $(ls "$OUT" | tr '\n' ' ')"
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
