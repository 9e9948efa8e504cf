"""Every `qcal report --study NAME` resolves to a render function, and the option's help
names every study; an unknown name is refused in one line naming the known ones."""

from __future__ import annotations

import importlib

import pytest

from qcal.cli import build_parser, main
from qcal.studies.report import STUDIES

pytestmark = pytest.mark.unit


def _study_help() -> str:
    report = build_parser()._subparsers._group_actions[0].choices["report"]  # noqa: SLF001
    return next(a.help for a in report._actions if a.dest == "study")  # noqa: SLF001


@pytest.mark.parametrize("name", sorted(STUDIES))
def test_study_resolves_and_is_named_in_the_help(name: str) -> None:
    module, _, function = STUDIES[name].partition(":")
    assert callable(getattr(importlib.import_module(module), function or "render"))
    assert name in _study_help()


def test_unknown_study_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", "--study", "nope"]) == 2
    assert "choose from" in capsys.readouterr().err
