"""The one place a device string is interpreted: `cpu`, `cuda`, `cuda:N` or `auto`.

Nothing else in qcal names a device; every command takes `--device` (default `auto`:
CUDA when present) and passes the resolved string down.
"""

from __future__ import annotations

import torch

from qcal.errors import ConfigError

DEVICE_CHOICES = "cpu, cuda, cuda:N or auto"


def resolve_device(device: str | torch.device | None = "auto") -> str:
    """A concrete device string; a device that is not there is a clear error."""
    text = str(device if device is not None else "auto").strip().lower()
    if text == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        parsed = torch.device(text)
    except (RuntimeError, ValueError):
        raise ConfigError(f"--device {device!r} is not a device; use {DEVICE_CHOICES}") from None
    if parsed.type == "cpu":
        return "cpu"
    if parsed.type != "cuda":
        raise ConfigError(f"--device {device!r} is not supported; use {DEVICE_CHOICES}")
    if not torch.cuda.is_available():
        raise ConfigError(f"--device {device} asks for a GPU, but torch sees no CUDA device; use "
                          "--device cpu (or auto)")
    if parsed.index is not None and parsed.index >= torch.cuda.device_count():
        raise ConfigError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA "
                          f"device(s), numbered from 0")
    return str(parsed)
