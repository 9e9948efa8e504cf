"""lm-eval adapter: run tasks on an in-memory model and keep per-item log-likelihoods.

The model object qcal loaded (float, or with `QuantLinear`s from a qcal checkpoint) is
wrapped as lm-eval's `HFLM`, so the quantized kernels are what lm-eval scores. Tasks
come from lm-eval's registry plus qcal's packaged local tasks (and any `include_paths`).
Per-choice log-likelihoods are read back from lm-eval's own samples (`log_samples`), so
the confidence metrics describe exactly the predictions behind lm-eval's `acc`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from torch import nn

from qcal.errors import ConfigError, QcalError
from qcal.eval.benchmarks import unprovisioned_hint
from qcal.eval.local_tasks import local_task_names, read_items, tasks_dir
from qcal.run_config import task_limit_map

if TYPE_CHECKING:
    from qcal.eval.score_store import ScoreStore


class TaskError(QcalError, ValueError):
    """An lm-eval task is unknown or cannot be run."""


@dataclasses.dataclass
class ItemRecord:
    """One multiple-choice item as lm-eval scored it."""

    doc_id: int
    lls: list[float]  # per-choice log-likelihood of the continuation
    lengths: list[int]  # per-choice character length (lm-eval's acc_norm divisor)
    gold: int


@dataclasses.dataclass
class HarnessRun:
    metrics: dict[str, dict[str, Any]]  # lm-eval's results per task / group
    items: dict[str, list[ItemRecord]]  # multiple-choice tasks only
    info: dict[str, Any]  # lm-eval version, n-shot, task versions
    # Single-continuation tasks (LAMBADA): per item {"doc_id", "ll", "greedy"}, so that
    # accuracy (lm-eval's acc there is the greedy flag) can be compared item by item.
    continuations: dict[str, list[dict[str, Any]]] = dataclasses.field(default_factory=dict)


def offline_env() -> None:
    """The Hub is unreachable by design: make HF libraries fail fast instead of retrying."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


# lm-eval's YAML tag that imports a Python function from a file beside the task config.
CODE_TAG = "!function"
_MAX_SCANNED = 10_000  # task files read per --include-path folder before giving up


def _qcal_loader(yaml_path: Path, text: str) -> bool:
    """True when every `!function` of a task file names qcal's own JSONL loader, byte for
    byte the one `qcal.eval.local_tasks.write_task` puts beside the tasks it writes."""
    import re

    targets = re.findall(re.escape(CODE_TAG) + r"\s+([\w.]+)", text)
    own = (tasks_dir() / "loader.py").read_bytes()
    for target in targets:
        module = yaml_path.parent / (target.rsplit(".", 1)[0].replace(".", "/") + ".py")
        if not module.is_file():
            continue  # nothing there to run: the task's own checks say what is missing
        if target != "loader.load" or module.read_bytes() != own:
            return False
    return len(targets) == text.count(CODE_TAG)


def refuse_task_code(folder: Path) -> None:
    """A task folder whose YAMLs import Python (lm-eval's `!function`) runs that code when
    the tasks load: like a model's own code, only with --trust-remote-code. qcal's own
    JSONL loader (tasks written by `qcal.eval.local_tasks`) is the one exception."""
    for i, path in enumerate(sorted(folder.rglob("*.y*ml"))):
        if i >= _MAX_SCANNED:
            raise TaskError(f"--include-path {folder} holds more than {_MAX_SCANNED} task files; "
                            "point it at the folder of the tasks you run")
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError as err:
            raise TaskError(f"task file {path} cannot be read ({err.strerror})") from None
        if CODE_TAG in text and not _qcal_loader(path, text):
            raise TaskError(f"task file {path} imports Python ({CODE_TAG}), which runs when the "
                            "tasks load; pass --trust-remote-code if you trust that folder")


