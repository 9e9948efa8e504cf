"""Outputs guarded to the end (issue 52): a destination that changes while qcal writes is
left alone with the result kept beside it, and no output may land inside an input folder."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from cli_cases import Cli

from qcal.errors import ConfigError
from qcal.fsio import write_dir_atomically

pytestmark = pytest.mark.integration


def test_a_folder_made_during_the_write_is_left_untouched(tmp_path: Path) -> None:
    out = tmp_path / "ckpt"

    def fill_while_the_user_makes_the_folder(tmp: Path) -> None:
        (tmp / "model.safetensors").write_bytes(b"result")
        out.mkdir()
        (out / "notes.txt").write_text("the user's own file")

    with pytest.raises(ConfigError, match=r"appeared while qcal was writing .* is in .*ckpt\.qcal-new"):
        write_dir_atomically(out, fill_while_the_user_makes_the_folder, "checkpoint")
    assert (out / "notes.txt").read_text() == "the user's own file"
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    assert (tmp_path / "ckpt.qcal-new" / "model.safetensors").read_bytes() == b"result"


@pytest.mark.parametrize("meanwhile", ["nothing", "empty folder", "qcal output"])
def test_what_may_be_replaced_still_is(tmp_path: Path, meanwhile: str) -> None:
    out = tmp_path / "ckpt"
    if meanwhile == "qcal output":  # an earlier qcal result, replaced as --overwrite allowed
        write_dir_atomically(out, lambda tmp: (tmp / "old").write_text("old"), "checkpoint")

    def fill(tmp: Path) -> None:
        (tmp / "new").write_text("new")
        if meanwhile == "empty folder":
            out.mkdir()

    write_dir_atomically(out, fill, "checkpoint")
    assert (out / "new").read_text() == "new" and not (out / "old").exists()
    assert not (tmp_path / "ckpt.qcal-new").exists()


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}


def test_outputs_inside_the_model_folder_are_refused(cli: Cli, home: Path) -> None:
    model = home / "mymodel"
    before = _digests(model)
    cli.refused("eval", "--model", model, "--ppl", "--text", home / "calib.txt", "-o",
                model / "config", "--overwrite", match="lies inside the input folder",
                case="eval -o MODEL/config --overwrite")
    cli.refused("eval", "--model", model, "--ppl", "--text", home / "calib.txt", "-o",
                model / "results", match="lies inside the input folder",
                case="eval -o MODEL/results")
    cli.refused("quantize", "--model", model, "--method", "rtn", "--group-size", "32", "-o",
                model / "q4", match="lies inside the input folder", case="quantize -o MODEL/q4")
    assert _digests(model) == before


def test_task_folders_that_import_python_need_the_opt_in(cli: Cli, home: Path,
                                                         tmp_path: Path) -> None:
    """lm-eval's `!function` imports Python from the task folder when the tasks load."""
    tasks = tmp_path / "tasks"
    (tasks / "sub").mkdir(parents=True)
    (tasks / "sub" / "evil.yaml").write_text("task: evil\ncustom_dataset: !function hooks.load\n")
    (tasks / "sub" / "hooks.py").write_text("raise SystemExit('the hook ran')\n")
    cli.refused("eval", "--model", home / "mymodel", "--tasks", "evil", "--include-path", tasks,
                match="imports Python (!function)", case="eval --include-path with !function")
    from qcal.eval.harness import refuse_task_code

    (tasks / "sub" / "evil.yaml").write_text("task: plain\n")
    refuse_task_code(tasks)  # a folder of plain task YAMLs passes


def test_qcal_written_tasks_load_without_the_opt_in_but_not_once_edited(tmp_path: Path) -> None:
    from qcal.errors import QcalError
    from qcal.eval.harness import refuse_task_code
    from qcal.eval.local_tasks import write_task

    items = [{"context": "a b", "choices": ["c", "d"], "gold": 0, "id": "x/0"}]
    write_task(tmp_path, "mine", items, "en")
    refuse_task_code(tmp_path)  # qcal's own loader, byte for byte
    loader = tmp_path / "loader.py"
    loader.write_text(loader.read_text() + "\nimport os  # edited\n")
    with pytest.raises(QcalError, match="imports Python"):
        refuse_task_code(tmp_path)


@pytest.fixture()
def grid_run(cli: Cli, home: Path, tmp_path: Path) -> Path:
    """A finished one-method grid of the tiny model (float + RTN), rendered once."""
    (home / "eval.txt").write_text((home / "calib.txt").read_text())
    rc, err = cli("compare", "--name", "g", "--model", home / "mymodel", "--methods", "rtn",
                  "--selectors", "random", "--group-size", "32", "--eval-seqlen", "32",
                  "--max-windows", "1", "--results-dir", tmp_path / "res")
    assert rc == 0, err
    return tmp_path / "res" / "g"


def test_report_keeps_a_report_the_user_wrote(cli: Cli, grid_run: Path) -> None:
    (grid_run / "report.md").write_text("# my own notes on this grid\n")
    cli.refused("report", grid_run, match="report.md exists and qcal did not write it",
                case="qcal report over a report.md the user wrote (replaced it)")
    assert (grid_run / "report.md").read_text() == "# my own notes on this grid\n"


@pytest.mark.parametrize("value", [float("nan"), -3.0, 0.5])
def test_report_refuses_a_perplexity_no_model_has(cli: Cli, grid_run: Path, value: float) -> None:
    import json

    cell = next(p for p in (grid_run / "cells").glob("*.json") if "rtn" in p.name)
    data = json.loads(cell.read_text())
    for res in data["eval"]["perplexity"]["model"].values():
        res["ppl"] = value
    cell.write_text(json.dumps(data))
    before = (grid_run / "report.md").read_text()
    cli.refused("report", grid_run, match=f"holds perplexity {value!r}",
                case=f"qcal report on a cell whose perplexity is {value} (rendered as a finding)",
                pattern="2. Values that were never checked")
    assert (grid_run / "report.md").read_text() == before
