"""What the bad-input suites share: `Cli` runs qcal in-process and records each refused
case for results/reliability.md (qcal report --study reliability); content digests,
argument builders for the tiny model and the method tests, a pickle payload. Fixtures `cli` and `home` are
in conftest.py."""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from qcal.cli import main


def tree_digest(root: Path) -> dict[str, str]:
    """Every file under `root` with its content hash: 'nothing was touched' made checkable."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@contextlib.contextmanager
def within(seconds: int, failure: str) -> Iterator[None]:
    """Fail the test with `failure` if the block runs longer than `seconds` (a hang)."""
    def hung(*_: object) -> None:
        raise AssertionError(failure)

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


class Cli:
    """Runs `qcal` in-process; records each case for the reliability table."""

    def __init__(self, capsys: pytest.CaptureFixture, request: pytest.FixtureRequest) -> None:
        self.capsys, self.request = capsys, request

    def __call__(self, *argv: str) -> tuple[int, str]:
        self.capsys.readouterr()
        rc = main([str(a) for a in argv])
        err = self.capsys.readouterr().err
        return rc, err

    def refused(self, *argv: str, match: str, case: str, pattern: str | None = None) -> str:
        """Exit 2 with exactly one `error:` line that contains `match`; returns that line."""
        rc, err = self(*argv)
        errors = [ln for ln in err.splitlines() if "error:" in ln]
        assert rc == 2, err
        assert "Traceback" not in err
        assert len(errors) == 1, err
        assert match in errors[0], errors[0]
        self.record(case, argv, rc, errors[0], pattern)
        return errors[0]

    def record(self, case: str, argv: tuple, rc: int, line: str, pattern: str | None = None
               ) -> None:
        log = os.environ.get("QCAL_RELIABILITY_LOG")
        if not log:
            return
        tmp = str(self.request.getfixturevalue("tmp_path"))

        def short(text: str) -> str:  # the test's temp folder stands for the user's folder
            return text.replace(tmp, "$T")

        with open(log, "a", encoding="utf-8") as handle:
            pattern = pattern or getattr(self.request.module, "PATTERN", None)
            handle.write(json.dumps({"test": self.request.node.name, "case": case,
                                     "pattern": pattern,
                                     "module": self.request.module.__name__,
                                     "command": short("qcal " + " ".join(map(str, argv))),
                                     "exit": rc, "line": short(line.strip())}) + "\n")


def fsio_host() -> str:
    from qcal import fsio

    return fsio._HOST


def dead_writer() -> str:
    """`<host>-<pid>` of a process that has exited, as a killed qcal leaves in temp names."""
    import subprocess

    proc = subprocess.Popen(["true"])
    proc.wait()
    return f"{fsio_host()}-{proc.pid}"


def gptq_args(x: Path, out: Path, *extra: str) -> list[str]:
    return ["quantize", "--model", x / "mymodel", "--method", "gptq", "--group-size", "32",
            "--calib", x / "calib.txt", "--nsamples", "4", "--seqlen", "32", "-o", out, *extra]


def quantize_options(validate: bool = True, *extra: str, **given: object) -> argparse.Namespace:
    """`qcal quantize --group-size 32 ...` options as the CLI hands them on: parsed, then
    (with `validate`) typed by the schema; `given` keys become --flags (_ as -)."""
    from qcal.cli import build_parser
    from qcal.schema import validate_args

    argv = ["quantize", "--group-size", "32", *extra]
    for key, value in given.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    args = build_parser().parse_args(argv)
    if validate:
        validate_args(args)
    return args


def rtn_args(x: Path, out: Path, *extra: str) -> list[str]:
    return ["quantize", "--model", x / "mymodel", "--group-size", "32", "-o", out, *extra]


class Payload:
    """A pickle that, if ever unpickled, creates `flag`."""

    def __init__(self, flag: Path) -> None:
        self.flag = flag

    def __reduce__(self):  # noqa: ANN204
        return (os.system, (f"touch {self.flag}",))
