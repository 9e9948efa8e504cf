"""`qcal report --study architectures`: the committed table renders again from its JSON byte
for byte, and the study refuses grid folders before checking any family."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qcal.cli import main
from qcal.studies.architectures import render

pytestmark = pytest.mark.unit

RESULTS = Path(__file__).resolve().parents[2] / "results"


def test_committed_table_renders_from_its_json() -> None:
    data = json.loads((RESULTS / "architectures.json").read_text())
    assert data["meta"]["command"] == "qcal report --study architectures"
    assert render(data["families"], data["rows"], data["meta"]) == (
        RESULTS / "architectures.md").read_text()


def test_the_study_reads_no_grid(tmp_path: Path) -> None:
    assert main(["report", "--study", "architectures", str(tmp_path),
                 "--out", str(tmp_path / "arch")]) == 2
    assert not (tmp_path / "arch.md").exists()
