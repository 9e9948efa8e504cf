"""Bad input, part 5: one ownership rule for every output. `qcal eval -o STEM` writes files,
not a directory; like a directory they are replaced only when qcal wrote them (their
provenance says so), else only with --overwrite, and the check comes before the model loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_cases import Cli, tree_digest

pytestmark = pytest.mark.integration
PATTERN = "5. Names and outputs: one rule"


def _eval(home: Path, stem: Path, *extra: str) -> list:
    return ["eval", "--model", home / "mymodel", "--text", home / "calib.txt", "--seqlen", "32",
            "--max-windows", "2", "-o", stem, *extra]


@pytest.mark.parametrize("own", ["notes.json", "notes.md", "notes_items.jsonl"])
def test_eval_output_never_replaces_the_users_file(cli: Cli, home: Path, own: str) -> None:
    (home / own).write_text("the user's own notes\n")
    if own.endswith(".jsonl"):  # a companion counts as qcal's only beside qcal's own JSON
        (home / "notes.json").write_text('{"mine": true}\n')
    before = tree_digest(home)
    cli.refused(*_eval(home, home / "notes"), match="qcal did not write it",
                case=f"eval -o notes over the user's {own}")
    assert tree_digest(home) == before


def test_eval_output_over_a_directory_is_refused(cli: Cli, home: Path) -> None:
    (home / "res.json").mkdir()
    cli.refused(*_eval(home, home / "res", "--overwrite"), match="is a directory",
                case="eval -o res where res.json is a directory (even with --overwrite)")


def test_eval_output_replaces_its_own_and_overwrite_is_explicit(cli: Cli, home: Path) -> None:
    stem = home / "res"
    assert cli(*_eval(home, stem))[0] == 0
    first = json.loads((home / "res.json").read_text())
    assert "provenance" in first
    assert cli(*_eval(home, stem))[0] == 0  # qcal's own result: replaced without asking
    (home / "notes.json").write_text("mine\n")
    assert cli(*_eval(home, home / "notes", "--overwrite"))[0] == 0  # the user said so
    assert "provenance" in json.loads((home / "notes.json").read_text())


def test_file_ownership_rule_unit(tmp_path: Path) -> None:
    from qcal.errors import ConfigError
    from qcal.fsio import check_file_outputs, wrote_result_file
    from qcal.results import provenance, write_results

    write_results(tmp_path / "r", {"provenance": provenance("qcal eval")}, "# x\n\n- Command: `a`\n"
                  "- Date: d\n- Machine: m\n")
    assert wrote_result_file(tmp_path / "r.json") and wrote_result_file(tmp_path / "r.md")
    check_file_outputs(tmp_path / "r.json", (tmp_path / "r.md", tmp_path / "r_items.jsonl"))
    (tmp_path / "u.json").write_text('{"provenance": {"command": "mine"}}')
    with pytest.raises(ConfigError, match="qcal did not write it"):
        check_file_outputs(tmp_path / "u.json")
    check_file_outputs(tmp_path / "u.json", overwrite=True)
    (tmp_path / "link.json").symlink_to(tmp_path / "r.json")
    with pytest.raises(ConfigError, match="is a link"):
        check_file_outputs(tmp_path / "link.json", overwrite=True)
