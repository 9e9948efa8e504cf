"""Fixtures of the integration tests' bad-input suites (test_bad_input_*.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from cli_cases import Cli

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
