#!/usr/bin/env bash
# The method benchmarks on the default model, as resumable comparison grids:
#   configs/baseline_grid.yaml     float vs RTN asym/sym, ten languages      -> results/baseline.md
#   configs/gptq_vs_rtn.yaml  GPTQ (+/- act-order) vs RTN, asym/sym     -> results/gptq.md
#   configs/awq_vs_rtn.yaml   AWQ vs GPTQ vs RTN on one calibration set -> results/awq.md
# Re-running continues where it stopped; finished cells are never recomputed.
# Extra arguments go to every `qcal compare` call (e.g. --jobs 2).
set -euo pipefail
cd "$(dirname "$0")/.."
QCAL=${QCAL:-.venv/bin/qcal}
PY=${PY:-.venv/bin/python}
for grid in baseline_grid gptq_vs_rtn awq_vs_rtn; do
  "$QCAL" compare --config "configs/$grid.yaml" "$@"
done
"$PY" scripts/grid_tables.py baseline
"$PY" scripts/grid_tables.py gptq --time-cli
"$PY" scripts/grid_tables.py awq
