"""`qcal` command line: parse arguments, build configs, call the library; no logic here."""

from __future__ import annotations

import argparse
import errno
import importlib
import logging
import os
import shlex
import sys

from qcal_kernels.errors import KernelError

from qcal.errors import QcalError
from qcal.logs import to_stderr as log_to_stderr

COMMAND_MODULES = ("quantize", "evaluate", "calib", "compare", "export", "provision")
USER_FIXABLE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EROFS, errno.EPERM)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="qcal", description="Calibration-aware post-training quantization for HF causal LMs."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"qcal.commands.{name}")
        except ModuleNotFoundError as err:
            if err.name != f"qcal.commands.{name}":
                raise
            continue
        module.add_parser(sub)
    return parser


def command_prefix() -> list[str]:
    """How a script starts `qcal` in a subprocess: the console script installed beside the
    running interpreter (found even when the virtualenv is not activated), else `-m`."""
    beside = os.path.join(os.path.dirname(sys.executable), "qcal")
    return [beside] if os.access(beside, os.X_OK) else [sys.executable, "-m", "qcal.cli"]


def main(argv: list[str] | None = None) -> int:
    # The Hub is unreachable here by design: fail fast instead of retrying downloads.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    log_to_stderr()  # library messages (per-layer losses, ...) on stderr
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.command_line = "qcal " + shlex.join(str(a) for a in argv)  # for model cards and logs
    try:
        return int(args.handler(args) or 0)
    except (QcalError, KernelError) as err:
        print(f"qcal {args.command}: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        # Environment faults (full disk, permissions) are the user's to fix: one line.
        if err.errno not in USER_FIXABLE_ERRNOS:
            raise
        where = f" ({err.filename})" if err.filename else ""
        print(f"qcal {args.command}: error: {os.strerror(err.errno)}{where}; free space or fix "
              "permissions, then run again", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        hint = getattr(args, "interrupt_hint", None)
        print(f"qcal {args.command}: interrupted" + (f"; {hint}" if hint else ""), file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
