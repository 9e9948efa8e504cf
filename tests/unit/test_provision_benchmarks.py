"""Benchmark provisioning when BIG-bench's sdist cannot be had (the registry withdrew
`bigbench==1.0.0` in December 2026): set-up goes on without multiemo and says so, and
asking for multiemo afterwards names the fix."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from qcal.eval.benchmarks import BIGBENCH, benchmarks
from qcal.eval.harness import TaskError, resolve_tasks
from qcal.provision import benchmarks as pb
from qcal.provision.bigbench_json import BigBenchSourceError

pytestmark = pytest.mark.unit


def _withdrawn(cache: Path) -> Path:
    raise BigBenchSourceError("pip download bigbench==1.0.0 failed (No matching "
                              f"distribution found); or put bigbench-1.0.0.tar.gz into {cache}")


def test_provision_skips_multiemo_when_its_sdist_is_unavailable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    multiemo = [b for b in benchmarks() if b.source == BIGBENCH]
    assert multiemo, "the benchmark list has no BIG-bench task to test with"
    monkeypatch.setenv("QCAL_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setattr(pb, "benchmarks", lambda: multiemo)
    monkeypatch.setattr(pb, "fetch_sdist", _withdrawn)

    pb.provision(force=False)  # must not raise: multiemo is optional

    tasks = tmp_path / "data" / "benchmarks" / "tasks"
    out = capsys.readouterr().out
    assert f"skipped {len(multiemo)} task(s)" in out and "No matching distribution" in out
    assert not list(tasks.glob("multiemo*.yaml"))  # neither the tasks nor their group
    assert (tasks / "manifest.json").read_text().strip() == "{}"
    readme = (tasks / "README.md").read_text()
    assert "multiemo is not provisioned here" in readme and "bigbench-1.0.0.tar.gz" in readme


def test_unknown_multiemo_task_names_the_missing_sdist() -> None:
    no_tasks = SimpleNamespace(all_tasks=[], task_index={})
    for name in ("multiemo_en", "multiemo"):  # a task and its group
        with pytest.raises(TaskError) as err:
            resolve_tasks([name], no_tasks)
        assert "bigbench-1.0.0.tar.gz" in str(err.value)
        assert "qcal provision --only benchmarks" in str(err.value)
    with pytest.raises(TaskError) as err:
        resolve_tasks(["no_such_task"], no_tasks)
    assert "bigbench" not in str(err.value) and "qcal provision" not in str(err.value)


@pytest.mark.parametrize("name", ["arc_easy", "mmlu_stem", "mmlu_anatomy", "lambada_openai"])
def test_any_unprovisioned_qcal_benchmark_says_how_to_provision(name: str) -> None:
    no_tasks = SimpleNamespace(all_tasks=[], task_index={})
    with pytest.raises(TaskError) as err:
        resolve_tasks([name, "no_such_task"], no_tasks)
    message = str(err.value)
    assert f"['{name}'] is a qcal benchmark not provisioned" in message
    assert "qcal provision --only benchmarks" in message
    assert "bigbench" not in message  # the sdist note is only for multiemo


def test_a_hand_placed_sdist_must_be_pypis(tmp_path: Path) -> None:
    from qcal.provision.bigbench_json import SDIST_FILE, fetch_sdist

    (tmp_path / SDIST_FILE).write_bytes(b"not the BIG-bench sdist")
    with pytest.raises(BigBenchSourceError, match="sha256 .*replace it with PyPI's"):
        fetch_sdist(tmp_path)
