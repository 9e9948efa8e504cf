"""Every file qcal writes goes through here: atomic writes, output-directory ownership,
plain names, free-space checks, locks and stale-temp cleanup.

The rules protect the user's files:
- qcal replaces a directory only when a marker file (`.qcal-output.json`) says qcal
  wrote it as an output of the same kind; anything else needs `--overwrite`;
- an output can never be the model directory, one of its parents, the working
  directory or one of its parents (not even with `--overwrite`);
- temp files and directories carry a qcal-specific infix, and cleanup removes only
  entries with that infix (directories: only when they also hold the marker);
- names that become path components are plain names (no separators, no `..`).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from qcal.errors import ConfigError, QcalError

MARKER = ".qcal-output.json"
TMP_INFIX = ".qcal-tmp-"
OLD_INFIX = ".qcal-old-"
PLAIN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+=-]{0,127}$")
# Headroom on top of an expected size: filesystems round up, JSON/tokenizer files add up.
SPACE_MARGIN = 1.1
SPACE_SLACK_BYTES = 16 * 2**20


class DiskFullError(QcalError, OSError):
    """The disk filled up (or was too small to start) while writing an output."""


def plain_name(name: str, what: str) -> str:
    """`name` if it is safe as one path component (letters, digits, . _ + = -), else an error."""
    if not isinstance(name, str) or not PLAIN_NAME.match(name) or name in {".", ".."} or ".." in name:
        raise ConfigError(
            f"{what} {name!r} is not a plain name; use letters, digits and . _ - "
            "(no '/', no '..', at most 128 characters)"
        )
    return name


def _is_within(child: Path, parent: Path) -> bool:
    try:
        child.relative_to(parent)
        return True
    except ValueError:
        return False


def read_marker(path: Path) -> dict | None:
    try:
        data = json.loads((Path(path) / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def marker_text(kind: str) -> str:
    return json.dumps({"written_by": "qcal", "kind": kind}) + "\n"


def check_output(out: Path | str, kind: str, *, overwrite: bool = False,
                 protected: tuple[Path | str | None, ...] = (),
                 legacy_owned: Callable[[Path], bool] | None = None) -> Path:
    """Refuse an output path whose replacement could destroy something qcal did not write.

    `kind` names the output ("checkpoint", "calibration set", ...); `protected` are
    inputs (the model directory) that the output may not be, nor contain. A directory
    from an older qcal without a marker counts as its own when `legacy_owned` says so.
    """
    out = Path(out).expanduser().absolute()
    resolved = out.resolve()
    guarded = [Path(p).expanduser().resolve() for p in protected if p is not None]
    guarded.append(Path.cwd().resolve())
    for inp in guarded:
        if _is_within(inp, resolved):
            what = "the working directory" if inp == Path.cwd().resolve() else str(inp)
            raise ConfigError(
                f"output {out} is {what} or one of its parents; writing there would replace "
                "it: choose a new directory for -o (e.g. runs/<name>)"
            )
    refuse_inside_inputs(out, protected)
    if resolved == Path(resolved.anchor) or resolved == Path.home().resolve():
        raise ConfigError(f"output {out} is a root or home directory; choose a new directory for -o")
    if not out.exists() and not out.is_symlink():
        return out
    if out.is_symlink() or not out.is_dir():
        if overwrite and not out.is_symlink():
            return out
        raise ConfigError(f"output {out} exists and is not a directory; remove it or pass "
                          "--overwrite to replace it")
    if not any(out.iterdir()):
        return out
    mark = read_marker(out)
    if mark is not None and mark.get("kind") == kind:
        return out
    if mark is None and legacy_owned is not None and legacy_owned(out):
        return out
    if overwrite:
        return out
    held = f"holds a qcal {mark['kind']}" if mark else "holds files qcal did not write"
    raise ConfigError(f"output {out} {held}; choose another -o, or pass --overwrite to replace "
                      f"it with the {kind}")


def wrote_result_file(path: Path) -> bool:
    """True when `path` is a results file qcal wrote: JSON whose `provenance` holds qcal's
    fields (command, date, git_commit, machine), or Markdown that opens with that provenance."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    if Path(path).suffix == ".json":
        try:
            data = json.loads(text)
        except ValueError:
            return False
        prov = data.get("provenance") if isinstance(data, dict) else None
        return isinstance(prov, dict) and {"command", "date", "git_commit", "machine"} <= set(prov)
    head = text[:4000]
    return "\n- Command: `" in head and "\n- Date: " in head and "\n- Machine: " in head


