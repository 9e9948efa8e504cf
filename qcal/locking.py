"""Advisory locks between qcal processes (py-filelock's, an OS lock on a file)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from filelock import FileLock, Timeout

from qcal.errors import ConfigError


@contextlib.contextmanager
def exclusive_lock(lock_file: Path | str, busy_message: str = "", wait: bool = False
                   ) -> Iterator[None]:
    """Hold an advisory lock on `lock_file` (created if needed). A second holder gets
    ConfigError(busy_message), or with `wait` blocks until the first is done. The lock is
    the OS's (flock), so it dies with the process and a kill never leaves it behind."""
    lock_file = Path(lock_file)
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(lock_file), timeout=-1 if wait else 0, thread_local=False)
    try:
        lock.acquire()
    except Timeout:
        raise ConfigError(busy_message) from None
    try:
        yield
    finally:
        lock.release()
