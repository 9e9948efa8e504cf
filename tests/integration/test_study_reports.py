"""`qcal report --study NAME` renders from real grid folders and refuses bad ones in one line."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from qcal.grid.runner import GridRunner
from qcal.grid.spec import GridSpec
from qcal.model.tiny import stdlib_text

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def _report(name: str, *args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "qcal", "report", "--study", name,
                           *map(str, args)], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)


@pytest.mark.parametrize(("name", "grid", "family"), [
    ("zipcal", "study_zipcal", "selector pairs, multiple comparisons"),
    ("multilingual", "study_multilingual", "gptq, multiple comparisons"),
])
def test_committed_study_grids_render_with_holm(name: str, grid: str, family: str,
                                                tmp_path: Path) -> None:
    if not (ROOT / "results" / grid / "cells").is_dir():
        pytest.skip(f"results/{grid} is not in this checkout")
    done = _report(name, ROOT / "results" / grid, "--out", tmp_path / name)
    assert done.returncode == 0, done.stderr
    md = (tmp_path / f"{name}.md").read_text()
    assert "p (Holm)" in md and family in md
    chart = tmp_path / f"{name}_{grid}.png"  # the interval chart, linked by its bare name
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"]({chart.name})" in md
    data = json.loads((tmp_path / f"{name}.json").read_text())
    # The command names the grid inside the repository and the output outside it as is.
    command = f"qcal report results/{grid} --study {name} --out {tmp_path / name}"
    assert data["provenance"]["command"] == command


@pytest.mark.parametrize("name", ["zipcal", "multilingual", "confidence"])
def test_a_folder_without_a_grid_is_one_line_and_exit_2(name: str, tmp_path: Path) -> None:
    args = [tmp_path / "nothing"]
    args += ["--bench-grid", tmp_path / "nothing"] if name == "confidence" else []
    done = _report(name, *args)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("qcal report: error: ")
    assert "nothing" in done.stderr and "qcal compare" in done.stderr
    assert not list(tmp_path.iterdir())  # nothing written


def test_confidence_and_benchmark_tables_from_a_tiny_grid(tiny_model_dir: Path,
                                                          tmp_path: Path) -> None:
    docs = stdlib_text()
    calib, evaluation = tmp_path / "calib.txt", tmp_path / "eval.txt"
    calib.write_text("\n\n".join(docs[:120]))
    evaluation.write_text("\n\n".join(docs[120:160]))
    spec = GridSpec(name="tiny", model=str(tiny_model_dir), selectors=("random",),
                    methods=("rtn", "gptq"), group_size=32, source=str(calib), nsamples=4,
                    seqlen=32, eval_seqlen=32, max_windows=2, eval_text_file=str(evaluation),
                    tasks=("qcal_nextsent_en",), confidence=True, limit=12, seed=(0, 1))
    GridRunner(spec, tmp_path / "grid", tmp_path / "work", progress=False).run()
    done = _report("confidence", tmp_path / "grid", "--bench-grid", tmp_path / "grid",
                   "--out", tmp_path / "conf", "--out-benchmarks", tmp_path / "bench")
    assert done.returncode == 0, done.stderr
    conf = (tmp_path / "conf.md").read_text()
    assert "| p (Holm) |" in conf and "| qcal_nextsent_en | gptq | 2 | 12 |" in conf
    assert "task x model gold-answer confidence changes" in conf
    assert "| claim (p) | claim (log-odds) |" in conf and "| Δlog-odds |" in conf
    for report, chart in (("conf", "conf_grid.png"), ("bench", "bench_grid.png")):
        assert (tmp_path / chart).read_bytes()[:4] == b"\x89PNG"
        assert f"]({chart})" in (tmp_path / f"{report}.md").read_text()
    bench = (tmp_path / "bench.md").read_text()
    assert "| qcal_nextsent_en | float | 1 | 12 |" in bench
    assert "| qcal_nextsent_en | gptq | 2 | 12 |" in bench
    # GPTQ against RTN on the same 12 items (no AWQ cells: its pairs are left out)
    assert "### Methods against each other" in bench and "| qcal_nextsent_en | gptq - rtn |" in bench
    assert "awq - " not in bench and "- **gptq vs rtn** over 1 tasks" in bench
    pairs = json.loads((tmp_path / "bench.json").read_text())["grids"]["grid"]["method_pairs"]
    assert [(p["a"], p["b"], p["test"]["units"]) for p in pairs] == [("gptq", "rtn", 12)]
    data = json.loads((tmp_path / "conf.json").read_text())
    drift = data["grids"]["grid"]["tasks"]["qcal_nextsent_en"]["gptq"]["drift"]
    assert drift["seeds"] == 2 and "p_holm" in drift["conf_true_test"]

    # A benchmark grid of the same model that leaves the task to the confidence grid: the
    # table takes it from there (named in its grid column), scored once.
    shutil.copytree(tmp_path / "grid", tmp_path / "bench_grid")
    grid_file = tmp_path / "bench_grid" / "grid.json"
    saved = json.loads(grid_file.read_text())
    saved["spec"].update(tasks=[], confidence=False)
    grid_file.write_text(json.dumps(saved))
    done = _report("confidence", tmp_path / "grid", "--bench-grid",
                   tmp_path / "bench_grid", "--out", tmp_path / "conf2",
                   "--out-benchmarks", tmp_path / "bench2")
    assert done.returncode == 0, done.stderr
    bench = (tmp_path / "bench2.md").read_text()
    assert "| qcal_nextsent_en | gptq | 2 | 12 |" in bench and "| grid |\n" in bench
    assert "Tasks only the confidence grid runs come from" in bench

    # A second model whose benchmark grid has no cells yet: its confidence grid stands in,
    # so the model still has its section in the benchmark report.
    shutil.copytree(tmp_path / "grid", tmp_path / "other_model")
    grid_file = tmp_path / "other_model" / "grid.json"
    saved = json.loads(grid_file.read_text())
    saved["spec"]["model"] = "another-model"
    grid_file.write_text(json.dumps(saved))
    done = _report("confidence", tmp_path / "grid", tmp_path / "other_model",
                   "--bench-grid", tmp_path / "bench_grid", "--out",
                   tmp_path / "conf3", "--out-benchmarks", tmp_path / "bench3")
    assert done.returncode == 0, done.stderr
    bench = (tmp_path / "bench3.md").read_text()
    assert bench.count("### Findings") == 2 and "| other_model |" in bench
    assert "(`" in bench and "other_model`)" in bench

    # A second benchmark grid of the same model re-ran the task with more draws: the
    # model keeps one section, headed by its first grid, and the task comes from the second.
    shutil.copytree(tmp_path / "grid", tmp_path / "seeded")
    done = _report("confidence", tmp_path / "grid", "--bench-grid", tmp_path / "grid",
                   "--bench-grid", tmp_path / "seeded", "--out", tmp_path / "conf4",
                   "--out-benchmarks", tmp_path / "bench4")
    assert done.returncode == 0, done.stderr
    bench = (tmp_path / "bench4.md").read_text()
    assert bench.count("### Findings") == 1 and "(`" in bench and "grid`)" in bench
    assert "seeded` instead, which re-ran it with calibration seeds 0, 1 (" in bench
    rows = [line for line in bench.splitlines() if line.startswith("| qcal_nextsent_en |")]
    assert rows and all(line.endswith("| seeded |") for line in rows)
    # An unfinished supplement is left out, and says so, rather than replace whole rows.
    next(iter((tmp_path / "seeded" / "cells").glob("*gptq*.json"))).unlink()
    done = _report("confidence", tmp_path / "grid", "--bench-grid", tmp_path / "grid",
                   "--bench-grid", tmp_path / "seeded", "--out", tmp_path / "conf4",
                   "--out-benchmarks", tmp_path / "bench4")
    assert done.returncode == 0, done.stderr
    bench = (tmp_path / "bench4.md").read_text()
    assert "seeded` (re-runs qcal_nextsent_en with calibration seeds 0, 1) is left out" in bench
    rows = [line for line in bench.splitlines() if line.startswith("| qcal_nextsent_en |")]
    assert rows and all(line.endswith("| grid |") for line in rows)

    # Re-rendered from the other benchmark grid, the report links that grid's chart and
    # removes the one of the grid it no longer shows; the confidence chart stays.
    done = _report("confidence", tmp_path / "grid", "--bench-grid",
                   tmp_path / "bench_grid", "--out", tmp_path / "conf",
                   "--out-benchmarks", tmp_path / "bench")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "bench_bench_grid.png").is_file() and (tmp_path / "conf_grid.png").is_file()
    assert not (tmp_path / "bench_grid.png").exists()


def test_report_refuses_an_unknown_study_and_misplaced_options(tmp_path: Path, capsys) -> None:
    from qcal.cli import main

    for argv, says in ((["--study", "nope"], "choose from zipcal, multilingual"),
                       ([], "needs a grid folder"),
                       ([str(tmp_path), "--out", str(tmp_path / "x")], "go with --study"),
                       (["--study", "zipcal", "--bench-grid", str(tmp_path)], "not zipcal"),
                       (["--study", "selection", "--out", str(tmp_path / "x")], "drop --out"),
                       (["--study", "selection", str(tmp_path)], "grids named")):
        assert main(["report", *argv]) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("qcal report: error: ") and says in err, err
    assert not list(tmp_path.iterdir())  # nothing written
