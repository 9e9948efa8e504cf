"""How a grid's pending cells get computed: executors are peers behind one small interface.

An executor receives the cells to compute, a `CellWork` (computes one cell's record; it
pickles, so worker processes and Ray tasks can take it) and a `record` callback that
writes a finished cell. Only the driver calls `record`, so the cell files stay the single
source of truth whoever computed them. This module holds the in-process executor and the
worker-process pool, `qcal.grid.ray_executor` the Ray tasks.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Any, Protocol

from qcal.grid.spec import Cell

RecordCell = Callable[[Cell, dict[str, Any]], None]


class CellWork(Protocol):
    """One cell's computation, shipped to a worker (it must pickle)."""

    device: str

    def finished(self, cell: Cell) -> dict[str, Any] | None:
        """The cell's saved record if it is current (another worker finished it), else None."""
        ...

    def __call__(self, cell: Cell, threads: int) -> dict[str, Any]:
        """Compute the cell's record with `threads` CPU threads."""
        ...


def run_here(todo: list[Cell], run_cell: Callable[[Cell], dict[str, Any]], record: RecordCell,
             bar: Any, done: Callable[[Cell], bool]) -> None:
    """Compute `todo` in this process, one cell after another, skipping the cells `done`
    already (finished by another executor's workers)."""
    for cell in todo:
        if done(cell):
            continue
        bar.set_postfix_str(cell.key)
        record(cell, run_cell(cell))
        bar.update(1)


def run_in_processes(todo: list[Cell], work: CellWork, record: RecordCell, bar: Any,
                     jobs: int) -> None:
    """Compute `todo` in `jobs` spawned worker processes, each with its share of the CPU
    threads, and `record` each cell as it finishes."""
    threads = max(1, (os.cpu_count() or 1) // jobs)
    ctx = multiprocessing.get_context("spawn")  # no forked torch thread pools
    with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
        running = {pool.submit(work, cell, threads): cell for cell in todo}
        try:
            while running:
                bar.set_postfix_str(",".join(sorted(c.key for c in running.values())))
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    cell = running.pop(future)
                    record(cell, future.result())  # a worker's error surfaces here
                    bar.update(1)
        except BaseException:
            # Leaving the block would wait for the running cells to finish: a SIGTERM to
            # the grid must stop its workers too (finished cells are cached; a stopped one
            # runs again on resume).
            for proc in list(getattr(pool, "_processes", {}).values()):
                proc.terminate()
            pool.shutdown(wait=False, cancel_futures=True)
            raise
