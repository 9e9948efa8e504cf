"""Fixtures the integration suites share: the bad-input suites (test_bad_input_*.py) and the
comparison-grid tests (test_compare_grid.py, test_grid_spec.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from cli_cases import Cli
from grid_cases import write_grid_texts

from qcal.model.tiny import stdlib_text


@pytest.fixture()
def cli(capsys: pytest.CaptureFixture, request: pytest.FixtureRequest) -> Cli:
    return Cli(capsys, request)


@pytest.fixture()
def home(tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user's folder: /x/mymodel (a copy of the tiny model), /x/notes.txt, calib text."""
    x = tmp_path / "x"
    shutil.copytree(tiny_model_dir, x / "mymodel")
    (x / "notes.txt").write_text("the user's own file\n")
    (x / "calib.txt").write_text("\n\n".join(stdlib_text()[:60]), encoding="utf-8")
    monkeypatch.setenv("QCAL_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("QCAL_RESULTS_DIR", str(tmp_path / "results"))
    monkeypatch.setenv("QCAL_CALIB_DIR", str(tmp_path / "calib_sets"))
    monkeypatch.chdir(tmp_path)
    return x


@pytest.fixture(scope="module")
def texts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The tiny grid's calibration and evaluation texts (grid_cases.spec_for)."""
    return write_grid_texts(tmp_path_factory.mktemp("grid-text"))
