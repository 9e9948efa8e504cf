"""`qcal calib diagnose` and the leakage rule of `qcal compare` on the tiny model: a set
drawn from the evaluation text is flagged (and such a grid cell refused unless the grid
allows it), a disjoint set is not; the model report covers the sampled layers with finite
statistics; bad options stop before anything is written."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
from grid_cases import spec_for, write_grid_texts

from qcal.cli import main
from qcal.errors import ConfigError
from qcal.grid import GridRunner, plan_cells

pytestmark = pytest.mark.integration


@pytest.fixture()
def texts(tmp_path: Path) -> tuple[Path, Path]:
    return write_grid_texts(tmp_path)


def test_diagnose_reports_text_model_and_no_leakage(tiny_model_dir: Path, tmp_path: Path,
                                                    texts: tuple[Path, Path]) -> None:
    stem = tmp_path / "diag"
    assert main(["calib", "diagnose", str(texts[0]), "--model", str(tiny_model_dir),
                 "--nsamples", "6", "--seqlen", "32", "--target", str(texts[1]),
                 "--target-windows", "4", "--layers", "0,last", "--bits", "4",
                 "--group-size", "32", "--device", "cpu", "-o", str(stem)]) == 0
    data = json.loads(stem.with_suffix(".json").read_text())
    assert data["text"]["windows"] == 6 and data["text"]["exact_duplicate_windows"] == 0
    assert data["leakage"]["flagged"] == []
    (target, rep), = data["targets"].items()
    assert sorted(rep["layers"]) == ["0", "1"]
    for per in rep["layers"].values():
        for stats in per.values():
            assert math.isfinite(stats["predicted_damage"]) and stats["predicted_damage"] > 0
            assert 0 <= stats["eigenspace_overlap"] <= 1 + 1e-9
    assert "Predicted damage" in stem.with_suffix(".md").read_text()
    assert len(data["plots"]) == 3
    assert all((tmp_path / name).read_bytes()[:4] == b"\x89PNG" for name in data["plots"])


def test_a_set_from_the_evaluation_split_is_flagged(tiny_model_dir: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from qcal.data.corpus import eval_text

    leaky = tmp_path / "leaky.txt"
    leaky.write_text(eval_text("en"))  # the held-out chapters themselves
    stem = tmp_path / "leak"
    assert main(["calib", "diagnose", str(leaky), "--model", str(tiny_model_dir), "--nsamples",
                 "8", "--seqlen", "64", "--no-model", "-o", str(stem)]) == 0
    data = json.loads(stem.with_suffix(".json").read_text())
    assert "debian-handbook/eval/en" in data["leakage"]["flagged"]
    assert "LEAKAGE" in capsys.readouterr().out
    assert "contains evaluation data" in stem.with_suffix(".md").read_text()


def test_compare_refuses_a_leaking_cell_unless_allowed(tiny_model_dir: Path, tmp_path: Path,
                                                       texts: tuple[Path, Path]) -> None:
    # Calibrate on the evaluation text, in windows long enough to hold 13-word runs.
    spec = spec_for(tiny_model_dir, (texts[1], texts[1]), methods=("gptq",),
                    selectors=("random",), seqlen=128)
    with pytest.raises(ConfigError, match="contains evaluation data.*allow_leakage"):
        GridRunner(spec, tmp_path / "res", tmp_path / "work", progress=False).run()
    assert not list((tmp_path / "res").glob("cells/*.json"))  # refused before any cell
    allowed = dataclasses.replace(spec, allow_leakage=True)
    GridRunner(allowed, tmp_path / "res1", tmp_path / "work1", progress=False).check_leakage(
        plan_cells(allowed))  # told otherwise: no refusal
    # Text no evaluation split holds (the stdlib docs repeat their docstrings across modules).
    own = tmp_path / "own.txt"
    own.write_text("\n\n".join(" ".join(f"token{(i * 7 + j) % 997}" for j in range(400))
                                for i in range(40)))
    clean = spec_for(tiny_model_dir, (own, texts[1]), methods=("gptq",), selectors=("random",),
                     seqlen=128)
    GridRunner(clean, tmp_path / "res2", tmp_path / "work2", progress=False).check_leakage(
        plan_cells(clean))


def test_bad_options_stop_before_any_file(tiny_model_dir: Path, tmp_path: Path,
                                          texts: tuple[Path, Path],
                                          capsys: pytest.CaptureFixture[str]) -> None:
    stem = tmp_path / "never"
    assert main(["calib", "diagnose", str(texts[0]), "--model", str(tiny_model_dir),
                 "--target-windows", "0", "-o", str(stem)]) == 2
    assert main(["calib", "diagnose", str(texts[0]), "--model", str(tiny_model_dir),
                 "--nsamples", "4", "--seqlen", "32", "--layers", "7", "-o", str(stem)]) == 2
    err = capsys.readouterr().err
    assert "--target-windows" in err and "--layers '7'" in err
    assert not stem.with_suffix(".json").exists()
