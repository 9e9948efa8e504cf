"""Every `qcal report --study NAME` resolves to a render function, and the option's help
names every study; an unknown name is refused in one line naming the known ones."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

from qcal.cli import build_parser, main
from qcal.studies.report import STUDIES

pytestmark = pytest.mark.unit


def _study_help() -> str:
    report = build_parser()._subparsers._group_actions[0].choices["report"]  # noqa: SLF001
    return next(a.help for a in report._actions if a.dest == "study")  # noqa: SLF001


@pytest.mark.parametrize("name", sorted(STUDIES))
def test_study_resolves_and_is_named_in_the_help(name: str) -> None:
    module, _, function = STUDIES[name].partition(":")
    assert callable(getattr(importlib.import_module(module), function or "render"))
    assert name in _study_help()


def test_unknown_study_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", "--study", "nope"]) == 2
    assert "choose from" in capsys.readouterr().err


def test_a_benchmark_page_refuses_grids_and_a_missing_json(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    stem = tmp_path / "big_model"
    assert main(["report", "--study", "big-model", "--out", str(stem), str(tmp_path)]) == 2
    assert "reads no grid" in capsys.readouterr().err
    assert main(["report", "--study", "big-model", "--out", str(stem)]) == 2
    assert "run scripts/bench_big_model.py first" in capsys.readouterr().err
    row = {"shape": "1b", "step": "rtn", "exit": 0, "wall_s": 12.0, "peak_rss_gib": 1.2,
           "cpu_percent": "90%", "disk_written_gb": 1.0, "output_gb": 0.9, "load_before": 1.0,
           "load_after": 1.1, "started": "2026-12-06 01:00:00", "command": "qcal quantize ..."}
    stem.with_suffix(".json").write_text(json.dumps([row]))
    assert main(["report", "--study", "big-model", "--out", str(stem)]) == 0
    page = stem.with_suffix(".md").read_text()
    assert "| 1b | rtn | 0 | 12 |" in page and "Not measured yet" in page
