"""Modules that moved in the redesign fail on import with a one-line pointer."""

from __future__ import annotations

import importlib

import pytest

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("old", "new"), [
    ("qcal.compare", "qcal.grid"), ("qcal.compare_report", "qcal.grid.report"),
    ("qcal.study", "qcal.grid.study"), ("qcal.quant.methods", "qcal.methods"),
    ("qcal.quant.gptq_runner", "qcal.methods.gptq_runner"),
    ("qcal.quant.awq_runner", "qcal.methods.awq_runner"), ("qcal.quant.grid", "qcal.quant.intgrid"),
    ("qcal.packing.format", "qcal_kernels.format"),
])
def test_old_module_points_to_new(old: str, new: str) -> None:
    with pytest.raises(ImportError, match=f"{old} moved to {new}"):
        importlib.import_module(old)
    importlib.import_module(new)
