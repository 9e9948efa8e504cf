"""JsonSteps: a benchmark's JSON step results in the StepCache, keyed by their setting."""

from __future__ import annotations

from pathlib import Path

import pytest

from qcal.cache import JsonSteps, StepCache

pytestmark = pytest.mark.unit


def test_steps_resume_redo_on_request_and_keep_settings_apart(tmp_path: Path) -> None:
    calls: list[str] = []

    def compute(value: object) -> object:
        calls.append(str(value))
        return value

    steps = JsonSteps(StepCache(tmp_path), "steps", {"seed": 0})
    assert steps.run("a/x", lambda: compute({"returncode": 1})) == {"returncode": 1}
    assert steps.run("b", lambda: compute([1, 2])) == [1, 2]
    assert steps.other_settings() == []

    again = JsonSteps(StepCache(tmp_path), "steps", {"seed": 0})  # a resumed run
    assert again.get("b") == [1, 2] and again.get("missing") is None
    failed = lambda saved: saved.get("returncode", 0) != 0  # noqa: E731
    assert again.run("a/x", lambda: compute({"returncode": 0}), failed) == {"returncode": 0}
    assert again.run("a/x", lambda: compute({"returncode": 9}), failed) == {"returncode": 0}
    assert list(again.results) == ["b", "a/x"]  # in the order the run asked for them
    assert len(calls) == 3

    other = JsonSteps(StepCache(tmp_path), "steps", {"seed": 1})
    assert other.get("b") is None
    assert {p.name.rsplit("-", 1)[0] for p in other.other_settings()} == {"a-x", "b"}