def refuse_inside_inputs(out: Path | str, inputs: tuple[Path | str | None, ...]) -> None:
    """An output inside an input folder would change that input (a model folder gaining a
    safetensors file that qcal then reads as weights, its config.json replaced): refused,
    whatever --overwrite says."""
    resolved = Path(out).expanduser().absolute().resolve()
    for inp in inputs:
        if inp is None or not Path(inp).expanduser().is_dir():
            continue
        folder = Path(inp).expanduser().resolve()
        if resolved != folder and _is_within(resolved, folder):
            raise ConfigError(f"output {out} lies inside the input folder {inp}; writing there "
                              "would change that input: choose -o outside it")


def check_file_outputs(main: Path | str, companions: tuple[Path | str, ...] = (), *,
                       overwrite: bool = False, inputs: tuple[Path | str | None, ...] = ()) -> None:
    """The file twin of `check_output`: `main` (a results JSON/Markdown) and its
    `companions` (plots, item lists written beside it) may be replaced only when qcal wrote
    them (companions count as qcal's when `main` is), else only with `--overwrite`. A
    directory or a symlink in the way is refused either way, and so is any of them inside
    an `inputs` folder."""
    refuse_inside_inputs(main, inputs)
    main = Path(main).expanduser().absolute()
    owned = not main.exists() or wrote_result_file(main)
    for path in (main, *map(Path, companions)):
        path = Path(path).expanduser().absolute()
        if path.is_symlink() or path.is_dir():
            raise ConfigError(f"output {path} is a {'link' if path.is_symlink() else 'directory'}"
                              "; choose another -o (qcal replaces only plain files it wrote)")
        if not path.exists():
            continue
        mine = wrote_result_file(path) if path.suffix in (".json", ".md") else owned
        if not mine and not overwrite:
            raise ConfigError(f"output {path} exists and qcal did not write it; choose another "
                              "-o, or pass --overwrite to replace it")
    check_writable(main)


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks (sdists and wheels run to hundreds of MB)."""
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def content_digest(path: Path, *salt: str) -> str:
    """sha256 over a file's bytes, or over a folder's files (relative names and bytes, in
    name order), plus `salt` strings: equal content, equal digest."""
    digest = hashlib.sha256("\0".join(salt).encode("utf-8"))
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for f in files:
        digest.update(str(f.relative_to(path) if f != path else f.name).encode("utf-8") + b"\0")
        with open(f, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def free_bytes(path: Path) -> int:
    """Free space of the filesystem `path` would live on (its nearest existing ancestor)."""
    probe = Path(path).absolute()
    while not probe.exists():
        probe = probe.parent
    return shutil.disk_usage(probe).free


def is_writable_dir(path: Path) -> bool:
    return path.is_dir() and os.access(path, os.W_OK | os.X_OK)


def check_writable(path: Path | str, expected_bytes: int = 0) -> None:
    """Before any work: the output's parent must be writable and have room for it."""
    path = Path(path).absolute()
    probe = path.parent
    while not probe.exists():
        probe = probe.parent
    if not is_writable_dir(probe):
        raise ConfigError(f"cannot write {path}: {probe} is not a writable directory; choose "
                          "another -o or fix its permissions")
    need = int(expected_bytes * SPACE_MARGIN) + SPACE_SLACK_BYTES
    have = free_bytes(probe)
    if have < need:
        raise DiskFullError(f"not enough free space for {path}: about {need / 2**20:.0f} MiB "
                            f"needed, {have / 2**20:.0f} MiB free on that disk; free space or "
                            "choose another -o")


def _is_disk_full(err: BaseException) -> bool:
    """ENOSPC from the OS, or as the safetensors writer (Rust) reports it in its message."""
    if isinstance(err, OSError):
        return err.errno in (errno.ENOSPC, errno.EDQUOT)
    text = str(err)
    return "No space left on device" in text or "os error 28" in text


def _disk_full(target: Path) -> QcalError:
    return DiskFullError(f"the disk filled up while writing {target} (nothing was left "
                         "behind); free space or choose another -o, then run again")


def _tmp_sibling(target: Path) -> str:
    # Host and pid in the name: cleanup can tell a live writer's temp file from a dead one's.
    return f".{target.name}{TMP_INFIX}{_HOST}-{os.getpid()}-"


_HOST = re.sub(r"[^A-Za-z0-9]", "", os.uname().nodename)[:32] or "host"
STALE_FOREIGN_SECONDS = 24 * 3600


