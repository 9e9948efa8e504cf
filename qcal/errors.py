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
