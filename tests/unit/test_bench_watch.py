"""The benchmark harness's watched runs stop their command, not only themselves."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import psutil
import pytest

from qcal.studies import bench

pytestmark = pytest.mark.unit

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def _sleepers() -> list[psutil.Process]:
    """The running commands (a reaped or zombie one has stopped)."""
    alive = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and p.cmdline() == SLEEPER:
                alive.append(p)
        except psutil.Error:
            pass
    return alive


def test_a_passed_deadline_stops_the_command(tmp_path: Path) -> None:
    run = bench.watched(SLEEPER, tmp_path / "log", deadline=time.time() - 1)
    assert run["stopped"] == "stopped (time limit)"
    assert not _sleepers()


def test_an_interrupted_driver_stops_its_command(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int] = []
    real_sleep = time.sleep

    def interrupted_sleep(seconds: float) -> None:
        if seen or not _sleepers():  # wait until the command runs, then "press Ctrl-C" once
            real_sleep(min(seconds, 0.05))
            return
        seen.append(len(_sleepers()))
        raise KeyboardInterrupt

    monkeypatch.setattr(bench.time, "sleep", interrupted_sleep)
    with pytest.raises(KeyboardInterrupt):
        bench.watched(SLEEPER, tmp_path / "log")
    assert seen == [1]
    assert not _sleepers()  # the command went with the driver
