"""Where qcal keeps provisioned models, data, calibration sets, runs and results.

Everything lives under one home: `$QCAL_HOME` if set, else the current directory (in a
checkout of the repository, that is the repository), never inside the installed
package. Each folder can be moved on its own with `QCAL_MODELS_DIR`, `QCAL_DATA_DIR`,
`QCAL_CALIB_DIR`, `QCAL_RUNS_DIR` or `QCAL_RESULTS_DIR`.
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_MODEL_NAME = "smollm2-135m-instruct"
GEMMA3_MODEL_NAME = "gemma-3-270m"  # optional second target (`qcal provision` tries it)
# Opt-in third target (7.1 GB in float32): built only when named, never by set-up or CI.
QWEN_CODER_MODEL_NAME = "qwen2.5-coder-1.5b"
# Folders under models/ that `qcal provision` builds; `--model NAME` accepts these names.
PROVISIONED_MODELS = (DEFAULT_MODEL_NAME, GEMMA3_MODEL_NAME, QWEN_CODER_MODEL_NAME)


def qcal_home() -> Path:
    return Path(os.environ.get("QCAL_HOME") or Path.cwd()).expanduser()


def _folder(env: str, name: str) -> Path:
    return Path(os.environ.get(env) or qcal_home() / name).expanduser()


def models_dir() -> Path:
    return _folder("QCAL_MODELS_DIR", "models")


def default_model_dir() -> Path:
    return models_dir() / DEFAULT_MODEL_NAME


def data_dir() -> Path:
    return _folder("QCAL_DATA_DIR", "data")


def calib_sets_dir() -> Path:
    return _folder("QCAL_CALIB_DIR", "calib_sets")


def results_dir() -> Path:
    return _folder("QCAL_RESULTS_DIR", "results")


def runs_dir() -> Path:
    return _folder("QCAL_RUNS_DIR", "runs")