def task_manager(include_paths: Sequence[Path | str] = (), names: Sequence[str] = (),
                 trust_code: bool = False) -> Any:
    """lm-eval's TaskManager over qcal's local tasks, `include_paths` and lm-eval's own.
    A user's `include_paths` may import Python only with `trust_code`.

    Indexing lm-eval's ~15k bundled task configs takes seconds, so when every name in
    `names` is a local task the bundled ones are left out.
    """
    offline_env()
    from lm_eval.tasks import TaskManager

    from qcal.eval.benchmarks import benchmark_tasks_dir

    paths = [str(tasks_dir()), *(str(p) for p in include_paths)]
    for p in paths[1:]:
        if not Path(p).is_dir():
            raise TaskError(f"--include-path {p} is not a directory of lm-eval task YAMLs")
        if not trust_code:
            refuse_task_code(Path(p))
    provisioned = benchmark_tasks_dir()
    if provisioned is not None:  # arc_easy, hellaswag, mmlu, ... on local data
        paths.append(str(provisioned))
    if names:
        local = TaskManager(include_path=paths, include_defaults=False)
        if all(n.strip() in local.all_tasks for n in names if n.strip()):
            return local
    return TaskManager(include_path=paths)


def _local_names(include_paths: Sequence[Path | str]) -> list[str]:
    names = set(local_task_names())
    for p in include_paths:
        names.update(local_task_names(Path(p)))
    return sorted(names)


def _check_entry_data(name: str, cfg: dict[str, Any], tm: Any, seen: set[str]) -> None:
    """Fail early (before any model loads) on a local task whose item file is unusable."""
    if name in seen:
        return
    seen.add(name)
    for sub in cfg.get("task", []) if isinstance(cfg.get("task"), list) else []:
        if isinstance(sub, str) and sub in tm.task_index:
            _check_entry_data(sub, tm.task_index[sub].cfg or {}, tm, seen)
    kwargs = cfg.get("dataset_kwargs") or {}
    yaml_path = tm.task_index[name].yaml_path if name in tm.task_index else None
    if cfg.get("custom_dataset") and "file" in kwargs and yaml_path is not None:
        path = Path(kwargs["file"])
        read_items(path if path.is_absolute() else Path(yaml_path).parent / path)
    elif cfg.get("dataset_path") == "json":
        files = kwargs.get("data_files") or {}
        for f in files.values() if isinstance(files, dict) else [files]:
            for one in f if isinstance(f, list) else [f]:
                if not Path(one).is_file() or Path(one).stat().st_size == 0:
                    raise TaskError(f"task {name}: item file {one} is missing or empty; "
                                    "fix dataset_kwargs.data_files in its YAML")
    elif cfg.get("dataset_path") and not cfg.get("custom_dataset"):
        _check_hub_dataset_cached(name, str(cfg["dataset_path"]), cfg.get("dataset_name"))


# Generic loaders whose data comes from dataset_kwargs files, not from the Hub.
_FILE_BUILDERS = {"json", "csv", "text", "parquet", "arrow", "pandas"}


def _check_hub_dataset_cached(name: str, path: str, config_name: str | None) -> None:
    """A standard task's Hub dataset must already be in the local HF cache (offline here).

    Checked before any model loads, so a missing dataset costs seconds, not a model load.
    """
    if path in _FILE_BUILDERS or Path(path).exists():
        return
    from datasets import load_dataset_builder

    try:
        load_dataset_builder(path, config_name)
    except Exception as err:  # noqa: BLE001 - any failure means "not usable offline"
        raise TaskError(
            f"task {name} needs the Hub dataset {path!r}"
            + (f" ({config_name})" if config_name else "")
            + f", which is not in the local HF cache and the Hub is offline here "
            f"({type(err).__name__}). Use a local task (qcal eval --list-tasks) or copy the "
            "dataset into the HF datasets cache first"
        ) from None


def resolve_tasks(names: Sequence[str], tm: Any, include_paths: Sequence[Path | str] = ()
                  ) -> list[str]:
    """Check every name against lm-eval's index; unknown names list the local tasks."""
    names = [n.strip() for n in names if n.strip()]
    if not names:
        raise TaskError("--tasks is empty; name at least one task, e.g. qcal_nextsent_en")
    unknown = [n for n in names if n not in tm.all_tasks]
    if unknown:
        local = ", ".join(_local_names(include_paths)) or "none"
        hint = unprovisioned_hint(unknown)
        hint = f". {hint}" if hint else ""
        raise TaskError(
            f"unknown lm-eval task(s) {unknown}; local tasks (offline): {local}. Standard "
            "lm-eval names work too where their data is cached (list them with "
            f"`lm_eval ls tasks`); your own YAMLs need --include-path DIR{hint}"
        )
    seen: set[str] = set()
    for n in names:
        if n in tm.task_index:
            _check_entry_data(n, tm.task_index[n].cfg or {}, tm, seen)
    return names


