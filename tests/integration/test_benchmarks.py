"""The offline benchmarks are lm-eval's own tasks: for the same documents, qcal's task
builds exactly the requests (context, continuation) that lm-eval's own YAML builds."""

from __future__ import annotations

import pytest

from qcal.eval.benchmarks import benchmark_tasks_dir, benchmarks, lm_eval_tasks_dir

pytestmark = pytest.mark.integration
TASKS = ["arc_easy", "arc_challenge", "hellaswag", "piqa", "winogrande", "openbookqa", "sciq",
         "copa", "boolq", "mmlu_abstract_algebra", "mmlu_world_religions"]
N_DOCS = 12


@pytest.fixture(scope="module")
def provisioned():
    tasks = benchmark_tasks_dir()
    if tasks is None:
        pytest.skip("benchmarks not provisioned (`qcal provision`, part of setup)")
    return tasks


def _requests(task) -> list[tuple]:
    task.build_all_requests(limit=N_DOCS, rank=0, world_size=1)
    return [tuple(inst.arguments) for inst in task.instances]


@pytest.mark.parametrize("name", TASKS)
def test_requests_equal_lm_evals_own_task(provisioned, name: str) -> None:
    import datasets
    from lm_eval.api.task import ConfigurableTask
    from lm_eval.tasks import TaskManager
    from lm_eval.tasks._yaml_loader import load_yaml

    task = TaskManager(include_path=[str(provisioned)], include_defaults=False).load([name])
    task = task["tasks"][name] if isinstance(task, dict) and "tasks" in task else task[name]
    split = task.config.test_split or task.config.validation_split
    docs = datasets.Dataset.from_list([dict(d) for d in task.dataset[split]])
    # lm-eval's own YAML, loaded by lm-eval's own loader, fed the same documents.
    bench = {b.task: b for b in benchmarks()}[name]
    own = load_yaml(lm_eval_tasks_dir() / bench.lm_eval_yaml)
    own["custom_dataset"] = lambda **_: datasets.DatasetDict(
        {s: docs for s in ("train", "validation", "test", "dev")})
    theirs = ConfigurableTask(config=own)
    assert len(_requests(task)) >= N_DOCS
    assert _requests(task) == _requests(theirs)
