"""`qcal report GRID --study lambada-items` (qcal/studies/lambada_items.py): a cell
recorded before qcal kept LAMBADA's per-item results gets them from its score store,
checked against its recorded metrics, and a store that does not reproduce them writes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qcal.cli import main
from qcal.eval.benchmarks import benchmark_tasks_dir

pytestmark = pytest.mark.integration


def test_backfill_restores_items_from_the_score_store(tmp_path: Path, tiny_model_dir: Path,
                                                      capsys, monkeypatch) -> None:
    tasks_dir = benchmark_tasks_dir()
    if tasks_dir is None or not (tasks_dir / "lambada_openai.yaml").is_file():
        pytest.skip("benchmarks not provisioned (`qcal provision`, part of setup)")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from qcal.eval.harness import run_tasks, task_manager
    from qcal.eval.score_store import ScoreStore

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    grid, work = tmp_path / "results" / "g", tmp_path / "runs" / "compare" / "g"
    monkeypatch.setenv("QCAL_RUNS_DIR", str(tmp_path / "runs"))
    (grid / "cells").mkdir(parents=True)
    (grid / "grid.json").write_text(json.dumps({"spec": {"model": str(tiny_model_dir)}}))
    store = ScoreStore(work / "scores" / "float.jsonl", {"model": "tiny"})
    tasks = ["lambada_openai"]
    run = run_tasks(model, tok, tasks, task_manager(names=tasks), batch_size=4, limit=5,
                    score_store=store)
    store.flush()
    # A cell as recorded before: metrics, no per-item records.
    cell = {"cell": "float", "eval": {"lm_eval": {"tasks": tasks,
                                                   "results": {"model": run.metrics},
                                                   "info": run.info}}}
    (grid / "cells" / "float.json").write_text(json.dumps(cell))
    assert main(["report", str(grid), "--study", "lambada-items"]) == 0
    written = json.loads((grid / "cells" / "float.json").read_text())
    items = written["eval"]["lm_eval"]["continuation_items"]["lambada_openai"]
    assert items == run.continuations["lambada_openai"]
    assert written["eval"]["lm_eval"]["results"]["model"] == json.loads(json.dumps(run.metrics))

    # A store whose scores do not give the recorded metrics: the cell is not touched.
    del written["eval"]["lm_eval"]["continuation_items"]
    (grid / "cells" / "float.json").write_text(json.dumps(written))
    lines = (work / "scores" / "float.jsonl").read_text().splitlines()
    key, ll, greedy = json.loads(lines[1])
    lines[1] = json.dumps([key, ll - 1.0, greedy])
    (work / "scores" / "float.jsonl").write_text("\n".join(lines) + "\n")
    before = (grid / "cells" / "float.json").read_text()
    assert main(["report", str(grid), "--study", "lambada-items"]) == 2
    assert "not written" in capsys.readouterr().err
    assert (grid / "cells" / "float.json").read_text() == before