def _choice_texts(sample: dict[str, Any], delimiter: str) -> list[str]:
    conts = [arg[1] for arg in sample["arguments"]]
    return [c[len(delimiter):] if delimiter and c.startswith(delimiter) else c for c in conts]


def _gold_index(target: Any, choices: list[str]) -> int:
    if isinstance(target, list):
        # Several correct answers: lm-eval's acc counts any; confidence uses the first.
        target = target[0]
    if isinstance(target, str):
        if target.strip().isdigit():
            return int(target)
        if target in choices:
            return choices.index(target)
        raise TaskError(f"gold answer {target!r} is not one of the choices {choices}")
    return int(target)


def _multiple_input(sample: dict[str, Any]) -> bool:
    """lm-eval's 'multiple input' items (WinoGrande): the choices are contexts and the
    continuation is the same for all, so the logged target names no choice."""
    args = sample["arguments"]
    return len(args) > 1 and len({a[1] for a in args}) == 1 and len({a[0] for a in args}) > 1


def extract_items(samples: list[dict[str, Any]], config: dict[str, Any]) -> list[ItemRecord]:
    """Per-item records from lm-eval's logged samples of one multiple-choice task. Each
    item's gold index is checked against lm-eval's own per-item accuracy, so confidence
    metrics never rest on a misread answer."""
    delimiter = config.get("target_delimiter", " ")
    name = config.get("task", "?")
    out = []
    for s in samples:
        choices = _choice_texts(s, delimiter)
        lls = [float(r[0]) for r in s["filtered_resps"]][: len(choices)]
        pred = int(np.argmax(lls))  # lm-eval's own prediction (first maximum)
        if _multiple_input(s):
            # lm-eval takes the gold index from doc_to_text, which the log does not keep;
            # its per-item acc says whether the prediction was it (unique with two choices).
            if "acc" not in s or (s["acc"] != 1.0 and len(lls) != 2):
                raise TaskError(f"task {name}: the gold answer of a multiple-input item with "
                                f"{len(lls)} choices cannot be read from lm-eval's log; leave "
                                "the task out of confidence metrics")
            gold = pred if s["acc"] == 1.0 else 1 - pred
        else:
            gold = _gold_index(s["target"], choices)
            if "acc" in s and not isinstance(s["target"], list) and \
                    (pred == gold) != (s["acc"] == 1.0):
                raise TaskError(f"task {name}: item {s['doc_id']}'s gold answer {gold} disagrees "
                                "with lm-eval's own accuracy for it; its confidence metrics "
                                "would be wrong (report this task config)")
        out.append(ItemRecord(int(s["doc_id"]), lls, [len(c) for c in choices], gold))
    return sorted(out, key=lambda r: r.doc_id)


def extract_continuations(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per-item records of a single-continuation ('loglikelihood') task from lm-eval's
    logged samples: the continuation's log-likelihood and whether every token of it was
    the model's greedy choice (lm-eval's per-item acc on LAMBADA)."""
    out = []
    for s in samples:
        ll, greedy = s["filtered_resps"][0]
        out.append({"doc_id": int(s["doc_id"]), "ll": float(ll), "greedy": bool(greedy)})
    return sorted(out, key=lambda r: r["doc_id"])


def vllm_lm(model_dir: Path | str, batch_size: int) -> Any:
    """lm-eval's vLLM backend on a checkpoint directory (GPU machines with vLLM installed)."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise TaskError("--backend vllm needs the vllm package, which is not installed here (it "
                        "needs a CUDA GPU): `pip install vllm` on a GPU machine, or use --backend hf")
    from lm_eval.models.vllm_causallms import VLLM

    return VLLM(pretrained=str(model_dir), batch_size=batch_size, trust_remote_code=False)


