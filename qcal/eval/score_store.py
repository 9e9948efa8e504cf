"""Per-request log-likelihoods of one model, kept on disk as they are computed, so an
lm-eval run that is interrupted (a killed grid, a session that ends) resumes where it
stopped instead of scoring thousands of items again.

A store is one JSON-lines file: a header naming the model it belongs to (a digest of
its weights, config and tokenizer, the device and dtype it ran in), then one line per scored request: a digest
of its context and continuation tokens, the log-likelihood and the greedy flag. Floats
round-trip exactly through JSON. A file whose header names another model (the checkpoint
was rebuilt, another dtype) is started over; a last line cut short by a kill is ignored.
Plain JSON only: reading a store never runs code.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from qcal.errors import ConfigError
from qcal.fsio import atomic_write_text

FORMAT = "qcal-scores/1"


# Files beside the weights that record how a folder was made (timings, dates, peak memory)
# rather than what the model computes: two builds of the same weights differ only in these.
NOTE_FILES = frozenset({"quant_log.json", "PROVENANCE.json", ".qcal-output.json"})
_CHUNK = 2**24


def model_identity(model_dir: Path) -> str:
    """A digest of what a model directory computes with: the content of its weights,
    config and tokenizer files (not the notes of how it was built, NOTE_FILES and *.md).
    A rebuilt checkpoint with other weights gets a new identity and its old scores are
    never reused; the same weights rebuilt on a fresh machine (a provisioned float model,
    a deterministic quantization) keep theirs, so a committed store resumes there. Hashing
    reads the files once (seconds for a 7 GB model, beside hours of scoring)."""
    digest = hashlib.sha256()
    for path in sorted(Path(model_dir).iterdir()):
        if not path.is_file() or path.name in NOTE_FILES or path.suffix == ".md":
            continue
        digest.update(f"{path.name}\0{path.stat().st_size}\0".encode())
        with path.open("rb") as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
    return digest.hexdigest()[:24]


def request_key(context: Sequence[int], continuation: Sequence[int]) -> str:
    # Plain sha256 of the token lists rather than qcal.cache.fingerprint, whose per-value
    # canonicalisation would cost seconds over tens of thousands of requests.
    return hashlib.sha256(json.dumps([list(context), list(continuation)]).encode()).hexdigest()[:32]


def parse_scores(lines: Sequence[str]) -> dict[str, tuple[float, bool]]:
    """{request key: (log-likelihood, greedy)} from a store's lines after its header."""
    scores = {}
    for line in lines:
        try:
            key, ll, greedy = json.loads(line)
        except ValueError:
            continue  # the line a kill cut short (or the empty one after the last newline)
        scores[key] = (float(ll), bool(greedy))
    return scores


class ScoreStore:
    """Scores of one model's log-likelihood requests, appended to `path` as they come."""

    def __init__(self, path: Path | str, identity: dict[str, Any]) -> None:
        self.path = Path(path)
        self.header = {"format": FORMAT, **identity}
        self.scores: dict[str, tuple[float, bool]] = {}
        self._pending: list[str] = []
        if self.path.is_file() and self._load():
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.path, json.dumps(self.header) + "\n")

    def _load(self) -> bool:
        """Read a store of this model; False when the file belongs to another one."""
        lines = self.path.read_text(encoding="utf-8").split("\n")
        try:
            header = json.loads(lines[0])
        except ValueError:
            header = None
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            raise ConfigError(f"{self.path} is not a qcal score store; move it away (qcal does "
                              "not overwrite files it did not write)")
        if header != self.header:
            return False
        self.scores.update(parse_scores(lines[1:]))
        if lines[-1]:  # a cut-short last line: end the file before appending after it
            with self.path.open("a", encoding="utf-8") as f:
                f.write("\n")
        return True

    def get(self, key: str) -> tuple[float, bool] | None:
        return self.scores.get(key)

    def add(self, key: str, answer: tuple[float, bool]) -> None:
        ll, greedy = answer
        self.scores[key] = (float(ll), bool(greedy))
        self._pending.append(json.dumps([key, float(ll), bool(greedy)]))

    def flush(self) -> None:
        """Put the scores added since the last flush on disk."""
        if not self._pending:
            return
        with self.path.open("a", encoding="utf-8") as f:
            f.write("\n".join(self._pending) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self._pending = []
