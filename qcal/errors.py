"""User-facing error types.

Every error raised for bad input derives from `QcalError`, so the CLI can print
its message (which names the problem and the fix) instead of a traceback.
"""


class QcalError(Exception):
    """Base class for errors caused by bad input or missing artifacts."""


class ConfigError(QcalError, ValueError):
    """A configuration value is invalid (e.g. a group size that does not divide a shape)."""


class ModelNotFoundError(QcalError, FileNotFoundError):
    """A model directory or checkpoint does not exist or is incomplete."""


class CheckpointError(QcalError, ValueError):
    """A quantized checkpoint is corrupted, incomplete or mis-shaped."""


class NumericalError(QcalError, ArithmeticError):
    """A numerical procedure failed (NaN statistics, non positive-definite Hessian)."""


class RemoteCodeError(ModelNotFoundError):
    """A model or tokenizer needs its directory's own Python, and the user did not opt in.

    `what` names the directory and the code it would run, without the fix: each command
    says its own fix (`--trust-remote-code`, or that it has no such option)."""

    def __init__(self, what: str) -> None:
        self.what = what
        super().__init__(f"{what}; qcal does not run it unless you pass --trust-remote-code "
                         "(only for code you have read and trust)")
