"""`qcal report --study baseline|gptq|awq` renders the committed method grids into the
committed tables, byte for byte apart from the date and machine of the rendering."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from qcal.cli import main
from qcal.studies.method_tables import GRIDS

pytestmark = pytest.mark.unit

RESULTS = Path(__file__).resolve().parents[2] / "results"


def _without_rendering_moment(text: str) -> list[str]:
    return [line for line in text.splitlines()
            if not line.startswith(("- Date:", "- Machine:"))]


@pytest.mark.parametrize("name", ["baseline", "gptq"])
def test_study_renders_the_committed_table(name: str, tmp_path: Path) -> None:
    out = tmp_path / name
    # The timed CLI process is no grid's: the report keeps the one its earlier JSON holds.
    shutil.copy(RESULTS / f"{name}.json", out.with_suffix(".json"))
    assert main(["report", "--study", name, str(RESULTS / GRIDS[name]),
                 "--out", str(out)]) == 0
    rendered = out.with_suffix(".md").read_text()
    committed = (RESULTS / f"{name}.md").read_text()
    assert _without_rendering_moment(rendered) == _without_rendering_moment(committed)


def test_study_refuses_a_folder_without_a_grid(tmp_path: Path) -> None:
    assert main(["report", "--study", "awq", str(tmp_path)]) == 2
    assert not (tmp_path / "awq.md").exists()
