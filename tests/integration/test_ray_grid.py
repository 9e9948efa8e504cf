"""The comparison grid on a local Ray cluster (2 CPUs, tiny model, 4 cells): the same cells
as the local executor, and a worker killed mid-grid is retried to completion."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qcal.grid import GridRunner, GridSpec
from qcal.model.tiny import stdlib_text

ray = pytest.importorskip("ray", reason="the optional extra qcal[ray] is not installed")
pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    yield
    ray.shutdown()


def _spec(model: Path, tmp: Path) -> GridSpec:
    text = tmp / "text.txt"
    text.write_text("\n\n".join(stdlib_text()[:120]), encoding="utf-8")
    return GridSpec(name="ray", model=str(model), selectors=("random", "zipf"),
                    methods=("rtn", "gptq"), group_size=32, source=str(text), nsamples=4,
                    seqlen=32, eval_seqlen=32, max_windows=2, eval_text_file=str(text))


def test_ray_executor_matches_local_and_survives_a_killed_worker(
        cluster, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from qcal.grid.ray_executor import KILL_ONCE_ENV

    spec = _spec(tiny_model_dir, tmp_path)
    local = GridRunner(spec, tmp_path / "local", tmp_path / "wl", progress=False).run()
    flag = tmp_path / "killed-once"
    monkeypatch.setenv(KILL_ONCE_ENV, str(flag))  # the first task's worker dies
    ray.shutdown()  # restart so workers inherit the fault-injection variable
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False,
             runtime_env={"env_vars": {KILL_ONCE_ENV: str(flag)}})
    on_ray = GridRunner(spec, tmp_path / "ray", tmp_path / "wr", progress=False,
                        executor="ray").run()
    assert flag.exists(), "no worker was killed: the recovery path did not run"
    assert sorted(on_ray) == sorted(local) == ["float", "none__rtn", "random__gptq", "zipf__gptq"]
    for key in local:
        a, b = local[key]["eval"]["perplexity"]["model"], on_ray[key]["eval"]["perplexity"]["model"]
        assert a["file"]["ppl"] == pytest.approx(b["file"]["ppl"], rel=1e-5), key
    again = GridRunner(spec, tmp_path / "ray", tmp_path / "wr", progress=False, executor="ray")
    assert again.pending() == []
    json.loads((tmp_path / "ray" / "cells" / "zipf__gptq.json").read_text())
