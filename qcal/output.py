"""Guarding a run's output: what qcal may replace, the `<out>.work` state dir, the lock.

No orchestration here: `qcal.run` enters `guarded_output` as one stage of a recipe's run,
and `qcal quantize --awq-artifact` around its replay.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
from collections.abc import Iterator
from pathlib import Path

from qcal.config import QuantScheme
from qcal.errors import ConfigError
from qcal.fsio import (
    MARKER,
    check_output,
    check_writable,
    clean_stale_siblings,
    marker_text,
    read_marker,
)
from qcal.locking import exclusive_lock
from qcal.model.sequential import PROGRESS_FILE, read_progress
from qcal.packing.checkpoint import CHECKPOINT_KIND, is_legacy_qcal_checkpoint

WORK_KIND = "quantization work state"


@dataclasses.dataclass(frozen=True)
class OutputPolicy:
    """What the user allowed for the output: replace foreign content, resume, keep state."""

    overwrite: bool = False
    resume: bool = False
    keep_work: bool = False


def work_dir_for(out_dir: Path) -> Path:
    return Path(str(out_dir) + ".work")


def default_output_dir(model: str | Path | None, method: str, scheme: QuantScheme,
                       tag: str = "") -> Path:
    from qcal.paths import DEFAULT_MODEL_NAME, runs_dir

    base = Path(model).name if model else DEFAULT_MODEL_NAME
    g = "c" if scheme.group_size == -1 else str(scheme.group_size)
    sym = "-sym" if scheme.sym else ""
    return runs_dir() / f"{base}-{method}-w{scheme.bits}g{g}{sym}{tag}"


@contextlib.contextmanager
def guarded_output(out_dir: Path, model_dir: Path | None, policy: OutputPolicy,
                   expected_bytes: int = 0) -> Iterator[Path]:
    """Check the output and its `<out>.work` state dir, lock them, yield the work dir.

    Before any work: the output may replace only qcal's own checkpoint (or anything,
    with --overwrite) and never the model or its parents; the disk must be writable
    with room for `expected_bytes`; a second run on the same output is refused; saved
    progress of a killed run needs --resume (continue) or --overwrite (start over).
    On success the work dir is removed unless `keep_work`.
    """
    out_dir = Path(out_dir)
    work = work_dir_for(out_dir)
    check_output(out_dir, CHECKPOINT_KIND, overwrite=policy.overwrite, protected=(model_dir,),
                 legacy_owned=is_legacy_qcal_checkpoint)
    check_output(work, WORK_KIND, overwrite=policy.overwrite, protected=(model_dir,),
                 legacy_owned=lambda p: (p / PROGRESS_FILE).is_file())
    check_writable(out_dir, expected_bytes)
    work.mkdir(parents=True, exist_ok=True)
    if read_marker(work) is None:
        (work / MARKER).write_text(marker_text(WORK_KIND), encoding="utf-8")
    busy = (f"another `qcal quantize` is writing {out_dir}; wait for it to finish or choose "
            "another -o")
    with exclusive_lock(work / ".lock", busy):
        clean_stale_siblings(out_dir)
        if (work / PROGRESS_FILE).is_file() and not policy.resume:
            if not policy.overwrite:
                progress = read_progress(work)
                done = int(progress["done"]) + 1 if progress else 0
                raise ConfigError(f"{work} holds an interrupted run ({done} layers done); add "
                                  "--resume to continue it, or --overwrite to start over")
            _empty_work_dir(work)
        try:
            yield work
        except BaseException:
            # Keep finished layers for --resume; a run that saved nothing leaves nothing.
            if not (work / PROGRESS_FILE).is_file():
                shutil.rmtree(work, ignore_errors=True)
            raise
    if not policy.keep_work:
        shutil.rmtree(work, ignore_errors=True)


def _empty_work_dir(work: Path) -> None:
    for entry in work.iterdir():
        if entry.name in {MARKER, ".lock"}:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
