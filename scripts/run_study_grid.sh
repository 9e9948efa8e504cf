#!/usr/bin/env bash
# The calibration-set study on the default model (issue 8), as two resumable grids:
#  1. configs/multilingual_grid.yaml: 5 single-language sets + 3 mixes x {RTN, GPTQ, AWQ},
#     perplexity on held-out text in six languages;
#  2. configs/zipcal_grid.yaml: random vs zipf vs perplexity selection x {RTN, GPTQ, AWQ},
#     English perplexity plus the local English next-sentence task with confidence calibration.
# Budget for a 2-core CPU: 16 calibration windows of 256 tokens per set; the first 4
# perplexity windows of 512 tokens per language; 100 task items.
# GPTQ runs with act-order: on this model it is what makes GPTQ beat RTN (results/gptq.md).
# Re-running continues where it stopped; finished cells are never recomputed.
# Tables: results/multilingual_grid/tables.md and results/zipcal_grid/tables.md (the
# seeded issue-15 studies, scripts/run_evidence_studies.sh, supersede them).
# Extra arguments go to both `qcal compare` calls (e.g. --jobs 2).
set -euo pipefail
cd "$(dirname "$0")/.."
QCAL=${QCAL:-.venv/bin/qcal}
"$QCAL" compare --config configs/multilingual_grid.yaml "$@"
"$QCAL" compare --config configs/zipcal_grid.yaml "$@"
"$QCAL" report --study selection
