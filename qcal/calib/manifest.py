"""What every calibration set carries: its errors, its manifest's statistics and its digest.

The bottom of qcal.calib: selectors (`qcal.calib.base`), windows (`qcal.calib.windows`) and
saving and loading (`qcal.calib.io`) all build on it, and it imports none of them.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from qcal.errors import QcalError

MANIFEST_VERSION = 1


class CalibSetError(QcalError, ValueError):
    """A calibration set is missing, corrupted, or does not fit the request."""


class NotEnoughDataError(QcalError, ValueError):
    """The candidate pool cannot fill the requested number of windows."""


def content_digest(input_ids: torch.Tensor, selector: str, params: dict[str, Any], seed: int) -> str:
    """sha256 over the token ids (int64, little endian, row-major) and the selector recipe."""
    h = hashlib.sha256()
    arr = np.ascontiguousarray(input_ids.to(torch.int64).cpu().numpy()).astype("<i8", copy=False)
    h.update(str(tuple(arr.shape)).encode())
    h.update(arr.tobytes())
    recipe = {"selector": selector, "params": params, "seed": seed}
    h.update(json.dumps(recipe, sort_keys=True, default=str).encode())
    return h.hexdigest()


def zipf_fit(counts: Sequence[int] | np.ndarray) -> dict[str, float]:
    """Least-squares fit of log f = c - s * log r over the rank-frequency curve.

    All ranks are used; `exponent` is s (about 1 for natural text), `r2` how
    straight the log-log curve is. Fewer than 3 types give NaN (nothing to fit).
    """
    freq = np.sort(np.asarray(counts, dtype=np.float64))[::-1]
    freq = freq[freq > 0]
    if freq.size < 3:
        return {"exponent": float("nan"), "intercept": float("nan"), "r2": float("nan")}
    x = np.log(np.arange(1, freq.size + 1, dtype=np.float64))
    y = np.log(freq)
    slope, intercept = np.polyfit(x, y, 1)
    resid = y - (slope * x + intercept)
    total = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float((resid**2).sum()) / total if total > 0 else float("nan")
    return {"exponent": round(float(-slope), 4), "intercept": round(float(intercept), 4),
            "r2": round(r2, 4)}


def token_statistics(input_ids: torch.Tensor, langs: Sequence[str],
                     special_ids: Sequence[int] = ()) -> dict[str, Any]:
    """Types, type/token ratio, hapax share, Zipf fit and per-language token counts.

    Special tokens (the EOS between packed documents) are excluded from the lexical
    statistics but counted in the per-language totals, which describe the tensor.
    """
    flat = input_ids.reshape(-1).tolist()
    counts = Counter(flat)
    for sid in special_ids:
        counts.pop(int(sid), None)
    tokens = sum(counts.values())
    per_lang: Counter[str] = Counter()
    for row, lang in zip(input_ids, langs, strict=True):
        per_lang[lang] += int(row.numel())
    hapax = sum(1 for c in counts.values() if c == 1)
    return {
        "tokens": tokens,
        "types": len(counts),
        "type_token_ratio": round(len(counts) / tokens, 6) if tokens else float("nan"),
        "hapax_fraction": round(hapax / len(counts), 6) if counts else float("nan"),
        "zipf": zipf_fit(list(counts.values())),
        "per_language_tokens": dict(sorted(per_lang.items())),
    }


def tokenizer_info(tokenizer: Any) -> dict[str, Any]:
    """Name, vocabulary size, EOS, a fingerprint of the vocabulary (ids are tokenizer-specific)
    and the special tokens every window starts with, if any."""
    from qcal.tokenization import text_prefix

    vocab = tokenizer.get_vocab()
    fp = hashlib.sha256(json.dumps(sorted(vocab.items(), key=lambda kv: kv[1])).encode())
    info = {"name_or_path": str(getattr(tokenizer, "name_or_path", "")), "vocab_size": len(vocab),
            "eos_token_id": tokenizer.eos_token_id, "fingerprint": fp.hexdigest()[:16]}
    prefix = text_prefix(tokenizer)
    if prefix:  # only where there is one: older manifests of other tokenizers stay equal
        info["prefix"] = prefix
    return info


def jsonable(value: Any) -> Any:
    """Manifest values as plain JSON (NaN becomes null, tuples lists)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (np.integer, np.floating)):
        return jsonable(value.item())
    return value
