"""The selector protocol and registry, and the shared tail that turns a selection into a CalibSet.

A selector sees a `WindowPool` (fixed `seqlen`-token candidate windows cut from
documents, see `qcal.calib.windows`) and returns which windows to keep. Everything
else (tokenizing, packing, manifest, digest, saving) is shared, so every selector's
set has the same shape and feeds every quantizer unchanged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

from qcal.calib.io import CalibSet
from qcal.calib.manifest import (
    MANIFEST_VERSION,
    CalibSetError,
    content_digest,
    jsonable,
    token_statistics,
    tokenizer_info,
)
from qcal.registry import Registry

if TYPE_CHECKING:
    from qcal.calib.windows import WindowPool


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
    params = jsonable(selector.params())
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
    return CalibSet(ids, jsonable(manifest))
