"""The methods benchmark's table: rows from cell records, failures named, the share of
GPTQ's gap the best rotated variant closes computed from the cells, CPU hours summed."""

from __future__ import annotations

import pytest

from qcal.studies.methods_bench import planned
from qcal.studies.methods_report import gap_closed, render_methods

pytestmark = pytest.mark.unit


def _cell(ppl: float, base: float = 20.0, cpu: float = 1800.0) -> dict:
    div = {lang: {"base_ppl": base, "model_ppl": ppl, "kl_mean": 0.01} for lang in ("en", "de", "zh")}
    return {"returncode": 0, "divergence": div, "quantize_seconds": 12.5,
            "quantize": {"max_rss_mib": 2048, "load_before": [1.5], "user_seconds": cpu,
                         "system_seconds": 0}, "eval": {"user_seconds": cpu}}


def test_gap_closed_and_render() -> None:
    cells = {"w3g128/gptq/s0": _cell(26.0), "w3g128/gptq+rot/s0": _cell(24.0),
             "w3g128/rtn+rot/s0": _cell(30.0),
             "w3g128/awq/s0": {"returncode": 1, "quantize": {"error_tail": "boom\nit broke"}}}
    closed = gap_closed(cells, "w3g128")
    assert closed == {"best_rotated": "gptq+rot", "gptq_gap": 6.0, "closed": pytest.approx(1 / 3)}
    assert gap_closed(cells, "w4g128") is None
    data = {"models": {"m": {"cells": cells, "path": "models/m"}}, "schemes": {"w3g128": []},
            "calibration": "--nsamples 32", "provenance": {"command": "x"}}
    text = render_methods(data)
    assert "| float | 20.000" in text and "failed: it broke" in text
    assert "closes 33% of GPTQ's English gap" in text
    assert "CPU time of these cells (quantize + eval, user + system): 3.00 CPU hours" in text


def test_plan_runs_data_free_methods_once_across_seeds() -> None:
    keys = planned(["w4g128"], ["rtn", "gptq"], [0, 1])
    assert keys == ["w4g128/rtn/s0", "w4g128/rtn+rot/s0", "w4g128/gptq/s0", "w4g128/gptq+rot/s0",
                    "w4g128/gptq/s1", "w4g128/gptq+rot/s1"]
