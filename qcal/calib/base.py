"""CalibSet, the selector protocol and registry, and the statistics every manifest carries.

A selector sees a `WindowPool` (fixed `seqlen`-token candidate windows cut from
documents, see `qcal.calib.windows`) and returns which windows to keep. Everything
else (tokenizing, packing, manifest, digest, saving) is shared, so every selector's
set has the same shape and feeds every quantizer unchanged.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
import torch

from qcal.errors import QcalError
from qcal.registry import Registry

if TYPE_CHECKING:
    from qcal.calib.windows import WindowPool

MANIFEST_VERSION = 1


class CalibSetError(QcalError, ValueError):
    """A calibration set is missing, corrupted, or does not fit the request."""


class NotEnoughDataError(QcalError, ValueError):
    """The candidate pool cannot fill the requested number of windows."""


@dataclasses.dataclass(frozen=True)
class Selection:
    """What a selector returns: pool indices (in selection order) plus selector-specific facts."""

    indices: list[int]
    info: dict[str, Any] = dataclasses.field(default_factory=dict)


@runtime_checkable
class CalibrationSelector(Protocol):
    """Chooses `n` windows from a pool; deterministic for a given `seed`."""

    name: str

    def params(self) -> dict[str, Any]:
        """JSON-serialisable parameters; they go into the manifest and the digest."""
        ...

    def select(self, pool: WindowPool, n: int, seed: int) -> Selection: ...


SelectorFactory = Callable[..., CalibrationSelector]
SELECTORS: Registry[SelectorFactory] = Registry("calibration selector")


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


def _jsonable(value: Any) -> Any:
    """Manifest values as plain JSON (NaN becomes null, tuples lists)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (np.integer, np.floating)):
        return _jsonable(value.item())
    return value


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
        from qcal.calib.io import save_calib_set

        return save_calib_set(self, Path(out_dir))

    @classmethod
    def load(cls, path: Path | str) -> CalibSet:
        from qcal.calib.io import load_calib_set

        return load_calib_set(Path(path))


def make_calib_set(pool: WindowPool, selection: Selection, selector: CalibrationSelector,
                   n: int, seed: int, source: str | None = None) -> CalibSet:
    """Gather the selected windows and write the manifest (the shared tail of every selector)."""
    idx = list(selection.indices)
    if len(idx) != n or len(set(idx)) != n:
        raise CalibSetError(
            f"selector {selector.name!r} returned {len(idx)} indices ({len(set(idx))} distinct) "
            f"for n={n}; this is a bug in the selector"
        )
    ids = pool.ids[torch.tensor(idx, dtype=torch.long)].clone()
    langs = [pool.langs[i] for i in idx]
    params = _jsonable(selector.params())
    special = [t for t in getattr(pool.tokenizer, "all_special_ids", []) or [] if t is not None]
    manifest = {
        "format_version": MANIFEST_VERSION,
        "selector": selector.name,
        "params": params,
        "seed": seed,
        "nsamples": n,
        "seqlen": pool.seqlen,
        "source": source,
        "tokenizer": tokenizer_info(pool.tokenizer),
        "pool": pool.summary(),
        "samples": [{"lang": langs[k], "documents": list(pool.doc_ids[i]), "pool_index": i}
                    for k, i in enumerate(idx)],
        "statistics": token_statistics(ids, langs, special),
        "selection": selection.info,
        "digest": content_digest(ids, selector.name, params, seed),
    }
    return CalibSet(ids, _jsonable(manifest))
