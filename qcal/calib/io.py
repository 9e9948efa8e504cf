"""CalibSet and its I/O: ``<dir>/input_ids.safetensors`` + ``<dir>/manifest.json``.

Sets live under ``calib_sets/`` in qcal's home (see `qcal.paths`; ``$QCAL_CALIB_DIR`` overrides)
and are referred to by directory path or by name inside that folder. Saving is
atomic (a temp sibling directory renamed into place); loading re-computes the
digest, so a set whose ids were edited or truncated is refused.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch

from qcal.calib.manifest import CalibSetError, content_digest

IDS_FILE = "input_ids.safetensors"
MANIFEST_FILE = "manifest.json"
CALIB_SET_KIND = "calibration set"


@dataclasses.dataclass
class CalibSet:
    """Selected calibration windows: `input_ids` [n, seqlen] plus their manifest."""

    input_ids: torch.Tensor
    manifest: dict[str, Any]

    def __post_init__(self) -> None:
        if self.input_ids.dim() != 2 or self.input_ids.dtype != torch.long:
            raise CalibSetError(
                f"input_ids must be a LongTensor [n, seqlen], got {self.input_ids.dtype} "
                f"{tuple(self.input_ids.shape)}"
            )

    @property
    def digest(self) -> str:
        return str(self.manifest["digest"])

    @property
    def nsamples(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def seqlen(self) -> int:
        return int(self.input_ids.shape[1])

    def save(self, out_dir: Path | str) -> Path:
        return save_calib_set(self, Path(out_dir))

    @classmethod
    def load(cls, path: Path | str) -> CalibSet:
        return load_calib_set(Path(path))


def is_legacy_calib_set(path: Path) -> bool:
    """A set an older qcal wrote (before output markers): exactly its two files."""
    names = {p.name for p in Path(path).iterdir()}
    return names == {IDS_FILE, MANIFEST_FILE}


def calib_sets_dir() -> Path:
    from qcal.paths import calib_sets_dir as home_calib_sets

    return home_calib_sets()


def is_calib_set(path: Path | str) -> bool:
    p = Path(path)
    return (p / MANIFEST_FILE).is_file() and (p / IDS_FILE).is_file()


def find_calib_set(name: str | Path) -> Path | None:
    """The directory of a saved set given as a path or a name under calib_sets/, else None."""
    p = Path(name).expanduser()
    if is_calib_set(p):
        return p
    named = calib_sets_dir() / str(name)
    return named if is_calib_set(named) else None


def save_calib_set(calib: CalibSet, out_dir: Path) -> Path:
    from safetensors.torch import save_file

    from qcal.fsio import write_dir_atomically

    def fill(tmp: Path) -> None:
        # int32 on disk halves the size (token ids < 2**31); loading returns a LongTensor.
        small = calib.input_ids.numel() == 0 or int(calib.input_ids.max()) < 2**31
        ids = (calib.input_ids.to(torch.int32) if small else calib.input_ids).contiguous()
        save_file({"input_ids": ids}, str(tmp / IDS_FILE), metadata={"digest": calib.digest})
        (tmp / MANIFEST_FILE).write_text(json.dumps(calib.manifest, indent=2, ensure_ascii=False)
                                         + "\n", encoding="utf-8")

    write_dir_atomically(Path(out_dir), fill, CALIB_SET_KIND)
    return Path(out_dir)


def load_calib_set(path: Path) -> CalibSet:
    from safetensors.torch import load_file

    found = find_calib_set(path)
    if found is None:
        raise CalibSetError(
            f"no calibration set at {path} (expected {IDS_FILE} and {MANIFEST_FILE}); build one "
            "with `qcal calib build ... -o DIR` or see `qcal calib list`"
        )
    try:
        manifest = json.loads((found / MANIFEST_FILE).read_text(encoding="utf-8"))
        ids = load_file(str(found / IDS_FILE))["input_ids"].to(torch.long)
    except (OSError, ValueError, KeyError) as err:
        raise CalibSetError(f"calibration set {found} is unreadable ({err}); rebuild it") from None
    expected = content_digest(ids, manifest.get("selector", ""), manifest.get("params", {}),
                              manifest.get("seed", 0))
    if manifest.get("digest") != expected:
        raise CalibSetError(f"calibration set {found} fails its digest check (ids or manifest "
                            "changed after saving); rebuild it with `qcal calib build`")
    return CalibSet(ids, manifest)


def list_calib_sets(root: Path | None = None) -> list[dict[str, Any]]:
    """One summary row per saved set under `root` (default calib_sets/)."""
    root = Path(root) if root is not None else calib_sets_dir()
    rows = []
    if not root.is_dir():
        return rows
    for d in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if not is_calib_set(d):
            continue
        try:
            m = json.loads((d / MANIFEST_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            rows.append({"name": d.name, "path": str(d), "error": "unreadable manifest"})
            continue
        stats = m.get("statistics", {})
        rows.append({"name": d.name, "path": str(d), "selector": m.get("selector"),
                     "params": m.get("params"), "nsamples": m.get("nsamples"),
                     "seqlen": m.get("seqlen"), "seed": m.get("seed"), "source": m.get("source"),
                     "types": stats.get("types"), "languages": stats.get("per_language_tokens"),
                     "digest": str(m.get("digest", ""))[:12]})
    return rows
