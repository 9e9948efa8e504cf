"""qcal: calibration-aware post-training quantization for Hugging Face causal LMs.

The Python API (`qcal.quantize`, `qcal.load`, `qcal.evaluate`, `qcal.calib.build`) is
imported on first use, so `import qcal` loads neither torch nor transformers.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["evaluate", "load", "quantize"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from qcal import api

        return getattr(api, name)
    raise AttributeError(f"module 'qcal' has no attribute {name!r}")
