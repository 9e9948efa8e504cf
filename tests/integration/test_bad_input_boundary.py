"""Bad input and faults, part 3: the one boundary in `qcal`'s entry point. Anything
unforeseen is one `internal error:` line (exit 3) with its traceback in a log file, never
hidden; SIGTERM stops like Ctrl-C (exit 143, resume hint)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from cli_cases import Cli, gptq_args

pytestmark = pytest.mark.integration
PATTERN = "6. No boundary for the unexpected"


@pytest.mark.parametrize("fault", [KeyError("layer_7"), IndexError("list index out of range"),
                                   json.JSONDecodeError("Expecting value", "", 0),
                                   OSError(5, "Input/output error")])
def test_unforeseen_exception_is_one_line_and_a_logged_traceback(
        cli: Cli, home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        fault: Exception) -> None:
    from qcal.commands import evaluate

    def broken(_args: object) -> int:
        raise fault

    logs = tmp_path / "logs"
    monkeypatch.setenv("QCAL_LOG_DIR", str(logs))
    monkeypatch.setattr(evaluate, "run", broken)  # bound as handler when main builds the parser
    argv = ("eval", "--model", home / "mymodel", "--text", home / "calib.txt")
    rc, err = cli(*argv)
    lines = err.strip().splitlines()
    assert rc == 3 and len(lines) == 1, err
    assert lines[0].startswith("qcal eval: internal error: " + type(fault).__name__), lines[0]
    assert "please report it" in lines[0] and "Traceback" not in err
    log = Path(lines[0].split("full traceback in ")[1].split(";")[0])
    assert log.parent == logs and log.is_file()
    text = log.read_text()
    assert "Traceback (most recent call last)" in text and "broken" in text
    assert type(fault).__name__ in text
    cli.record(f"unforeseen {type(fault).__name__} in a command (injected)", argv, rc, lines[0],
               pattern=PATTERN)


def test_report_on_a_truncated_cell_json(cli: Cli, home: Path, tmp_path: Path) -> None:
    run = tmp_path / "results" / "g"
    (run / "cells").mkdir(parents=True)
    (run / "grid.json").write_text(json.dumps({"spec": {"name": "g"}}))
    (run / "cells" / "float.json").write_text('{"method": null, "perplexity": {"en": ')
    cli.refused("report", run, match="float.json is truncated", case="qcal report with a "
                "truncated cell JSON", pattern=PATTERN)


def test_report_on_a_missing_run_dir(cli: Cli, home: Path, tmp_path: Path) -> None:
    cli.refused("report", tmp_path / "nope", match="does not exist",
                case="qcal report <missing dir>", pattern=PATTERN)


SLOW_QUANTIZE = textwrap.dedent("""
    import sys, time
    from qcal import run

    def slow(*args, **kwargs):
        print("ready", flush=True)
        time.sleep(120)

    run.quantize_layers = slow
    from qcal.cli import main
    sys.exit(main(sys.argv[1:]))
""")


def test_sigterm_stops_like_ctrl_c(cli: Cli, home: Path, tmp_path: Path) -> None:
    out = home / "ckpt"
    argv = [str(a) for a in gptq_args(home, out)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", SLOW_QUANTIZE, *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # blocks until the run is inside the quantizer
        assert line.strip() == "ready", proc.stderr.read() if proc.stderr else line
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = err.strip().splitlines()
    assert proc.returncode == 143, err
    assert lines[-1].startswith("qcal quantize: terminated (SIGTERM)"), err
    assert "--resume" in lines[-1] and "Traceback" not in err
    assert not out.exists()
    assert not list(home.glob(".ckpt.qcal-tmp-*"))
    cli.record("SIGTERM during quantize (real signal, subprocess)", tuple(argv), 143, lines[-1],
               pattern=PATTERN)


def test_sigterm_handler_is_restored_after_main(cli: Cli, home: Path) -> None:
    before = signal.getsignal(signal.SIGTERM)
    cli("quantize", "--seed", "-1")
    assert signal.getsignal(signal.SIGTERM) is before


def test_argparse_refusals_are_one_line_and_help_exits_zero(cli: Cli, home: Path) -> None:
    cli.refused(match="the following arguments are required", case="qcal with no command",
                pattern="2. Values that were never checked")
    cli.refused("calib", match="required", case="qcal calib with no subcommand",
                pattern="2. Values that were never checked")
    rc, _ = cli("quantize", "--help")
    assert rc == 0
