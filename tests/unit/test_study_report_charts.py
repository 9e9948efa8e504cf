"""A re-rendered study report removes the charts it no longer links, and only those."""

import json

import pytest

from qcal.studies.tables import chart_link, write_report

pytestmark = pytest.mark.unit


def _chart(path):
    path.write_bytes(b"\x89PNG chart")
    return path


def test_a_chart_whose_grid_left_the_report_is_removed(tmp_path):
    out = tmp_path / "benchmarks"
    old = _chart(tmp_path / "benchmarks_study_confidence.png")
    write_report(out, {"grids": {}}, f"# t\n{chart_link(old, 'old')}", [old])
    assert json.loads(out.with_suffix(".json").read_text())["charts"] == [old.name]

    new = _chart(tmp_path / "benchmarks_study_benchmarks.png")
    write_report(out, {"grids": {}}, f"# t\n{chart_link(new, 'new')}", [new])
    assert not old.exists() and new.exists()
    assert json.loads(out.with_suffix(".json").read_text())["charts"] == [new.name]


def test_a_chart_still_linked_is_kept(tmp_path):
    out = tmp_path / "zipcal"
    chart = _chart(tmp_path / "zipcal_study_zipcal.png")
    for _ in range(2):
        write_report(out, {}, chart_link(chart, "c"), [chart])
    assert chart.exists()


def test_only_files_the_report_named_are_ever_removed(tmp_path):
    out = tmp_path / "confidence"
    # An earlier JSON (hand-edited, or another tool's) names files this report never writes.
    theirs = [_chart(tmp_path / "notes.png"), _chart(tmp_path / "other_study.png")]
    (tmp_path / "keep.txt").write_text("user data")
    out.with_suffix(".json").write_text(json.dumps(
        {"charts": ["notes.png", "other_study.png", "../keep.txt", "keep.txt"]}))
    write_report(out, {}, "# no charts", [])
    assert all(p.exists() for p in theirs) and (tmp_path / "keep.txt").exists()


def test_an_unreadable_earlier_report_prunes_nothing(tmp_path):
    out = tmp_path / "multilingual"
    unlinked = _chart(tmp_path / "multilingual_a.png")
    out.with_suffix(".json").write_text("not json")
    write_report(out, {}, "# t", [unlinked])
    assert unlinked.exists()
    assert json.loads(out.with_suffix(".json").read_text())["charts"] == []
