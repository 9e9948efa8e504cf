"""Measurements of the selector-cost study (scripts/bench_selectors.py): the candidate pool
both selectors get, and the lexical statistics of a selected set."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from qcal.calib.manifest import token_statistics
from qcal.calib.windows import WindowPool, build_windows
from qcal.errors import QcalError


def load_pool(source: str, langs: list[str], n_docs: int, seqlen: int, seed: int,
              tokenizer: Any) -> tuple[WindowPool, dict[str, Any]]:
    """A pool of `seqlen`-token windows, one per document, from `n_docs` documents of `source`
    (a seeded sample of its calib split), and what it holds."""
    from qcal.data import resolve_source

    docs = resolve_source(source, split="calib", langs=langs)
    if len(docs) < n_docs:
        raise QcalError(f"{source} {langs} has {len(docs)} calib documents, fewer than "
                        f"--docs {n_docs}; add languages with --langs")
    pick = np.sort(np.random.default_rng(seed).choice(len(docs), size=n_docs, replace=False))
    docs = [docs[i] for i in pick]
    started = time.perf_counter()
    pool = build_windows(docs, tokenizer, seqlen, max_windows_per_doc=1)
    seconds = time.perf_counter() - started
    per_lang = {lang: sum(d.lang == lang for d in docs) for lang in langs}
    return pool, {"documents": len(docs), "documents_per_language": per_lang,
                  "windows": len(pool), "windowing_seconds": round(seconds, 3)}


def set_stats(pool: WindowPool, indices: list[int]) -> dict[str, Any]:
    """Lexical statistics of the windows `indices` of `pool`."""
    ids = pool.ids[torch.tensor(indices)]
    st = token_statistics(ids, [pool.langs[i] for i in indices], pool.tokenizer.all_special_ids)
    return {"types": st["types"], "type_token_ratio": st["type_token_ratio"],
            "zipf_exponent": st["zipf"]["exponent"], "languages": st["per_language_tokens"]}
