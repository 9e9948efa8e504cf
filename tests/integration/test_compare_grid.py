"""The comparison grid on the tiny model: completes, caches, resumes after a kill."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from grid_cases import spec_for

from qcal.cli import main
from qcal.errors import ConfigError
from qcal.grid import GridRunner, plan_cells
from qcal.grid import runner as compare
from qcal.grid.report import render_report
from qcal.studies.tables import dropped_tasks_text

pytestmark = pytest.mark.integration


def test_grid_runs_caches_and_resumes_after_interrupt(tiny_model_dir: Path, texts,
                                                      tmp_path: Path, monkeypatch) -> None:
    spec = spec_for(tiny_model_dir, texts)
    results, work = tmp_path / "results", tmp_path / "work"

    original = GridRunner.run_cell
    calls: list[str] = []

    def dying(self, cell):
        if cell.key == "random__gptq":
            raise KeyboardInterrupt  # killed mid-grid
        calls.append(cell.key)
        return original(self, cell)

    monkeypatch.setattr(GridRunner, "run_cell", dying)
    with pytest.raises(KeyboardInterrupt):
        GridRunner(spec, results, work, progress=False).run()
    finished = sorted(p.stem for p in (results / "cells").glob("*.json"))
    assert finished == ["float", "none__rtn"]
    for p in (results / "cells").glob("*.json"):
        json.loads(p.read_text())  # nothing half-written
    assert not list(results.rglob(".*.tmp-*"))

    monkeypatch.setattr(GridRunner, "run_cell", original)
    cells = GridRunner(spec, results, work, progress=False).run()
    assert sorted(cells) == ["float", "none__rtn", "random__gptq", "zipf__gptq"]
    for key, rec in cells.items():
        ppl = rec["eval"]["perplexity"]["model"]["file"]
        assert ppl["tokens"] == 2 * 31, key
    assert cells["random__gptq"]["calibration"]["selector"] != \
        cells["zipf__gptq"]["calibration"]["selector"]

    # a finished grid recomputes nothing
    def forbidden(*a, **k):
        raise AssertionError("a finished cell was recomputed")

    monkeypatch.setattr(GridRunner, "run_cell", forbidden)
    GridRunner(spec, results, work, progress=False).run()

    # ... unless the cell's recipe changed since (other method settings or code): a cell
    # recorded under another recipe key is computed again; one without a key is kept.
    cell_file = results / "cells" / "zipf__gptq.json"
    record = json.loads(cell_file.read_text())
    assert len(record["recipe_key"]) == 64
    runner = GridRunner(spec, results, work, progress=False)
    assert runner.pending() == []
    cell_file.write_text(json.dumps({**record, "recipe_key": "0" * 64}))
    assert [c.key for c in runner.pending()] == ["zipf__gptq"]
    cell_file.write_text(json.dumps({k: v for k, v in record.items() if k != "recipe_key"}))
    assert runner.pending() == []
    cell_file.write_text(json.dumps(record))

    report = render_report(results)
    assert set(report["perplexity"]) == set(cells)
    assert (results / "report.md").is_file() and (results / "heatmap_gptq.png").is_file()
    md = (results / "report.md").read_text()
    assert "zipf__gptq" in md and "Perplexity change vs float" in md


def test_changed_grid_in_same_dir_is_refused(tiny_model_dir: Path, texts, tmp_path: Path,
                                             monkeypatch) -> None:
    monkeypatch.setattr(GridRunner, "run_cell", lambda self, cell: {"cell": cell.key})
    GridRunner(spec_for(tiny_model_dir, texts, methods=("rtn",)), tmp_path / "r",
               tmp_path / "w", progress=False).run()
    with pytest.raises(ConfigError, match="different grid"):
        GridRunner(spec_for(tiny_model_dir, texts, seed=3, methods=("rtn",)), tmp_path / "r",
                   tmp_path / "w", progress=False).run()


def test_dropping_tasks_keeps_finished_cells_and_reports_say_so(
        tiny_model_dir: Path, texts, tmp_path: Path, monkeypatch,
        capsys: pytest.CaptureFixture) -> None:
    # A task whose data can no longer be had is dropped; the finished cells stay valid.
    monkeypatch.setattr(GridRunner, "run_cell", lambda self, cell: {"cell": cell.key})
    results, work = tmp_path / "r", tmp_path / "w"
    both = ("qcal_nextsent_en", "qcal_nextsent_de")
    limits = {"qcal_nextsent_en": 5, "qcal_nextsent_de": 4}
    GridRunner(spec_for(tiny_model_dir, texts, methods=("rtn",), tasks=both,
                        task_limits=limits), results, work, progress=False).run()
    rtn_before = (results / "cells" / "none__rtn.json").read_text()
    narrow = spec_for(tiny_model_dir, texts, methods=("rtn",), tasks=both[:1],
                      task_limits={"qcal_nextsent_en": 5})
    capsys.readouterr()
    assert GridRunner(narrow, results, work, progress=False).pending() == []
    GridRunner(narrow, results, work, progress=False).run()
    assert "tasks qcal_nextsent_de dropped" in capsys.readouterr().err
    saved = json.loads((results / "grid.json").read_text())
    assert saved["spec"]["tasks"] == ["qcal_nextsent_en"]
    assert saved["dropped_tasks"] == [{"tasks": ["qcal_nextsent_de"], "cells_finished": 2}]
    assert (results / "cells" / "none__rtn.json").read_text() == rtn_before
    assert "qcal_nextsent_de were dropped from this grid after 2 cell(s)" in \
        dropped_tasks_text(results)
    # Adding a task back, or changing a kept task's limit, is another grid.
    for changed in (dict(tasks=both, task_limits=limits),
                    dict(tasks=both[:1], task_limits={"qcal_nextsent_en": 6})):
        with pytest.raises(ConfigError, match="different grid"):
            GridRunner(spec_for(tiny_model_dir, texts, methods=("rtn",), **changed), results,
                       work, progress=False).run()
    assert dropped_tasks_text(tmp_path) == ""


def test_finished_grid_reruns_where_its_task_data_is_gone(tiny_model_dir: Path, texts,
                                                          tmp_path: Path, monkeypatch) -> None:
    from qcal.eval import harness

    monkeypatch.setattr(GridRunner, "run_cell", lambda self, cell: {"cell": cell.key})
    spec = spec_for(tiny_model_dir, texts, methods=("rtn",), tasks=("qcal_nextsent_en",))
    results, work = tmp_path / "r", tmp_path / "w"
    GridRunner(spec, results, work, progress=False).run()

    def not_here(names, manager):  # what a machine without the task's source says
        raise ConfigError(f"{list(names)} is a qcal benchmark not provisioned in this data folder")

    monkeypatch.setattr(harness, "resolve_tasks", not_here)
    assert sorted(GridRunner(spec, results, work, progress=False).run()) == ["float", "none__rtn"]
    (results / "cells" / "none__rtn.json").unlink()  # a cell to run needs the data again
    with pytest.raises(ConfigError, match="not provisioned"):
        GridRunner(spec, results, work, progress=False).run()


def test_a_method_added_to_a_finished_grid_runs_only_its_cells(tiny_model_dir: Path, texts,
                                                               tmp_path: Path, monkeypatch,
                                                               capsys) -> None:
    ran: list[str] = []
    monkeypatch.setattr(GridRunner, "run_cell",
                        lambda self, cell: ran.append(cell.key) or {"cell": cell.key})
    results, work = tmp_path / "r", tmp_path / "w"
    GridRunner(spec_for(tiny_model_dir, texts, methods=("rtn",)), results, work,
               progress=False).run()
    assert ran == ["float", "none__rtn"]
    GridRunner(spec_for(tiny_model_dir, texts, methods=("rtn", "rtn-mse"),
                        method_options={"rtn-mse": {"mse_grid": 20}}), results, work,
               progress=False).run()
    assert ran[2:] == ["none__rtn-mse"] and "methods rtn-mse added" in capsys.readouterr().err
    assert json.loads((results / "grid.json").read_text())["spec"]["methods"] == ["rtn", "rtn-mse"]
    for changed in (dict(methods=("rtn-mse",)), dict(methods=("rtn", "rtn-mse", "gptq"), seed=1)):
        with pytest.raises(ConfigError, match="different grid"):  # a method dropped, or more
            GridRunner(spec_for(tiny_model_dir, texts, **changed), results, work,
                       progress=False).run()


def test_selector_options_change_recipes_not_cell_keys(tiny_model_dir: Path, texts,
                                                      tmp_path: Path) -> None:
    base = dict(methods=("gptq",), nsamples=2)
    first = GridRunner(spec_for(tiny_model_dir, texts, **base), tmp_path / "r", tmp_path / "w",
                       progress=False)
    first.run()
    random_file = first.cells_dir / "random__gptq.json"
    random_before = random_file.read_text()
    spec = spec_for(tiny_model_dir, texts, selector_options={"zipf": {"pool_size": 1}}, **base)
    assert [c.key for c in plan_cells(spec)] == [c.key for c in plan_cells(first.spec)]
    assert spec.calib_config("zipf").selector == "zipf:pool_size=1"
    assert spec.calib_config("random").selector == "random"
    again = GridRunner(spec, tmp_path / "r", tmp_path / "w", progress=False)
    assert [c.key for c in again.pending()] == ["zipf__gptq"]
    again.run()  # the same directory takes the new options and reruns only their cells
    cells = compare.load_cells(first.results_root)
    assert cells["zipf__gptq"]["calibration"]["params"]["pool_size"] == 1
    assert cells["zipf__gptq"]["recipe_key"] == again.recipe_key(plan_cells(spec)[-1])
    assert random_file.read_text() == random_before
    with pytest.raises(ConfigError, match="not in selectors"):
        spec_for(tiny_model_dir, texts, selector_options={"perplexity": {"max_candidates": 4}})
    with pytest.raises(ConfigError, match="must be an integer"):
        spec_for(tiny_model_dir, texts, selector_options={"zipf": {"pool_size": "all"}})


def test_cli_compare_with_config_file(tiny_model_dir: Path, texts, tmp_path: Path,
                                      monkeypatch) -> None:
    monkeypatch.setenv("QCAL_RUNS_DIR", str(tmp_path / "runs"))
    cfg = tmp_path / "grid.yaml"
    cfg.write_text(
        f"name: cli\nmodel: {tiny_model_dir}\nselectors: [random]\nmethods: [rtn]\n"
        f"group_size: 32\nsource: {texts[0]}\nnsamples: 4\nseqlen: 32\neval_seqlen: 32\n"
        f"max_windows: 1\neval_text_file: {texts[1]}\n"
    )
    assert main(["compare", "--config", str(cfg), "--results-dir", str(tmp_path / "res")]) == 0
    assert (tmp_path / "res" / "cli" / "report.md").is_file()
    assert main(["report", str(tmp_path / "res" / "cli")]) == 0
    assert compare.load_cells(tmp_path / "res" / "cli").keys() == {"float", "none__rtn"}


def test_discard_checkpoints_deletes_each_recorded_cells_checkpoint(
        tiny_model_dir: Path, texts, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("QCAL_RUNS_DIR", str(tmp_path / "runs"))
    cfg = tmp_path / "grid.yaml"
    cfg.write_text(
        f"name: lean\nmodel: {tiny_model_dir}\nselectors: [random]\nmethods: [rtn, gptq]\n"
        f"group_size: 32\nsource: {texts[0]}\nnsamples: 4\nseqlen: 32\neval_seqlen: 32\n"
        f"max_windows: 1\neval_text_file: {texts[1]}\n")
    ckpt = tmp_path / "runs" / "compare" / "lean" / "ckpt"
    args = ["compare", "--config", str(cfg), "--results-dir", str(tmp_path / "res")]
    assert main(args) == 0
    assert sorted(p.name for p in ckpt.iterdir()) == ["none__rtn", "random__gptq"]
    (tmp_path / "res" / "lean" / "cells" / "none__rtn.json").unlink()
    assert main([*args, "--discard-checkpoints"]) == 0  # the rerun cell's goes after it
    assert sorted(p.name for p in ckpt.iterdir()) == ["random__gptq"]
    assert compare.load_cells(tmp_path / "res" / "lean").keys() == {
        "float", "none__rtn", "random__gptq"}


def test_parallel_jobs_match_sequential_cells(tiny_model_dir: Path, texts, tmp_path: Path) -> None:
    spec = spec_for(tiny_model_dir, texts, selectors=("random",))
    seq = GridRunner(spec, tmp_path / "seq", tmp_path / "w1", progress=False).run()
    par = GridRunner(spec, tmp_path / "par", tmp_path / "w2", progress=False, jobs=2).run()
    assert sorted(par) == sorted(seq) == ["float", "none__rtn", "random__gptq"]
    for key in seq:
        a = seq[key]["eval"]["perplexity"]["model"]["file"]["ppl"]
        b = par[key]["eval"]["perplexity"]["model"]["file"]["ppl"]
        assert b == pytest.approx(a, rel=1e-3), key
    assert par["random__gptq"]["calibration"]["digest"] == seq["random__gptq"]["calibration"]["digest"]


def test_jobs_must_be_positive(tiny_model_dir: Path, texts, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--jobs"):
        GridRunner(spec_for(tiny_model_dir, texts), tmp_path, tmp_path, jobs=0)


def test_grid_with_task_and_calibration_reports_drift(tiny_model_dir: Path, texts,
                                                      tmp_path: Path,
                                                      capsys: pytest.CaptureFixture) -> None:
    spec = spec_for(tiny_model_dir, texts, methods=("rtn",), tasks=("qcal_nextsent_en",),
                    confidence=True, limit=6)
    cells = GridRunner(spec, tmp_path / "r", tmp_path / "w", progress=False).run()
    assert sorted(cells) == ["float", "none__rtn"]
    assert len(cells["none__rtn"]["items"]["qcal_nextsent_en"]) == 6
    # Each cell's scores stay on disk: a withdrawn float cell, rerun, scores nothing again.
    assert sorted(p.name for p in (tmp_path / "w" / "scores").iterdir()) == [
        "float.jsonl", "none__rtn.jsonl"]
    (tmp_path / "r" / "cells" / "float.json").unlink()
    capsys.readouterr()
    again = GridRunner(spec, tmp_path / "r", tmp_path / "w", progress=False).run()
    assert "24 of 24 requests already scored" in capsys.readouterr().err
    assert again["float"]["items"] == cells["float"]["items"]
    report = render_report(tmp_path / "r")
    md = (tmp_path / "r" / "report.md").read_text()
    assert (tmp_path / "r" / "drift.png").is_file()
    assert "| ece |" in md and "| d_conf_true |" in md
    assert report["perplexity"].keys() == {"float", "none__rtn"}


def test_second_runner_on_the_same_grid_is_refused(tiny_model_dir: Path, texts,
                                                   tmp_path: Path) -> None:
    import fcntl

    spec = spec_for(tiny_model_dir, texts, methods=("rtn",))
    (tmp_path / "r").mkdir()
    with open(tmp_path / "r" / ".lock", "a+") as held:  # as a running `qcal compare` holds it
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(ConfigError, match="another `qcal compare` is running"):
            GridRunner(spec, tmp_path / "r", tmp_path / "w", progress=False).run()
        fcntl.flock(held, fcntl.LOCK_UN)
    assert not (tmp_path / "r" / "cells").exists()


def test_sigkill_mid_grid_then_restart_keeps_finished_cells(tiny_model_dir: Path, texts,
                                                            tmp_path: Path) -> None:
    """A real `kill -9` of `qcal compare` while it works on a cell, then a restart."""
    import os
    import signal
    import subprocess
    import time

    from qcal.cli import command_prefix

    cfg = tmp_path / "grid.yaml"
    cfg.write_text(
        f"name: killed\nmodel: {tiny_model_dir}\nselectors: [random, zipf]\n"
        f"methods: [rtn, gptq]\ngroup_size: 32\nsource: {texts[0]}\nnsamples: 4\nseqlen: 32\n"
        f"eval_seqlen: 32\nmax_windows: 2\neval_text_file: {texts[1]}\n")
    cmd = [*command_prefix(), "compare", "--config", str(cfg), "--results-dir", str(tmp_path / "res")]
    env = {**os.environ, "QCAL_RUNS_DIR": str(tmp_path / "runs")}
    cells_dir = tmp_path / "res" / "killed" / "cells"

    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while not (cells_dir / "none__rtn.json").exists():  # the GPTQ cells come next
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.monotonic() < deadline, "grid made no progress"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stderr.close()

    before = {p.name: p.read_bytes() for p in cells_dir.glob("*.json")}
    assert {"float.json", "none__rtn.json"} <= set(before)
    assert len(before) < 4, "the grid finished before the kill; nothing was interrupted"
    for blob in before.values():
        json.loads(blob)  # every cell on disk is whole

    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    after = sorted(p.name for p in cells_dir.glob("*.json"))
    assert after == ["float.json", "none__rtn.json", "random__gptq.json", "zipf__gptq.json"]
    for name, blob in before.items():
        assert (cells_dir / name).read_bytes() == blob, f"{name} was recomputed"
    assert not list((tmp_path / "res").rglob(".*qcal-tmp-*"))


def test_grid_over_seeds_and_models_runs_and_resumes(tiny_model_dir: Path, texts,
                                                     tmp_path: Path) -> None:
    import shutil as sh

    other = tmp_path / "tiny-copy"
    sh.copytree(tiny_model_dir, other)
    spec = dataclasses.replace(
        spec_for(tiny_model_dir, texts, seed=(0, 1), selectors=("random",), methods=("rtn", "gptq")),
        model=(str(tiny_model_dir), str(other)))
    cells = GridRunner(spec, tmp_path / "r", tmp_path / "w", progress=False).run()
    m1, m2 = f"m-{tiny_model_dir.name}", "m-tiny-copy"
    assert set(cells) == {f"float__{m1}", f"float__{m2}", f"none__rtn__{m1}", f"none__rtn__{m2}",
                          *(f"random__gptq__{m}__s{s}" for m in (m1, m2) for s in (0, 1))}
    assert cells[f"random__gptq__{m2}__s1"]["float_cell"] == f"float__{m2}"
    digests = {cells[f"random__gptq__{m1}__s{s}"]["calibration"]["digest"] for s in (0, 1)}
    assert len(digests) == 2  # independent calibration draws
    render_report(tmp_path / "r")
    again = GridRunner(spec, tmp_path / "r", tmp_path / "w", progress=False)
    assert again.pending() == []


def test_shards_split_the_grid_and_run_side_by_side(tiny_model_dir: Path, texts,
                                                    tmp_path: Path) -> None:
    """Two shard processes at once on one results folder (as a SLURM array runs them)."""
    import os
    import subprocess

    from qcal.cli import command_prefix

    cfg = tmp_path / "grid.yaml"
    cfg.write_text(
        f"name: sharded\nmodel: {tiny_model_dir}\nselectors: [random, zipf]\n"
        f"methods: [rtn, gptq]\ngroup_size: 32\nsource: {texts[0]}\nnsamples: 4\nseqlen: 32\n"
        f"eval_seqlen: 32\nmax_windows: 2\neval_text_file: {texts[1]}\n")
    env = {**os.environ, "QCAL_RUNS_DIR": str(tmp_path / "runs")}
    procs = [subprocess.Popen([*command_prefix(), "compare", "--config", str(cfg), "--shard",
                               f"{i}/2", "--results-dir", str(tmp_path / "res")], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    for proc in procs:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err
    cells = sorted(p.stem for p in (tmp_path / "res" / "sharded" / "cells").glob("*.json"))
    assert cells == ["float", "none__rtn", "random__gptq", "zipf__gptq"]
    spec = spec_for(tiny_model_dir, texts)
    halves = [GridRunner(spec, tmp_path, tmp_path, shard=(i, 2)).mine() for i in range(2)]
    assert sorted(c.key for h in halves for c in h) == sorted(cells) and all(halves)
    with pytest.raises(ConfigError, match="out of range"):
        GridRunner(spec, tmp_path, tmp_path, shard=(2, 2))


def test_report_has_seed_intervals_and_paired_tests(tiny_model_dir: Path, texts,
                                                    tmp_path: Path) -> None:
    spec = spec_for(tiny_model_dir, texts, seed=(0, 1), methods=("gptq",), max_windows=6)
    GridRunner(spec, tmp_path / "r", tmp_path / "w", progress=False).run()
    data = render_report(tmp_path / "r")
    intervals = data["evidence"]["seed_intervals"]
    assert {(r["selector"], r["n"]) for r in intervals} == {("random", 2), ("zipf", 2)}
    tests = data["evidence"]["selector_tests"]
    assert len(tests) == 2 and {t["a"] for t in tests} == {"zipf"}  # one per seed
    pooled = tests[0]["pooled"]
    # 6 windows are too few for a test: the effect is reported, without p or interval.
    assert pooled["units"] == 6 and pooled["p"] is None and pooled["ci_low"] is None
    assert "only 6 paired windows" in pooled["no_test"] and not pooled["significant"]
    md = (tmp_path / "r" / "report.md").read_text()
    assert "Paired tests: each selector vs random" in md and "95% CI" in md
    assert "untested (no p-value: only 6 paired windows" in md and "better (p=" not in md


