#!/usr/bin/env bash
# Reproduces results/eval_example.{json,md} (+ _reliability.png, _items.jsonl,
# _token_nll.safetensors): the default model in float vs its RTN w4 g128 checkpoint,
# evaluated end to end in one `qcal eval` command: perplexity and KL/JS drift per
# language on held-out handbook text, the local lm-eval task qcal_nextsent_en, and
# confidence calibration with drift. CPU-only is fine (it takes a while on 2 cores).
#
# Knobs (environment): LANGS, MAX_WINDOWS (windows of 512 tokens per language), TASKS,
# LIMIT (items per task; empty = all), OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v qcal >/dev/null && [ -f .venv/bin/activate ]; then
  . .venv/bin/activate
fi

LANGS=${LANGS:-en,de,fr,es,ru,ja,zh}
MAX_WINDOWS=${MAX_WINDOWS:-6}
TASKS=${TASKS:-qcal_nextsent_en}
LIMIT=${LIMIT:-}
OUT=${OUT:-results/eval_example}
BASE=models/smollm2-135m-instruct
CKPT=runs/smollm2-135m-instruct-rtn-w4g128

# RTN is deterministic and needs no calibration data: re-create the checkpoint so the
# numbers always come from the current quantizer (the defaults write $CKPT).
qcal quantize --method rtn --bits 4 --group-size 128 --allow-ragged-groups -o "$CKPT"

qcal eval --model "$CKPT" --base "$BASE" --ppl --langs "$LANGS" --max-windows "$MAX_WINDOWS" \
  --tasks "$TASKS" ${LIMIT:+--limit "$LIMIT"} --confidence -o "$OUT"
