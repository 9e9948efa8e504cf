"""Interval charts: every point with the interval its table prints, none invented."""

from __future__ import annotations

from pathlib import Path

import pytest

from qcal.eval.stats import mean_ci
from qcal.studies.plots import Point, from_mean_ci, from_test, interval_chart

pytestmark = pytest.mark.unit

PNG = b"\x89PNG\r\n\x1a\n"


def test_points_carry_the_tables_intervals() -> None:
    ci = mean_ci([10.0, 11.0, 12.0])
    point = from_mean_ci("ml:en", ci)
    assert point.mean == pytest.approx(11.0)
    assert point.high - point.mean == pytest.approx(ci["half_width"])
    assert point.mean - point.low == pytest.approx(ci["half_width"])
    single = from_mean_ci("rtn", mean_ci([9.0]))  # one run: no interval, not a zero-width one
    assert single.low is None and single.high is None
    test = {"delta": -0.02, "ci_low": -0.03, "ci_high": -0.01}
    assert from_test("piqa", test) == Point("piqa", -0.02, -0.03, -0.01)


def test_chart_is_written_whole_with_and_without_intervals(tmp_path: Path) -> None:
    panels = {"gptq": {"random": [Point("16", 31.9, 31.5, 32.3), Point("64", 31.8)],
                       "zipf": [Point("16", 32.0, 31.2, 32.8)]},
              "awq": {"random": [Point("16", 31.2, 30.7, 31.7)]}}
    out = interval_chart(tmp_path / "sub" / "chart.png", panels, "ppl", "title",
                         references={"gptq": {"float": 27.5}}, zero_line=True)
    assert out.read_bytes()[:8] == PNG
    assert [p.name for p in out.parent.iterdir()] == ["chart.png"]  # no partial file left


def test_nothing_to_plot_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="nothing to plot"):
        interval_chart(tmp_path / "x.png", {"gptq": {"random": []}}, "ppl", "title")
    assert not (tmp_path / "x.png").exists()
