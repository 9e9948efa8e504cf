"""scripts/bench_big_model.py's per-layer figures count only the layers a run wrote: a
resumed run finds the layers of the run it continues in the same work dir."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.unit

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_big_model.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_big_model_under_test", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _layer(work: Path, index: int, mtime: float) -> None:
    path = work / f"layer_{index:04d}.safetensors"
    path.write_bytes(b"x")
    os.utime(path, (mtime, mtime))


def test_layer_times_count_only_this_runs_layers(tmp_path: Path) -> None:
    bench = _script()
    started = 10_000.0
    for i, t in enumerate([1_000.0, 2_000.0]):  # an earlier run's layers
        _layer(tmp_path, i, t)
    for i, t in enumerate([10_300.0, 10_500.0, 10_700.0], start=2):
        _layer(tmp_path, i, t)
    times = bench._layer_times(tmp_path, started)
    assert times == {"layers_done": 3, "first_layer_done_s": 300.0,
                     "s_per_layer_after_first": 200.0}
    assert bench._layer_times(tmp_path, 20_000.0) == {}
