"""A signal that stops qcal stops every process it started (issue 52: after SIGTERM, the
workers of `--nproc 2` went on and wrote the checkpoint). The launcher's child leads its own
process group; SIGTERM to qcal reaches the whole group, grandchildren included."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from cli_cases import Cli

pytestmark = pytest.mark.integration

DRIVER = textwrap.dedent("""
    import sys
    from qcal.cli import sigterm_as_interrupt
    from qcal.processes import Terminated, run_process_group
    child = ("import subprocess, sys, time; "
             "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']); "
             "open(sys.argv[1], 'w').write(str(g.pid)); time.sleep(300)")
    try:
        with sigterm_as_interrupt():
            run_process_group([sys.executable, "-c", child, sys.argv[1]], grace=20)
    except Terminated:
        sys.exit(143)
""")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_sigterm_stops_the_launched_group_grandchildren_included(cli: Cli, tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, str(pid_file)])
    deadline = time.monotonic() + 60
    while not (pid_file.is_file() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    grandchild = int(pid_file.read_text())
    assert _alive(grandchild)
    driver.send_signal(signal.SIGTERM)
    assert driver.wait(timeout=30) == 143
    deadline = time.monotonic() + 10
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = _alive(grandchild)
    if alive:
        os.kill(grandchild, signal.SIGKILL)
    assert not alive, "a grandchild of qcal outlived SIGTERM"
    cli.record("SIGTERM while --nproc's torchrun runs (its workers went on and wrote the "
               "checkpoint)", ("quantize", "--nproc", "2", "..."), 143,
               "terminated; the launched process group, grandchildren included, stopped too")
