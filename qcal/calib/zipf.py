"""`zipf`: model-agnostic lexical-diversity selection (ZipCal-style greedy concept coverage).

Concepts. Every token id is mapped to a normalised "concept": the token decoded on its
own, lower-cased, with surrounding whitespace and BPE word markers (``Ġ``, ``▁``,
``Ċ``) stripped. Special tokens and tokens that normalise to nothing (pure
whitespace) map to no concept. A token that decodes to an incomplete UTF-8 sequence
(byte-level pieces of CJK text, say) keeps its raw piece, marker-stripped and
prefixed ``bytes:``, so different pieces stay different concepts. Hence ``The``,
``the`` and ``Ġthe`` are one concept; ``runs`` and ``run`` are two.

Objective (``objective="coverage"``, the default). Let C(w) be the set of concepts of
window w and S the windows chosen so far, covered = union of C(s) for s in S. Repeat
until |S| = n:

1. Eligible windows are those not yet in S. Draw a uniformly random subset P of
   min(`pool_size`, #eligible) of them (numpy PCG64, seeded by `seed`; default
   `pool_size` = 2,000, as ZipCal did).
2. Pick w in P maximising |C(w) \\ covered| (new concepts); ties go to the larger
   |C(w)| (more concepts in total), then to the earlier draw.
3. S += {w}; covered |= C(w).

Greedy coverage fills the head of the rank-frequency curve once and then keeps buying
types from its long tail, so the set spans more of the vocabulary than random windows
at the same token budget (the manifest's statistics record types, type/token ratio
and the Zipf fit, to compare sets). Cost: one pass to map the pool's tokens to
concepts, O(N*L), then O(n * pool_size * L) for selection, i.e. linear in the pool
size N (L = seqlen). No model is involved.

Variant ``objective="invfreq"`` (an older ZipCal scoring): score(w) = sum over the
distinct concepts c of w of 1 / count(c), count(c) being c's token frequency in the
whole pool; keep the n highest scores (ties to the lower pool index).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from qcal.calib.base import SELECTORS, Selection
from qcal.calib.windows import WindowPool
from qcal.errors import ConfigError

_BPE_MARKERS = "Ġ▁Ċĉ"
OBJECTIVES = ("coverage", "invfreq")


def concept_strings(tokenizer: Any, token_ids: Sequence[int]) -> list[str | None]:
    """The normalised concept of each token id (None: no concept), see module docstring."""
    ids = [int(i) for i in token_ids]
    special = {int(i) for i in (getattr(tokenizer, "all_special_ids", None) or []) if i is not None}
    decoded = tokenizer.batch_decode([[i] for i in ids], skip_special_tokens=False,
                                     clean_up_tokenization_spaces=False)
    pieces = tokenizer.convert_ids_to_tokens(ids)
    out: list[str | None] = []
    for tid, text, piece in zip(ids, decoded, pieces, strict=True):
        if tid in special:
            out.append(None)
            continue
        if "\ufffd" in text:
            raw = str(piece).strip(_BPE_MARKERS).strip()
            out.append(f"bytes:{raw}" if raw else None)
            continue
        concept = text.strip().strip(_BPE_MARKERS).strip().lower()
        out.append(concept or None)
    return out


def concept_matrix(ids: torch.Tensor, tokenizer: Any) -> np.ndarray:
    """int32 [N, L] concept index per token, -1 for tokens without a concept.

    Only the distinct ids present in the pool are decoded, so the cost follows the pool.
    """
    flat = ids.reshape(-1).cpu().numpy()
    uniq, inverse = np.unique(flat, return_inverse=True)
    names = concept_strings(tokenizer, uniq.tolist())
    index: dict[str, int] = {}
    table = np.array([-1 if c is None else index.setdefault(c, len(index)) for c in names],
                     dtype=np.int32)
    return table[inverse].reshape(ids.shape)


def _unique_rows(concepts: np.ndarray, sentinel: int) -> np.ndarray:
    """Each row's distinct concepts, duplicates and -1 replaced by `sentinel`."""
    rows = np.sort(concepts, axis=1)
    dup = np.zeros(rows.shape, dtype=bool)
    dup[:, 1:] = rows[:, 1:] == rows[:, :-1]
    return np.where(dup | (rows < 0), sentinel, rows)


