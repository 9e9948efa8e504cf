#!/usr/bin/env bash
# The calibration-set study on the default model (issue 8), as two resumable grids:
#  1. multilingual: 5 single-language sets + 3 mixes x {RTN, GPTQ, AWQ}, perplexity on
#     held-out text in six languages;
#  2. zipcal: random vs zipf vs perplexity selection x {RTN, GPTQ, AWQ}, English
#     perplexity plus the local English next-sentence task with confidence calibration.
# Budget for a 2-core CPU: 16 calibration windows of 256 tokens per set; the first 4
# perplexity windows of 512 tokens per language; 100 task items.
# GPTQ runs with act-order: on this model it is what makes GPTQ beat RTN (results/gptq.md).
# Re-running continues where it stopped; finished cells are never recomputed.
set -euo pipefail
cd "$(dirname "$0")/.."
QCAL=${QCAL:-.venv/bin/qcal}
COMMON=(--bits 4 --group-size 128 --desc-act --nsamples 16 --seqlen 256 --seed 0 --max-windows 4)
"$QCAL" compare --name multilingual_grid "${COMMON[@]}" \
  --selectors ml:en,ml:de,ml:ru,ml:zh,ml:ar,mix:study10,mix:en-heavy,mix:study5 \
  --methods rtn,gptq,awq --eval ppl --eval-langs en,de,ru,zh,ar,ja
"$QCAL" compare --name zipcal_grid "${COMMON[@]}" \
  --selectors random,zipf,perplexity --methods rtn,gptq,awq \
  --eval ppl,qcal_nextsent_en,calibration --eval-langs en --limit 100
.venv/bin/python scripts/study_tables.py
