"""Shared fixtures. Everything runs offline: the Hub is unreachable by design."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("QCAL_AUTOTUNE", "0")
# The provisioned model and corpora live in the checkout, also for tests that chdir elsewhere.
os.environ.setdefault("QCAL_HOME", str(Path(__file__).resolve().parents[1]))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama (2 layers, hidden 128) with a small BPE tokenizer, built once."""
    from qcal.model.tiny import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """The provisioned real model; tests that need it skip when it is absent."""
    from qcal.paths import default_model_dir

    path = default_model_dir()
    if not (path / "config.json").is_file():
        pytest.skip(f"default model not provisioned at {path} (run `make setup`)")
    return path
