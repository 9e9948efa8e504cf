"""Sample-size curves from a grid's cells: means and t-intervals over seeds per size, and
the reading of the smallest size within the noise of the largest."""

from __future__ import annotations

from pathlib import Path

import pytest

from qcal.grid.sample_size import curves, plot, reading

pytestmark = pytest.mark.unit


def _cells() -> tuple[dict, dict]:
    ppl = {8: [40.0, 42.0, 41.0], 32: [35.2, 35.0, 34.8], 128: [34.9, 35.1, 35.0]}
    cells, table = {"float": {"method": None}}, {"float": {"en": 30.0}}
    for n, values in ppl.items():
        for seed, v in enumerate(values):
            key = f"random__gptq__s{seed}__n{n}"
            cells[key] = {"method": "gptq", "selector": "random",
                          "axes": {"nsamples": n, "seed": seed}}
            table[key] = {"en": v}
    return cells, table


def test_curves_and_reading(tmp_path: Path) -> None:
    cells, table = _cells()
    out = curves(cells, table, "en", 512)
    (name, points), = out.items()
    assert name == "gptq / random" and [p["nsamples"] for p in points] == [8, 32, 128]
    assert points[0]["mean"] == pytest.approx(41.0) and points[1]["tokens"] == 32 * 512
    assert points[2]["low"] < 35.0 < points[2]["high"]
    assert reading(points).startswith("32 windows (16,384 tokens) are within")
    assert plot(out, "en", tmp_path / "s.png") == "s.png"
    assert (tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG"


def test_one_seed_has_no_interval() -> None:
    cells, table = _cells()
    cells = {k: v for k, v in cells.items() if not k.endswith(("s1__n8", "s2__n8", "s1__n32",
                                                               "s2__n32", "s1__n128", "s2__n128"))}
    points = curves(cells, table, "en", 512)["gptq / random"]
    assert reading(points).startswith("one seed per size")


def test_no_smaller_size_reaches_the_largest() -> None:
    cells, table = _cells()
    for key in table:
        if key.endswith("__n32"):
            table[key]["en"] += 5.0
    points = curves(cells, table, "en", 512)["gptq / random"]
    assert reading(points) == "no smaller size reaches the interval of 128"
