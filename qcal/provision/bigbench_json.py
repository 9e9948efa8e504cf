"""BIG-bench JSON tasks as lm-eval documents, from PyPI's `bigbench==1.0.0` sdist.

lm-eval's `bigbench` tasks read `hails/bigbench`, which the HF `bigbench` dataset script
built with BIG-bench's own code (JsonTask + `default_format_fn`, zero-shot, the "all"
split kept in task order). That Hub dataset is out of reach here, so `bigbench_docs`
rebuilds its rows (`idx`, `inputs`, `targets`, `multiple_choice_targets`,
`multiple_choice_scores`) from the task.json files in the sdist; lm-eval's YAML then
turns them into requests exactly as it would online.

The sdist is 358 MB and is never installed or unpacked: only the wanted task.json
members are read while the tarball streams past.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from qcal.errors import QcalError
from qcal.eval.benchmarks import BIGBENCH_SDIST_FILE as SDIST_FILE
from qcal.fsio import sha256_file

SDIST = "bigbench==1.0.0"
# PyPI's file, as downloaded before the registry withdrew it (2026-12-04): a copy put into
# the cache by hand must be this one, or the tasks would silently differ from our results.
SDIST_SHA256 = "1bb398a5512c6d798cdebe0dfa0ac03f67f6033fa6b39c6ef71df978c7cbc5c2"
# pip 26 refuses a PyPI sdist whose metadata names a direct-URL dependency (bigbench's
# `bleurt @ file://...`) even under --no-deps, and deletes the download; pip 25.0.1 only
# checks that while resolving dependencies, which --no-deps skips.
FALLBACK_PIP = "pip==25.0.1"
# JsonTask's defaults (bigbench/api/json_task.py) where a task.json sets nothing.
RANDOM_SEED = 42
DEFAULT_INPUT_PREFIX = "\nQ: "
DEFAULT_OUTPUT_PREFIX = "\nA: "
DEFAULT_CHOICE_PREFIX = "\n  choice: "


class BigBenchSourceError(QcalError, RuntimeError):
    """The bigbench sdist cannot be fetched or lacks a wanted task."""


def _pip_download(pip: list[str], spec: str, dest: Path) -> subprocess.CompletedProcess[str]:
    cmd = [*pip, "download", "--no-deps", "--quiet", "-d", str(dest), spec]
    return subprocess.run(cmd, capture_output=True, text=True)


def fetch_sdist(cache: Path) -> Path:
    """The cached sdist, downloaded through pip on first use."""
    target = cache / SDIST_FILE
    if target.is_file():
        _check_sha256(target)
        return target
    cache.mkdir(parents=True, exist_ok=True)
    print(f"downloading {SDIST} (358 MB sdist; only multiemo's task.json files are read) ...",
          flush=True)
    res = _pip_download([sys.executable, "-m", "pip"], SDIST, cache)
    if res.returncode != 0 and "direct URL dependencies" in res.stderr:
        old = _pip_download([sys.executable, "-m", "pip"], FALLBACK_PIP, cache)
        wheels = sorted(cache.glob("pip-25.0.1-*.whl"))
        if old.returncode != 0 or not wheels:
            raise BigBenchSourceError(f"pip download {FALLBACK_PIP} failed: "
                                      f"{_last_line(old.stderr)}")
        # A pip wheel runs as-is: python <wheel>/pip.
        res = _pip_download([sys.executable, str(wheels[0] / "pip")], SDIST, cache)
    if res.returncode != 0 or not target.is_file():
        raise BigBenchSourceError(f"pip download {SDIST} failed ({_last_line(res.stderr)}); "
                                  f"or put {SDIST_FILE} into {cache}")
    _check_sha256(target)
    return target


def _check_sha256(sdist: Path) -> None:
    digest = sha256_file(sdist)
    if digest != SDIST_SHA256:
        raise BigBenchSourceError(f"{sdist} has sha256 {digest}, not PyPI's "
                                  f"{SDIST_SHA256}; replace it with PyPI's {SDIST_FILE}")


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"


def read_task_jsons(sdist: Path, members: Iterable[str]) -> dict[str, dict[str, Any]]:
    """task.json files by path under `bigbench/benchmark_tasks/`, read from the stream."""
    wanted = set(members)
    found: dict[str, dict[str, Any]] = {}
    try:
        with tarfile.open(sdist, "r|gz") as tar:
            for member in tar:
                # Members read `bigbench-1.0.0/bigbench/benchmark_tasks/<rel>`.
                rel = member.name.partition("/bigbench/benchmark_tasks/")[2]
                if rel in wanted and member.isfile():
                    handle = tar.extractfile(member)
                    if handle is not None:
                        found[rel] = json.load(handle)
                if len(found) == len(wanted):
                    break
    except (tarfile.TarError, OSError, EOFError) as err:
        raise BigBenchSourceError(f"{sdist} is not a readable bigbench sdist ({err}); delete it "
                                  "and provision again") from None
    missing = sorted(wanted - set(found))
    if missing:
        raise BigBenchSourceError(f"{sdist} lacks {missing[:3]}; expected the {SDIST} sdist")
    return found


def _format(sample: dict[str, Any], input_prefix: str, output_prefix: str,
            choice_prefix: str, append_choices: bool) -> dict[str, Any]:
    """BIG-bench's `default_format_fn`, zero-shot (same seed for every example, as there)."""
    rng = np.random.RandomState(seed=RANDOM_SEED)
    sample = dict(sample)
    scores = sample.get("target_scores")
    if scores is not None:
        if append_choices:
            permuted = rng.permutation(sorted(scores))
            sample["input"] = sample["input"] + choice_prefix + choice_prefix.join(permuted)
        if "target" not in sample:
            best = max(scores.values())
            if (len(scores) == 1 and best == 0) or (len(scores) > 1
                                                    and best <= min(scores.values())):
                raise BigBenchSourceError(f"BIG-bench example without a correct choice: "
                                          f"{sample['input'][:80]!r}")
            sample["target"] = next(k for k, v in scores.items() if v == best)
    sample["input"] = input_prefix + sample["input"] + output_prefix
    if not isinstance(sample["target"], list):
        sample["target"] = [sample["target"]]
    return sample


def bigbench_docs(task: dict[str, Any]) -> list[dict[str, Any]]:
    """`hails/bigbench` rows (zero-shot, "default" split) of one BIG-bench JSON (sub)task."""
    if not isinstance(task.get("examples"), list):
        raise BigBenchSourceError(f"BIG-bench task {task.get('name')!r} has no examples list")
    # JsonTask drops repeated examples (same JSON text), keeping the first.
    seen: set[str] = set()
    examples = []
    for ex in task["examples"]:
        key = json.dumps(ex)
        if key not in seen:
            seen.add(key)
            examples.append(ex)
    prefix = str(task.get("task_prefix", ""))
    rows = []
    for i, ex in enumerate(examples):
        s = _format(ex, task.get("example_input_prefix", DEFAULT_INPUT_PREFIX),
                    task.get("example_output_prefix", DEFAULT_OUTPUT_PREFIX),
                    task.get("choice_prefix", DEFAULT_CHOICE_PREFIX),
                    task.get("append_choices_to_input", True))
        scores = ex.get("target_scores") or {}
        # The HF script strips inputs, targets and choices (so "\nA: " ends as "\nA:").
        rows.append({"idx": i, "inputs": (prefix + s["input"]).strip(),
                     "targets": [t.strip() for t in s["target"]],
                     "multiple_choice_targets": [c.strip() for c in scores],
                     "multiple_choice_scores": [int(v) for v in scores.values()]})
    return rows
