"""`qcal compare --executor ray`: each pending cell is a Ray task.

The cell files stay the single source of truth: only the driver writes them (atomically),
a task whose cell file already exists returns it instead of recomputing, and a task
whose worker dies is retried by Ray (`max_retries`); resumable checkpoints and the
waiting lock on shared calibration sets make a retry cheap and safe. On a GPU cluster a
task asks for one GPU, elsewhere for one CPU. Ray is an optional extra
(`pip install qcal[ray]`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from qcal.errors import ConfigError
from qcal.grid.executors import CellWork, RecordCell
from qcal.grid.spec import Cell

MAX_RETRIES = 2
# Fault injection for the recovery test: the first task to see this file missing creates
# it and kills its own worker process, as a lost node would.
KILL_ONCE_ENV = "QCAL_RAY_KILL_FIRST_WORKER"


def _ray_cell(work: CellWork, cell: Cell, threads: int) -> dict[str, Any]:
    """Runs in a Ray worker: the cell's record (read back if another worker finished it)."""
    finished = work.finished(cell)
    if finished is not None:
        return finished
    flag = os.environ.get(KILL_ONCE_ENV)
    if flag and not Path(flag).exists():
        Path(flag).write_text(str(os.getpid()))
        os._exit(1)
    return work(cell, threads)


def run_on_ray(todo: list[Cell], work: CellWork, record: RecordCell, bar: Any,
               address: str | None = None) -> None:
    """Run `todo` as Ray tasks and `record` each finished cell (the driver writes them all;
    `record` skips a cell another driver finished meanwhile)."""
    try:
        import ray
    except ImportError:
        raise ConfigError("--executor ray needs Ray: `pip install qcal[ray]` (or use the default "
                          "--executor local)") from None
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address=address, include_dashboard=False, logging_level="ERROR",
                 log_to_driver=False)
    try:
        on_gpu = work.device.startswith("cuda")
        cpus = int(ray.available_resources().get("CPU", 1)) or 1
        threads = 1 if on_gpu else max(1, (os.cpu_count() or 1) // max(1, min(cpus, len(todo))))
        remote = ray.remote(_ray_cell).options(max_retries=MAX_RETRIES, retry_exceptions=False,
                                               num_gpus=1 if on_gpu else 0, num_cpus=1)
        refs = {remote.remote(work, cell, threads): cell for cell in todo}
        try:
            while refs:
                ready, _ = ray.wait(list(refs), num_returns=1)
                cell = refs.pop(ready[0])
                record(cell, ray.get(ready[0]))  # a task's error surfaces here
                bar.update(1)
        except BaseException:
            # A cluster joined with --address keeps running tasks its driver left: stop them.
            for ref in refs:
                ray.cancel(ref, force=True)
            raise
    finally:
        if started_here:
            ray.shutdown()