def _writer_is_gone(stale: Path, infix: str) -> bool:
    """True unless the temp entry belongs to a process that may still be writing it."""
    import time

    tail = stale.name.split(infix, 1)[-1]
    host, _, rest = tail.partition("-")
    pid_text = rest.split("-", 1)[0]
    try:
        old = time.time() - stale.lstat().st_mtime > STALE_FOREIGN_SECONDS
    except OSError:
        return False
    if host != _HOST or not pid_text.isdigit():
        return old  # another machine (shared disk) or an old name: only long-abandoned ones
    try:
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass
    return old  # alive (or the pid was reused): stale only when long abandoned


def atomic_write_bytes(path: Path | str, data: bytes) -> None:
    """Write `path` via a temp sibling and rename: readers see the old or the new file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=_tmp_sibling(path))
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600; give the usual mode
        os.replace(tmp, path)
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        if _is_disk_full(err):
            raise _disk_full(path) from None
        raise


def atomic_write_text(path: Path | str, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_dir_atomically(out_dir: Path | str, fill: Callable[[Path], None], kind: str) -> Path:
    """Create `out_dir` by filling a marked temp sibling and renaming it into place.

    The caller has checked with `check_output` that replacing `out_dir` is allowed.
    A kill leaves only a hidden `.<name>.qcal-tmp-*` sibling, removed by the next run
    (`clean_stale_siblings`). A full disk removes the partial output and says so.
    """
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_siblings(out_dir)
    before = _identity(out_dir)  # what check_output allowed to be replaced
    tmp = Path(tempfile.mkdtemp(prefix=_tmp_sibling(out_dir), dir=out_dir.parent))
    try:
        (tmp / MARKER).write_text(marker_text(kind), encoding="utf-8")
        fill(tmp)
        tmp.chmod(0o777 & ~_umask())  # mkdtemp creates 0700
        _recheck_destination(out_dir, before, tmp, kind)
        if out_dir.exists() or out_dir.is_symlink():
            old = out_dir.with_name(f".{out_dir.name}{OLD_INFIX}{_HOST}-{os.getpid()}-x")
            out_dir.rename(old)
            tmp.rename(out_dir)
            _remove(old)
        else:
            tmp.rename(out_dir)
    except BaseException as err:
        shutil.rmtree(tmp, ignore_errors=True)
        if _is_disk_full(err):
            raise _disk_full(out_dir) from None
        raise
    return out_dir


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def _recheck_destination(out_dir: Path, before: tuple[int, int] | None, tmp: Path,
                         kind: str) -> None:
    """The output was checked when the run started; what stands at `out_dir` now may be
    something else (a folder the user made meanwhile). Replace only what was there then, or
    an empty folder, or a qcal output; otherwise keep the result beside it and say so."""
    now = _identity(out_dir)
    if now is None or now == before:
        return
    if out_dir.is_dir() and not out_dir.is_symlink() and (
            read_marker(out_dir) is not None or not any(out_dir.iterdir())):
        return
    keep = out_dir.with_name(f"{out_dir.name}.qcal-new")
    if keep.exists() or keep.is_symlink():
        keep = out_dir.with_name(f"{out_dir.name}.qcal-new-{os.getpid()}")
    tmp.rename(keep)
    raise ConfigError(f"{out_dir} appeared while qcal was writing and holds something qcal did "
                      f"not write: it was left untouched; the finished {kind} is in {keep}")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def clean_stale_siblings(target: Path | str) -> list[Path]:
    """Remove what an interrupted atomic write of `target` left: qcal's own temp/old siblings."""
    target = Path(target)
    removed = []
    if not target.parent.is_dir():
        return removed
    for infix in (TMP_INFIX, OLD_INFIX):
        for stale in target.parent.glob(f".{glob_escape(target.name)}{infix}*"):
            if stale.is_dir() and not stale.is_symlink() and read_marker(stale) is None:
                continue  # not a directory qcal made: leave it
            if not _writer_is_gone(stale, infix):
                continue  # a live writer's (another shard or worker): not stale
            _remove(stale)
            removed.append(stale)
    return removed


def clean_stale_tree(root: Path | str) -> list[Path]:
    """Remove qcal's own interrupted-write leftovers anywhere under `root` (a qcal-owned tree)."""
    root = Path(root)
    removed = []
    if not root.is_dir():
        return removed
    for infix in (TMP_INFIX, OLD_INFIX):
        for stale in root.rglob(f".*{infix}*"):
            if stale.is_dir() and not stale.is_symlink() and read_marker(stale) is None:
                continue
            if not _writer_is_gone(stale, infix):
                continue
            _remove(stale)
            removed.append(stale)
    return removed


def glob_escape(text: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", text)
