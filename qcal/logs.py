"""Where qcal's library messages go: the `qcal` logger, never print.

Library code logs through `logging.getLogger("qcal")` (`info` for progress such as
per-layer losses). A program that imports qcal decides what to show; the command line
shows info messages on stderr (`to_stderr`), so stdout stays the command's result.
"""

from __future__ import annotations

import logging
import sys

LOGGER_NAME = "qcal"


def info(message: str) -> None:
    """The default `RunOptions.log`: one info record on the qcal logger."""
    logging.getLogger(LOGGER_NAME).info(message)


class _CurrentStderr(logging.StreamHandler):
    """Writes to whatever sys.stderr is at the time (pytest and callers swap it)."""

    @property  # type: ignore[override]
    def stream(self):  # noqa: ANN201
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:  # noqa: ANN001
        pass


def to_stderr(level: int = logging.INFO) -> None:
    """Show qcal's messages on stderr (the CLI's choice); idempotent."""
    logger = logging.getLogger(LOGGER_NAME)
    if not any(isinstance(h, _CurrentStderr) for h in logger.handlers):
        handler = _CurrentStderr()
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    logger.setLevel(level)
