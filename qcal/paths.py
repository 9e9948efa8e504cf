"""Where qcal keeps provisioned models, data and results (overridable by environment)."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_MODEL_NAME = "smollm2-135m-instruct"


def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


def models_dir() -> Path:
    return Path(os.environ.get("QCAL_MODELS_DIR", repo_root() / "models"))


def default_model_dir() -> Path:
    return models_dir() / DEFAULT_MODEL_NAME


def results_dir() -> Path:
    return Path(os.environ.get("QCAL_RESULTS_DIR", repo_root() / "results"))


def runs_dir() -> Path:
    return Path(os.environ.get("QCAL_RUNS_DIR", repo_root() / "runs"))
