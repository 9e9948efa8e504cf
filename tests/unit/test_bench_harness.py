"""The benchmark harness (qcal.studies.bench) and the peer benchmark's tables: cached steps
resume, failed subprocess steps run again, another setting is refused; the committed peer
tables and the other benchmark tables render again from their JSON byte for byte."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from qcal.cli import main
from qcal.studies.bench import Steps, timed

pytestmark = pytest.mark.unit

RESULTS = Path(__file__).resolve().parents[2] / "results"


def test_steps_resume_redo_failures_and_refuse_another_setting(tmp_path: Path) -> None:
    calls: list[str] = []

    def compute(name: str, returncode: int = 0):  # noqa: ANN202
        return lambda: calls.append(name) or {"returncode": returncode, "name": name}

    steps = Steps(tmp_path / "work", {"n": 1})
    steps.run("ok", compute("ok"))
    steps.run("bad", compute("bad", 1))
    again = Steps(tmp_path / "work", {"n": 1})
    assert again.run("ok", compute("ok")) == {"returncode": 0, "name": "ok"}
    again.run("bad", compute("bad"))
    assert calls == ["ok", "bad", "bad"]  # the finished step came from the cache
    limited = Steps(tmp_path / "work", {"n": 1}, only=["ok"])
    assert limited.run("other/x", compute("other")) is None and calls[-1] == "bad"
    with pytest.raises(SystemExit, match="other settings"):
        Steps(tmp_path / "work", {"n": 2})
    assert Steps(tmp_path / "work", {"n": 2}, fresh=True).get("ok") is None


def test_timed_reports_exit_code_and_peak_rss() -> None:
    if not Path("/usr/bin/time").is_file():
        pytest.skip("GNU time is not installed")
    run = timed(["python3", "-c", "import sys; sys.exit(3)"])
    assert run["returncode"] == 3 and run["max_rss_mib"] > 0 and len(run["load_before"]) == 3


@pytest.mark.parametrize(("study", "stem"), [("peers", "peers"), ("gptq-vs-peer", "gptq_vs_peer")])
def test_peer_tables_render_again_from_their_json(study: str, stem: str, tmp_path: Path) -> None:
    shutil.copy(RESULTS / f"{stem}.json", tmp_path / f"{stem}.json")
    assert main(["report", "--study", study, "--out", str(tmp_path / stem)]) == 0
    assert (tmp_path / f"{stem}.md").read_bytes() == (RESULTS / f"{stem}.md").read_bytes()


def test_peer_table_without_its_json_is_refused(tmp_path: Path) -> None:
    assert main(["report", "--study", "peers", "--out", str(tmp_path / "peers")]) == 2
    assert not (tmp_path / "peers.md").exists()


@pytest.mark.parametrize(("study", "stem"), [("kernels", "kernels"), ("window-nll", "window_nll"),
                                             ("shared-context", "shared_context"),
                                             ("selection-cost", "selection_cost"),
                                             ("scaling", "scaling"), ("selectors", "selectors"),
                                             ("interop", "interop")])
def test_benchmark_tables_render_again_from_their_json(study: str, stem: str,
                                                       tmp_path: Path) -> None:
    shutil.copy(RESULTS / f"{stem}.json", tmp_path / f"{stem}.json")
    assert main(["report", "--study", study, "--out", str(tmp_path / stem)]) == 0
    # A JSON list was a tuple when selectors.md was first written: provenance only.
    def lines(path: Path) -> list[str]:
        return [x for x in path.read_text().splitlines() if not x.startswith("- Load average:")]

    assert lines(tmp_path / f"{stem}.md") == lines(RESULTS / f"{stem}.md")
    assert (tmp_path / f"{stem}.json").read_bytes() == (RESULTS / f"{stem}.json").read_bytes()
