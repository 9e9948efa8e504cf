"""One fingerprint scheme and one step cache for everything qcal computes and reuses.

`fingerprint(...)` hashes canonical JSON of configs (dataclasses), dicts, strings and
numbers, and the bytes of tensors; every cache key and every resume check uses it.
`StepCache` keeps finished steps (calibration sets, checkpoints, evaluations) under
`<root>/<step>/<name>-<key>`; a step is reused only when its key, that is everything
that determines its result, is unchanged. `JsonSteps` keeps a benchmark script's JSON step
results there the same way.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from qcal.fsio import plain_name

KEY_CHARS = 12


def _unset_later_field(field: dataclasses.Field, value: Any) -> bool:
    """A field added after keys were first written (metadata `key_if_set`) joins the key
    only when set, so everything cached before it existed keeps its key."""
    return bool(field.metadata.get("key_if_set")) and getattr(value, field.name) == field.default


def _canonical(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"__type__": type(value).__name__,
                **{f.name: _canonical(getattr(value, f.name)) for f in dataclasses.fields(value)
                   if f.compare and not _unset_later_field(f, value)}}
    if isinstance(value, torch.Tensor):
        data = value.detach().cpu().contiguous()
        digest = hashlib.sha256(data.view(torch.uint8).numpy().tobytes()
                                if data.numel() else b"").hexdigest()
        return {"__tensor__": [str(data.dtype), list(data.shape), digest]}
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return repr(value)


def fingerprint(*parts: Any) -> str:
    """Hex digest identifying `parts` (configs, dicts, tensors, strings): equal parts, equal key."""
    text = json.dumps([_canonical(p) for p in parts], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class StepCache:
    """Finished steps under `root`, addressed by (step, readable name, fingerprint key)."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)

    def path(self, step: str, name: str, key: str) -> Path:
        safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in name).strip("-.") or "x"
        return self.root / plain_name(step, "cache step") / f"{safe[:80]}-{key[:KEY_CHARS]}"


class JsonSteps:
    """A benchmark's steps whose results are JSON, each kept in a `StepCache` under the
    fingerprint of the `setting` they share: an interrupted run resumes where it stopped,
    and a run with another setting computes its own results beside these, never mixing them.

    `results` holds, in the order the run asked for them, every step found or computed."""

    def __init__(self, cache: StepCache, step: str, setting: Any) -> None:
        self.cache, self.step, self.key = cache, step, fingerprint(setting)
        self.results: dict[str, Any] = {}

    def file(self, name: str) -> Path:
        return self.cache.path(self.step, name, self.key) / "result.json"

    def other_settings(self) -> list[Path]:
        """Step results kept under another setting: a work folder holding them also holds
        that setting's files (checkpoints), so a script refuses to mix the two."""
        folder = self.cache.root / self.step
        mine = f"-{self.key[:KEY_CHARS]}"
        return sorted(p for p in folder.glob("*") if not p.name.endswith(mine)) if folder.is_dir() else []

    def get(self, name: str) -> Any | None:
        """The step's saved result, or None when it has not run under this setting."""
        if name not in self.results and self.file(name).is_file():
            self.results[name] = json.loads(self.file(name).read_text(encoding="utf-8"))
        return self.results.get(name)

    def run(self, name: str, compute: Callable[[], Any],
            redo: Callable[[Any], bool] = lambda _: False) -> Any:
        """The step's saved result, else (or when `redo(saved)`) `compute()`'s, saved first."""
        from qcal.fsio import atomic_write_text

        saved = self.get(name)
        if saved is None or redo(saved):
            self.results[name] = compute()
            atomic_write_text(self.file(name), json.dumps(self.results[name], indent=1))
        return self.results[name]
