"""The phase meter behind results/gptq_phase_split: nested phases get their own seconds,
the peak RSS goes to the phase it happened in, and wrapped functions still return."""

from __future__ import annotations

import types

import pytest
import torch

from qcal.studies.phase_split import PhaseMeter, _wrap, render

pytestmark = pytest.mark.unit


def test_nested_phases_split_their_time_and_the_peak_lands_where_memory_grew() -> None:
    now = [0.0]
    meter = PhaseMeter(clock=lambda: now[0])
    meter.start()
    with meter.phase("outer"):
        now[0] += 2.0
        with meter.phase("inner"):
            held = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched
            held.add_(1)
            meter.note()
            now[0] += 3.0
        del held
        now[0] += 1.0
    meter.stop()
    assert meter.seconds["outer"] == pytest.approx(3.0)
    assert meter.seconds["inner"] == pytest.approx(3.0)
    assert meter.top[1] == "inner"
    assert meter.peak["inner"] >= meter.peak["outer"]
    assert meter.calls == {"outer": 1, "inner": 1}


def test_a_wrapped_function_is_marked_and_returns_its_value() -> None:
    meter = PhaseMeter()
    owner = types.SimpleNamespace(work=lambda x, scale=1: x * scale)
    _wrap(meter, owner, "work", lambda x, **_: f"work on {x}")
    assert owner.work(3, scale=2) == 6
    meter.stop()
    assert "work on 3" in meter.seconds


def test_render_names_every_phase_and_the_peak() -> None:
    data = {"scope": "m, first 2 layers", "peak_rss_gib": 2.0, "peak_phase": "b",
            "baseline_rss_gib": 0.5, "wall_seconds": 10.0, "quantize_seconds": 8.0,
            "phases": [{"phase": "a", "calls": 1, "seconds": 2.0, "peak_rss_gib": 1.0},
                       {"phase": "b", "calls": 4, "seconds": 8.0, "peak_rss_gib": 2.0}],
            "provenance": {"command": "python -m qcal.studies.phase_split"}}
    text = render(data)
    assert "| b | 4 | 8.0 | 80.0% | 2.000 |" in text
    assert text.index("| b |") < text.index("| a |")  # longest first
    assert "during: b" in text