def greedy_coverage(concepts: np.ndarray, n: int, seed: int,
                    pool_size: int = 2000) -> tuple[list[int], dict[str, Any]]:
    """Indices of n rows chosen by greedy concept coverage (module docstring, steps 1-3)."""
    num_rows = concepts.shape[0]
    if not 0 < n <= num_rows:
        raise ConfigError(f"cannot choose n={n} of {num_rows} candidates")
    if pool_size < 1:
        raise ConfigError(f"pool_size={pool_size} must be >= 1 (ZipCal used 2000)")
    num_concepts = int(concepts.max(initial=-1)) + 1
    uniq = _unique_rows(concepts, num_concepts)
    totals = (uniq != num_concepts).sum(axis=1).astype(np.int64)
    covered = np.zeros(num_concepts + 1, dtype=bool)
    covered[num_concepts] = True  # the sentinel never counts as new
    eligible = np.ones(num_rows, dtype=bool)
    rng = np.random.default_rng(seed)
    width = concepts.shape[1] + 1
    chosen: list[int] = []
    for _ in range(n):
        candidates = np.flatnonzero(eligible)
        if candidates.size > pool_size:
            candidates = candidates[rng.choice(candidates.size, size=pool_size, replace=False)]
        new = (~covered[uniq[candidates]]).sum(axis=1)
        # new dominates, total breaks ties; argmax keeps the earliest draw among equals.
        best = int(candidates[int(np.argmax(new * width + totals[candidates]))])
        chosen.append(best)
        eligible[best] = False
        covered[uniq[best]] = True
    covered_count = int(covered[:num_concepts].sum())
    return chosen, {"pool_concepts": num_concepts, "covered_concepts": covered_count,
                    "coverage": round(covered_count / num_concepts, 6) if num_concepts else None}


def inverse_frequency_top(concepts: np.ndarray, n: int) -> tuple[list[int], dict[str, Any]]:
    """The n rows with the largest sum of 1/count over their distinct concepts."""
    num_rows = concepts.shape[0]
    if not 0 < n <= num_rows:
        raise ConfigError(f"cannot choose n={n} of {num_rows} candidates")
    num_concepts = int(concepts.max(initial=-1)) + 1
    valid = concepts[concepts >= 0]
    counts = np.bincount(valid, minlength=num_concepts).astype(np.float64)
    inv = np.zeros(num_concepts + 1)
    inv[:num_concepts] = 1.0 / np.maximum(counts, 1.0)
    scores = inv[_unique_rows(concepts, num_concepts)].sum(axis=1)
    order = np.lexsort((np.arange(num_rows), -scores))[:n]
    return [int(i) for i in order], {"pool_concepts": num_concepts,
                                     "min_score": float(scores[order].min())}


@dataclasses.dataclass(frozen=True)
class ZipfSelector:
    """Lexical-diversity selection; see the module docstring for the exact objective."""

    objective: str = "coverage"
    pool_size: int = 2000
    name: str = "zipf"

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ConfigError(f"unknown zipf objective {self.objective!r}; choose one of {OBJECTIVES}")

    def params(self) -> dict[str, Any]:
        return {"objective": self.objective, "pool_size": self.pool_size}

    def select(self, pool: WindowPool, n: int, seed: int) -> Selection:
        pool.require(n)
        concepts = concept_matrix(pool.ids, pool.tokenizer)
        if self.objective == "invfreq":
            idx, info = inverse_frequency_top(concepts, n)
        else:
            idx, info = greedy_coverage(concepts, n, seed, self.pool_size)
        return Selection(idx, {"objective": self.objective, **info})


SELECTORS.register("zipf", ZipfSelector)
