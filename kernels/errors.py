"""Error types of the kernels package (it depends on torch and triton only, never on qcal).

qcal's command line prints these like its own input errors: one line, exit code 2.
"""


class KernelError(ValueError):
    """Base class: a kernel cannot run on these inputs or settings (the message says why)."""


class KernelUnsupportedError(KernelError):
    """A kernel backend cannot serve these weights or inputs (the message says why and what to do)."""
