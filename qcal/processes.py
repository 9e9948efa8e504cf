"""Child processes that stop with qcal: a signal that stops qcal reaches all of them.

`subprocess.run` answers an interrupt by SIGKILL-ing its direct child only: a torchrun
launcher killed that way cannot stop its workers, which went on and wrote the checkpoint
after qcal had said "terminated" (issue 52). Here the child leads a process group of its
own; an interrupt or SIGTERM in qcal is passed to the whole group as the same signal
(torchrun forwards it, each qcal worker keeps its resumable state), and the group is
killed only if it has not stopped after a grace period.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Sequence

GRACE_SECONDS = 30.0


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process was so it unwinds like Ctrl-C (temp files removed,
    work state kept for --resume)."""


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # the group has already exited
        os.killpg(pgid, sig)


def run_process_group(cmd: Sequence[str], grace: float = GRACE_SECONDS) -> int:
    """Run `cmd` in its own process group and return its exit code; a KeyboardInterrupt
    (Ctrl-C, or SIGTERM turned into one by qcal's CLI) stops the whole group, then re-raises."""
    proc = subprocess.Popen(list(cmd), start_new_session=True)
    try:
        return proc.wait()
    except BaseException as stop:
        _signal_group(proc.pid, signal.SIGTERM if isinstance(stop, Terminated)
                      else signal.SIGINT)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
        raise