def run_tasks(
    model: nn.Module | Any, tokenizer: Any, tasks: Sequence[str], tm: Any, batch_size: int = 16,
    limit: int | None = None, num_fewshot: int | None = None, desc: str = "",
    share_contexts: bool = True, task_limits: Mapping[str, int] | None = None,
    score_store: ScoreStore | None = None,
) -> HarnessRun:
    """lm_eval.simple_evaluate on `model` (in memory, or an lm-eval LM such as `vllm_lm`);
    items kept per task. An in-memory model is scored by lm-eval's HFLM, with the choices of
    an item sharing one context pass unless `share_contexts` is off
    (`qcal.eval.shared_context`: the same requests and metrics, a fraction of the work).
    `task_limits` overrides `limit` per task: tasks are run in one lm-eval call per limit.
    `score_store` (`qcal.eval.score_store.ScoreStore`, shared-context scoring only) keeps
    every score as it is computed, so an interrupted run resumes."""
    offline_env()
    if share_contexts:
        from qcal.eval.shared_context import SharedContextHFLM as HFLM
    else:
        from lm_eval.models.huggingface import HFLM

    if desc:
        from qcal.logs import info

        info(f"lm-eval [{desc}]: {', '.join(tasks)}")
    if score_store is not None and not (share_contexts and isinstance(model, nn.Module)):
        raise ConfigError("a score store needs an in-memory model and shared-context scoring")
    extra = {"score_store": score_store} if score_store is not None else {}
    lm = model if not isinstance(model, nn.Module) else HFLM(
        pretrained=model, tokenizer=tokenizer, batch_size=batch_size,
        device=str(next(model.parameters()).device), **extra)
    limits = task_limit_map(tasks, limit, task_limits or {})
    items: dict[str, list[ItemRecord]] = {}
    continuations: dict[str, list[dict[str, Any]]] = {}
    metrics: dict[str, dict[str, Any]] = {}
    scorer = type(lm).__name__ + (" (qcal.eval.shared_context)"
                                  if type(lm).__name__ == "SharedContextHFLM" else "")
    info: dict[str, Any] = {"scorer": scorer, "limits": limits, "n_shot": {}, "versions": {},
                            "n_samples": {}, "group_subtasks": {}}
    for n in dict.fromkeys(limits.values()):  # one lm-eval call per limit, in task order
        out = _evaluate(lm, [t for t in tasks if limits[t] == n], tm, n, num_fewshot)
        for name, samples in out.get("samples", {}).items():
            cfg = out["configs"].get(name, {})
            if cfg.get("output_type") == "multiple_choice":
                if not samples:
                    raise TaskError(f"task {name} produced no items; check its item file and "
                                    "--limit")
                items[name] = extract_items(samples, cfg)
            elif cfg.get("output_type") == "loglikelihood" and samples:
                continuations[name] = extract_continuations(samples)
        metrics.update({
            name: {k: v for k, v in res.items() if k not in ("name", "alias") and v != "N/A"}
            for name, res in out["results"].items()})
        info["lm_eval_version"] = out.get("lm_eval_version")
        for key, field in (("n_shot", "n-shot"), ("versions", "versions"),
                           ("n_samples", "n-samples"), ("group_subtasks", "group_subtasks")):
            info[key].update(out.get(field) or {})
    return HarnessRun(metrics, items, info, continuations)


def _evaluate(lm: Any, tasks: list[str], tm: Any, limit: int | None,
              num_fewshot: int | None) -> dict[str, Any]:
    from lm_eval import simple_evaluate

    try:
        out = simple_evaluate(model=lm, tasks=tasks, task_manager=tm, limit=limit,
                              num_fewshot=num_fewshot, log_samples=True, bootstrap_iters=1000,
                              verbosity="ERROR")
    except QcalError:
        raise
    except (KeyError, ValueError, OSError) as err:  # OSError covers ConnectionError
        raise TaskError(f"lm-eval could not run {tasks}: {err}. A standard task needs its "
                        "dataset in the local HF cache (the Hub is offline here); the local "
                        "tasks (qcal eval --list-tasks) need no network") from None
    if out is None:
        raise TaskError("lm-eval returned no results (non-zero rank?); run in a single process")
    return out
