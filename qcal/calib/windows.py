"""Candidate windows: fixed `seqlen`-token pieces cut from documents, never padded.

Rules (the same for every selector):
- Each document is tokenized without special tokens. Untagged documents get a
  language from `qcal.data.langid` (``"und"`` when it cannot tell).
- A document of at least `seqlen` tokens yields consecutive non-overlapping windows
  from its start (at most `max_windows_per_doc`); its tail (< seqlen) is dropped.
- Shorter documents are packed (default): consecutive short documents of the same
  language are concatenated with the tokenizer's EOS between them, and the stream is
  cut into windows. A window therefore never mixes languages. With packing off they
  are rejected. The leftover of a stream (< seqlen) is dropped.
- A tokenizer that prepends special tokens to every text (Gemma's ``<bos>``) gets
  them at the start of every window, which then holds `seqlen` tokens in all
  (`qcal.tokenization.text_prefix`); the rules above apply to the text after it.
- If the pool holds fewer windows than requested, `require` raises
  `NotEnoughDataError` saying how many there are and what to change.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from qcal.calib.manifest import NotEnoughDataError
from qcal.errors import ConfigError

UNKNOWN_LANG = "und"


@dataclasses.dataclass
class WindowPool:
    """Candidate windows: `ids` [N, seqlen] with each window's language and documents."""

    ids: torch.Tensor
    langs: list[str]
    doc_ids: list[tuple[str, ...]]
    seqlen: int
    tokenizer: Any
    stats: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    def subset(self, indices: Sequence[int]) -> WindowPool:
        """The pool restricted to `indices` (in that order); stats describe the parent."""
        idx = list(indices)
        return WindowPool(self.ids[torch.tensor(idx, dtype=torch.long)], [self.langs[i] for i in idx],
                          [self.doc_ids[i] for i in idx], self.seqlen, self.tokenizer,
                          {**self.stats, "subset_of": len(self)})

    def languages(self) -> list[str]:
        return sorted(set(self.langs))

    def summary(self) -> dict[str, Any]:
        per_lang: dict[str, int] = {}
        for lang in self.langs:
            per_lang[lang] = per_lang.get(lang, 0) + 1
        return {"windows": len(self), "windows_per_language": dict(sorted(per_lang.items())),
                **self.stats}

    def require(self, n: int, what: str = "calibration set") -> None:
        """Raise a clear `NotEnoughDataError` unless the pool can fill `n` windows."""
        if n <= 0:
            raise ConfigError(f"the {what} needs n >= 1 samples, got {n}")
        if len(self) >= n:
            return
        s = self.stats
        short = s.get("short_documents", 0)
        how = "packed with EOS between them" if s.get("pack", True) else "rejected (packing is off)"
        fewer = "ask for fewer samples (--nsamples; --n in `qcal calib build`)"
        fix = (f"{fewer}, lower --seqlen, or add text (a larger source or more languages)"
               if s.get("pack", True) else f"enable packing, {fewer}, lower --seqlen, or add text")
        raise NotEnoughDataError(
            f"the pool yields only {len(self)} windows of {self.seqlen} tokens from "
            f"{s.get('documents', '?')} documents ({short} shorter than seqlen, {how}); the {what} "
            f"needs {n}: {fix}. Windows are never padded."
        )


def tag_languages(docs: Sequence[Any]) -> tuple[list[str], int]:
    """Each document's language: its tag, else language-ID of its text, else ``"und"``.

    Returns the tags and how many documents needed language-ID.
    """
    from qcal.data.langid import detect_language, normalize_lang

    langs, detected = [], 0
    for doc in docs:
        if doc.lang:
            langs.append(normalize_lang(doc.lang))
            continue
        detected += 1
        langs.append(detect_language(doc.text) or UNKNOWN_LANG)
    return langs, detected


def _doc_key(doc: Any) -> str:
    return f"{doc.source}:{doc.doc_id}" if getattr(doc, "source", None) else str(doc.doc_id)


def build_windows(docs: Sequence[Any], tokenizer: Any, seqlen: int, pack: bool = True,
                  max_windows_per_doc: int | None = None) -> WindowPool:
    """Cut `docs` (objects with text, lang, source, doc_id) into candidate windows."""
    from qcal.tokenization import text_prefix

    prefix = text_prefix(tokenizer)
    if seqlen < 2 + len(prefix):
        raise ConfigError(f"seqlen={seqlen} is too small; use at least {2 + len(prefix)} tokens "
                          "(typically 128-2048)")
    full_seqlen, seqlen = seqlen, seqlen - len(prefix)
    if max_windows_per_doc is not None and max_windows_per_doc < 1:
        raise ConfigError(f"max_windows_per_doc={max_windows_per_doc} must be >= 1 (or None)")
    eos = tokenizer.eos_token_id
    if pack and eos is None:
        raise ConfigError("the tokenizer has no EOS token to separate packed documents; "
                          "pass pack=False (--no-pack) or use a tokenizer with an EOS token")
    langs, detected = tag_languages(docs)
    texts = [d.text for d in docs]
    token_lists = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []

    rows: list[list[int]] = []
    row_langs: list[str] = []
    row_docs: list[tuple[str, ...]] = []
    # One packing stream per language: (token buffer, documents it holds).
    streams: dict[str, tuple[list[int], list[str]]] = {}
    short = empty = tail_dropped = 0
    for doc, lang, toks in zip(docs, langs, token_lists, strict=True):
        key = _doc_key(doc)
        if not toks:
            empty += 1
            continue
        if len(toks) >= seqlen:
            k = len(toks) // seqlen
            if max_windows_per_doc is not None:
                k = min(k, max_windows_per_doc)
            for j in range(k):
                rows.append(list(toks[j * seqlen:(j + 1) * seqlen]))
                row_langs.append(lang)
                row_docs.append((key,))
            tail_dropped += len(toks) - k * seqlen
            continue
        short += 1
        if not pack:
            continue
        buf, held = streams.setdefault(lang, ([], []))
        if buf:
            buf.append(eos)
        buf.extend(toks)
        held.append(key)
        while len(buf) >= seqlen:
            rows.append(buf[:seqlen])
            row_langs.append(lang)
            row_docs.append(tuple(held))
            del buf[:seqlen]
            # Whatever remains belongs to the last document only (or to none).
            held[:] = [key] if buf else []
    leftover = sum(len(buf) for buf, _ in streams.values())
    rows = [prefix + row for row in rows]
    ids = (torch.tensor(rows, dtype=torch.long) if rows
           else torch.empty(0, full_seqlen, dtype=torch.long))
    stats = {"documents": len(docs), "short_documents": short, "empty_documents": empty,
             "language_id_documents": detected, "pack": pack,
             "max_windows_per_doc": max_windows_per_doc, "tail_tokens_dropped": tail_dropped,
             "pack_leftover_tokens_dropped": leftover}
    if prefix:  # absent otherwise, so manifests of prefix-free tokenizers stay as they were
        stats["prefix_tokens"] = prefix
    return WindowPool(ids, row_langs, row_docs, full_seqlen, tokenizer, stats)
