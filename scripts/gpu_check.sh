#!/usr/bin/env bash
# The one prepared GPU check, end to end: the Triton kernel tests against the torch
# reference, the pipeline on CUDA (GPTQ and AWQ quantize with --device cuda and agree with
# CPU-made checkpoints, eval through the Triton kernel equals the reference, a two-cell
# comparison grid on the GPU, torchrun with nccl where there are two GPUs:
# tests/gpu/test_pipeline_gpu.py), then the GPU part of
# scripts/bench_kernels.py.
#
# Run from the repository root on a machine with a CUDA GPU, torch, triton, transformers,
# tokenizers and safetensors installed (no network, no installs: the repo is used in place
# through PYTHONPATH; the model is the tiny random Llama built from a config). Through the
# device tool: run(command="bash scripts/gpu_check.sh", timeout_s=590); about 8 minutes.
# Outputs go under $OUT (default /tmp/qcal-gpu):
#   env.txt          GPU, driver, python/torch/triton versions
#   gpu_tests.log    pytest -m gpu tests/gpu (kernels + pipeline) + the shared-context scorer
#   bench.log        the benchmark's progress
#   kernels.json/md  results/kernels.{json,md} with the GPU section added: copy them to results/
# Exit status: 0 only if both the tests and the benchmark succeeded.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/qcal-gpu}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
# kernels/ installs as qcal_kernels; in place, a link named so makes it importable.
mkdir -p "$OUT/pkgs" && ln -sfn "$PWD/kernels" "$OUT/pkgs/qcal_kernels"
export PYTHONPATH="$PWD:$OUT/pkgs${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
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
# tests/integration/test_shared_context.py: the shared-context lm-eval scorer on CUDA (needs lm_eval)
timeout 330 "$PY" -m pytest -q -m gpu tests/gpu tests/integration/test_shared_context.py \
  -p no:cacheprovider --maxfail=20 \
  2>&1 | tee "$OUT/gpu_tests.log"
tests_rc=${PIPESTATUS[0]}

echo "== vLLM on a compressed-tensors export (only where vllm and lm_eval are installed)"
vllm_rc=0
if "$PY" -c "import vllm, lm_eval" 2>/dev/null; then
  "$PY" - "$OUT" <<'PYEOF' 2>&1 | tee "$OUT/vllm.log"
import subprocess, sys
from pathlib import Path
from qcal.model.tiny import build_tiny_llama
out = Path(sys.argv[1])
model = build_tiny_llama(out / "vllm-tiny", hidden=256, intermediate=512)
run = lambda *a: subprocess.run([sys.executable, "-m", "qcal", *a], check=True)
run("quantize", "--model", str(model), "--format", "compressed-tensors", "--sym",
    "-o", str(out / "vllm-ct"))
run("eval", "--backend", "vllm", "--model", str(out / "vllm-ct"), "--tasks",
    "qcal_nextsent_en", "--limit", "20")
PYEOF
  vllm_rc=${PIPESTATUS[0]}
else
  echo "vllm or lm_eval not installed on this machine: the vLLM check is skipped" | tee "$OUT/vllm.log"
fi

echo "== GPU benchmark"
timeout 200 "$PY" scripts/bench_kernels.py --part gpu --out "$OUT/kernels" \
  --merge results/kernels.json 2>&1 | tee "$OUT/bench.log"
bench_rc=${PIPESTATUS[0]}

echo "tests rc=$tests_rc vllm rc=$vllm_rc bench rc=$bench_rc; outputs in $OUT: $(ls "$OUT" | tr '\n' ' ')"
[ "$tests_rc" -eq 0 ] && [ "$vllm_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
