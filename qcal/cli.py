"""`qcal` command line: parse arguments, validate them against the schema, call the library.

The entry point is the one boundary: bad input is one `error:` line and exit 2; an
interrupt (Ctrl-C or SIGTERM) stops cleanly with a resume hint (exit 130 or 143); anything
unforeseen is one `internal error:` line, exit 3, with the traceback in a log file.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib
import logging
import os
import shlex
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

from qcal_kernels.errors import KernelError

from qcal.errors import QcalError
from qcal.fsio import DiskFullError
from qcal.logs import to_stderr as log_to_stderr
from qcal.processes import Terminated

COMMAND_MODULES = ("quantize", "evaluate", "calib", "compare", "export", "provision")
USER_FIXABLE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EROFS, errno.EPERM)
EXIT_BAD_INPUT, EXIT_INTERNAL, EXIT_INTERRUPT, EXIT_TERMINATED = 2, 3, 130, 143


class DefaultsShown(argparse.HelpFormatter):
    """Help that ends each option with its default, unless the help already says it (or the
    option is an off-by-default switch)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if ("default" in text.lower() or default in (None, False, argparse.SUPPRESS)
                or not action.option_strings or default == []):
            return text
        return f"{text} (default: %(default)s)"


class OneLineParser(argparse.ArgumentParser):
    """argparse whose own refusals (unknown option, missing value) are one line, exit 2,
    and whose help shows every default."""

    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        kwargs.setdefault("formatter_class", DefaultsShown)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message}; see {self.prog} --help\n")


def subcommands(parser: argparse.ArgumentParser, prefix: str = "") -> dict[str, argparse.ArgumentParser]:
    """Every leaf command's parser, keyed as the schema keys them ("quantize", "calib build")."""
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:  # noqa: SLF001  (argparse has no public walk)
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            for name, sub in action.choices.items():
                found.update(subcommands(sub, f"{prefix}{name} ") or {f"{prefix}{name}": sub})
    return found


def option_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The user's options of one command (not help, not nested subcommands)."""
    return [a for a in parser._actions  # noqa: SLF001
            if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]  # noqa: SLF001


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="qcal", description="Calibration-aware post-training quantization for HF causal LMs.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"qcal.commands.{name}")
        except ModuleNotFoundError as err:
            if err.name != f"qcal.commands.{name}":
                raise
            continue
        module.add_parser(sub)
    for command in subcommands(parser).values():
        for action in option_actions(command):
            # argparse only parses: the schema converts and checks each value, so its one
            # line (field, value, allowed range, fix) replaces argparse's usage dump.
            action.type = None
            if action.choices is not None and not isinstance(action.choices, dict):
                # Help still lists the choices; the schema refuses others with a did-you-mean.
                action.metavar = action.metavar or "{" + ",".join(map(str, action.choices)) + "}"
                action.choices = None
    return parser


def command_prefix() -> list[str]:
    """How a script starts `qcal` in a subprocess: the console script installed beside the
    running interpreter (found even when the virtualenv is not activated), else `-m`."""
    beside = os.path.join(os.path.dirname(sys.executable), "qcal")
    return [beside] if os.access(beside, os.X_OK) else [sys.executable, "-m", "qcal.cli"]


def log_dir() -> Path:
    """Where internal-error tracebacks go: $QCAL_LOG_DIR, else <runs dir>/logs."""
    from qcal.paths import runs_dir

    return Path(os.environ.get("QCAL_LOG_DIR") or runs_dir() / "logs").expanduser()


def write_traceback(command: str, argv: list[str]) -> Path:
    """The current exception's traceback in a new log file (a temp dir if the log dir is
    not writable); returns its path."""
    import datetime
    import tempfile
    import traceback

    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
    text = (f"qcal {shlex.join(argv)}\ncommand: {command}\npython: {sys.version.split()[0]}\n\n"
            + traceback.format_exc())
    for folder in (log_dir(), Path(tempfile.gettempdir()) / "qcal-logs"):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"internal-error-{stamp}-{os.getpid()}.log"
            path.write_text(text, encoding="utf-8")
            return path
        except OSError:
            continue
    raise RuntimeError("no writable folder for the traceback log")  # pragma: no cover


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM raises `Terminated` (a KeyboardInterrupt); restored after."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_term(signum: int, frame: object) -> None:
        raise Terminated

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _flags(parser: argparse.ArgumentParser, key: str) -> dict[str, str]:
    command = subcommands(parser).get(key)
    if command is None:
        return {}
    return {a.dest: next((s for s in a.option_strings if s.startswith("--")), a.dest)
            for a in option_actions(command)}


def repeated_option(command: argparse.ArgumentParser | None, argv: list[str]) -> str | None:
    """The first option of `command` given twice in `argv` where argparse would silently keep
    the last (repeatable options, such as --ignore, are exempt)."""
    if command is None:
        return None
    repeatable = (argparse._AppendAction, argparse._ExtendAction, argparse._CountAction)
    words = argv[:argv.index("--")] if "--" in argv else argv
    for action in option_actions(command):
        if isinstance(action, repeatable) or not action.option_strings:
            continue
        given = [w for w in words for s in action.option_strings
                 if w == s or (s.startswith("--") and w.startswith(s + "="))]
        if len(given) > 1:
            return next((s for s in action.option_strings if s.startswith("--")),
                        action.option_strings[0])
    return None


def main(argv: list[str] | None = None) -> int:
    # The Hub is unreachable here by design: fail fast instead of retrying downloads.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    log_to_stderr()  # library messages (per-layer losses, ...) on stderr
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as done:  # --help, or argparse's own one-line refusal
        return int(done.code or 0)
    args.command_line = "qcal " + shlex.join(str(a) for a in argv)  # for model cards and logs
    from qcal.schema import command_key, validate_args

    name = command_key(args)
    twice = repeated_option(subcommands(parser).get(name), argv)
    if twice is not None:
        print(f"qcal {args.command}: error: {twice} is given more than once (only the last "
              "would count); give it once", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        with sigterm_as_interrupt():
            validate_args(args, _flags(parser, name))  # before any model, work dir or output
            return int(args.handler(args) or 0)
    except (QcalError, KernelError) as err:
        hint = getattr(args, "interrupt_hint", None)
        resume = f"; {hint}" if hint and isinstance(err, DiskFullError) else ""
        print(f"qcal {args.command}: error: {err}{resume}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt as stop:
        hint = getattr(args, "interrupt_hint", None)
        what = "terminated (SIGTERM)" if isinstance(stop, Terminated) else "interrupted"
        print(f"qcal {args.command}: {what}" + (f"; {hint}" if hint else ""), file=sys.stderr)
        return EXIT_TERMINATED if isinstance(stop, Terminated) else EXIT_INTERRUPT
    except OSError as err:
        if err.errno in USER_FIXABLE_ERRNOS:
            # Environment faults (full disk, permissions) are the user's to fix: one line.
            where = f" ({err.filename})" if err.filename else ""
            print(f"qcal {args.command}: error: {os.strerror(err.errno)}{where}; free space or "
                  "fix permissions, then run again", file=sys.stderr)
            return EXIT_BAD_INPUT
        return _internal_error(name, argv, err)
    except Exception as err:  # noqa: BLE001  (the one boundary for the unforeseen)
        return _internal_error(name, argv, err)


def _internal_error(name: str, argv: list[str], err: BaseException) -> int:
    log = write_traceback(name, argv)
    message = " ".join(str(err).split())[:300]
    print(f"qcal {name}: internal error: {type(err).__name__}: {message}; full traceback in "
          f"{log}; please report it", file=sys.stderr)
    return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
