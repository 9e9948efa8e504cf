"""Every command that README.md and docs/ show runs as written: each `qcal ...` line in a
bash block parses with qcal's own parser (every option exists, every subcommand too), each
`python scripts/X.py` names a script that exists, each `make T` a Makefile target."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from qcal.cli import build_parser

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def shell_commands(path: Path) -> list[str]:
    """The commands of the ```bash blocks of a Markdown file (continuations joined,
    comments dropped)."""
    commands: list[str] = []
    for block in re.findall(r"```(?:bash|sh)\n(.*?)```", path.read_text(), flags=re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.split("  #", 1)[0].strip()
            if line and not line.startswith("#"):
                commands.append(line)
    return commands


def _cases() -> list[tuple[str, str]]:
    return [(p.relative_to(ROOT).as_posix(), c) for p in DOCS for c in shell_commands(p)]


def test_the_docs_show_commands() -> None:
    assert any(c.startswith("qcal quantize") for _, c in _cases())
    assert any(c.startswith("make ") for _, c in _cases())


@pytest.mark.parametrize(("doc", "command"), _cases())
def test_command_as_written(doc: str, command: str) -> None:
    words = shlex.split(command)
    if words[0] == "qcal":
        try:
            build_parser().parse_args(words[1:])
        except SystemExit as exit_:
            pytest.fail(f"{doc}: `{command}` does not parse (exit {exit_.code})")
    elif words[0] == "python" and len(words) > 1 and words[1].startswith("scripts/"):
        assert (ROOT / words[1]).is_file(), f"{doc}: {words[1]} does not exist"
    elif words[0] == "make":
        targets = re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), flags=re.M)
        assert words[1] in targets, f"{doc}: make {words[1]} is no Makefile target"
    elif words[0] == "bash":
        assert (ROOT / words[1]).is_file(), f"{doc}: {words[1]} does not exist"
