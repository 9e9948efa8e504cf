#!/usr/bin/env bash
# The studies of issue 15 at a budget that can carry a conclusion, as resumable grids,
# then their tables (seeds, 95% intervals, paired tests, findings against the papers):
#   configs/study_multilingual{,_gemma3}.yaml -> results/multilingual.{md,json}
#   configs/study_zipcal{,_gemma3}.yaml       -> results/zipcal.{md,json}
#   configs/study_confidence{,_gemma3}.yaml   -> results/confidence.{md,json}
#   configs/study_benchmarks{,_gemma3}.yaml   -> results/benchmarks.{md,json}
#   configs/study_lambada_seeds.yaml          -> LAMBADA in results/benchmarks.md (3 draws)
# Each `qcal compare` continues where it stopped (finished cells are never recomputed), so
# the whole thing can run across sessions: `bash scripts/run_evidence_studies.sh` again.
# Many hours on a 2-core CPU (AWQ cells and Gemma's 262k-token head dominate).
# STUDIES="study_multilingual" limits the grids run; extra arguments go to every
# `qcal compare` (e.g. --jobs 2).
set -euo pipefail
cd "$(dirname "$0")/.."
QCAL=${QCAL:-.venv/bin/qcal}
# Order: the seeded studies on both models first, the single-draw benchmark grids last (if
# the compute runs out early, the studies' findings on both models are what matters most).
STUDIES=${STUDIES:-"study_multilingual study_zipcal study_confidence study_multilingual_gemma3 study_zipcal_gemma3 study_confidence_gemma3 study_benchmarks study_benchmarks_gemma3 study_lambada_seeds"}
# A grid that fails (its error is in the log) does not hold up the others; the tables are
# still rendered from what exists, and the exit status says that something failed.
failed=""
for grid in $STUDIES; do
  "$QCAL" compare --config "configs/$grid.yaml" "$@" || failed="$failed $grid"
done
# The grids of a study that have cells: as they are, or each after --OPTION when one is given.
grids() {
  for g in "results/$1" "results/$1_gemma3"; do
    if [ -d "$g/cells" ]; then if [ -n "${2:-}" ]; then printf -- '--%s ' "$2"; fi; printf '%s ' "$g"; fi
  done
}
# shellcheck disable=SC2046
"$QCAL" report $(grids study_multilingual) --study multilingual
# shellcheck disable=SC2046
"$QCAL" report $(grids study_zipcal) --study zipcal
# shellcheck disable=SC2046
"$QCAL" report $(grids study_confidence) --study confidence $(grids study_benchmarks bench-grid) \
  $(grids study_lambada_seeds bench-grid)
if [ -n "$failed" ]; then
  echo "run_evidence_studies: these grids stopped with an error:$failed" >&2
  exit 1
fi
