"""`qcal report --study reliability` writes the committed table from the cases and outcomes
the committed JSON recorded (the suite itself is not rerun here), byte for byte apart from
the date and machine of the rendering; it refuses grid folders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qcal.cli import main
from qcal.studies.reliability import write_table

pytestmark = pytest.mark.unit

RESULTS = Path(__file__).resolve().parents[2] / "results"


def _without_rendering_moment(text: str) -> list[str]:
    return [line for line in text.splitlines()
            if not line.startswith(("- Date:", "- Machine:"))]


def test_table_from_the_recorded_suite_equals_the_committed_one(tmp_path: Path) -> None:
    recorded = json.loads((RESULTS / "reliability.json").read_text())
    write_table(recorded["cases"], recorded["tests"], tmp_path / "reliability")
    rendered = json.loads((tmp_path / "reliability.json").read_text())
    assert rendered["summary"] == recorded["summary"]
    assert (_without_rendering_moment((tmp_path / "reliability.md").read_text())
            == _without_rendering_moment((RESULTS / "reliability.md").read_text()))


def test_the_study_reads_no_grid(tmp_path: Path) -> None:
    assert main(["report", "--study", "reliability", str(tmp_path),
                 "--out", str(tmp_path / "rel")]) == 2
    assert not (tmp_path / "rel.md").exists()
