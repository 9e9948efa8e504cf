"""`perplexity`: score each candidate window with a reference model and select by perplexity.

As ZipCal ran the baseline: the full-precision target model scores every candidate,
PPL(w) = exp(mean token cross-entropy of predicting w[1:] from its prefix), with
padding masked out of both the sum and the count (candidate windows are never
padded, but `sequence_perplexity` takes any right-padded batch). Modes:
- ``low``: the n lowest-PPL windows (the published baseline);
- ``high``: the n highest;
- ``middle``: the n windows whose PPL rank lies closest to the median rank.
Ties keep the lower pool index. `score_tokens` scores only each window's first k
tokens (cheaper; ZipCal used 128); `max_candidates` scores a seeded random subset of
the pool instead of all of it. Scoring runs in batches of `batch_size` under no_grad.
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from qcal.calib.base import SELECTORS, Selection
from qcal.calib.windows import WindowPool
from qcal.errors import ConfigError
from qcal.scoring import next_token_nll

MODES = ("low", "high", "middle")


@torch.no_grad()
def sequence_perplexity(model: nn.Module, ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                        batch_size: int = 8, progress: bool = False) -> torch.Tensor:
    """Per-row perplexity [N] (float64) of `ids` [N, L]; mask 0 marks padding (right-padded)."""
    if ids.dim() != 2 or ids.shape[1] < 2:
        raise ConfigError(f"need ids [N, L>=2] to score, got {tuple(ids.shape)}")
    if batch_size < 1:
        raise ConfigError(f"batch_size={batch_size} must be >= 1")
    device = next(model.parameters()).device
    out = torch.empty(ids.shape[0], dtype=torch.float64)
    for start in tqdm(range(0, ids.shape[0], batch_size), desc="ppl-score", disable=not progress):
        batch = ids[start:start + batch_size].to(device)
        mask = None if attention_mask is None else attention_mask[start:start + batch_size].to(device)
        ce = next_token_nll(model(input_ids=batch, attention_mask=mask, use_cache=False).logits, batch)
        # Only positions whose target is a real token count.
        weight = torch.ones_like(ce) if mask is None else mask[:, 1:].to(ce.dtype)
        counts = weight.sum(dim=1)
        if bool((counts == 0).any()):
            raise ConfigError("a row has fewer than 2 unmasked tokens; nothing to score")
        mean_ce = (ce * weight).sum(dim=1).double() / counts.double()
        out[start:start + batch.shape[0]] = torch.exp(mean_ce).cpu()
    return out


def rank_by_score(scores: torch.Tensor, n: int, mode: str) -> list[int]:
    """Indices of the n rows to keep under `mode` (see module docstring); ties to lower index."""
    if mode not in MODES:
        raise ConfigError(f"unknown perplexity mode {mode!r}; choose one of {MODES}")
    count = scores.numel()
    if not 0 < n <= count:
        raise ConfigError(f"cannot choose n={n} of {count} scored candidates")
    s = scores.double().cpu()
    if mode == "low":
        order = torch.sort(s, stable=True).indices
    elif mode == "high":
        order = torch.sort(-s, stable=True).indices
    else:
        ranked = torch.sort(s, stable=True).indices
        rank = torch.empty(count, dtype=torch.float64)
        rank[ranked] = torch.arange(count, dtype=torch.float64)
        order = torch.sort((rank - (count - 1) / 2).abs(), stable=True).indices
    return [int(i) for i in order[:n]]


def load_reference_model(tokenizer: Any, ref_model: str | Path | None = None) -> nn.Module:
    """The float model in `ref_model`, else in the tokenizer's directory."""
    from qcal.model.loading import load_model
    from qcal.packing.checkpoint import is_quantized_checkpoint

    path = ref_model or getattr(tokenizer, "name_or_path", None)
    if not path or not Path(str(path)).is_dir():
        raise ConfigError(
            f"the perplexity selector needs a reference model and {path!r} is not a local model "
            "directory; pass --ref-model DIR (the float model whose tokenizer built the pool)"
        )
    if is_quantized_checkpoint(Path(str(path))):
        raise ConfigError(f"{path} is a quantized checkpoint; the perplexity selector scores with "
                          "the full-precision model: pass --ref-model <float model dir>")
    net, _, _ = load_model(path)
    return net


@dataclasses.dataclass(frozen=True)
class PerplexitySelector:
    """Keep the lowest / highest / middle-PPL windows under a reference model."""

    mode: str = "low"
    batch_size: int = 8
    score_tokens: int | None = None
    max_candidates: int | None = None
    ref_model: str | None = None
    model: Any = dataclasses.field(default=None, compare=False, repr=False)
    # Where the reference model it loads itself runs (`--device`); not part of the selection.
    device: str | None = dataclasses.field(default=None, compare=False)
    progress: bool = True
    name: str = "perplexity"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"unknown perplexity mode {self.mode!r}; choose one of {MODES}")
        if self.score_tokens is not None and self.score_tokens < 2:
            raise ConfigError(f"score_tokens={self.score_tokens} must be >= 2 (or None: whole window)")
        if self.max_candidates is not None and self.max_candidates < 1:
            raise ConfigError(f"max_candidates={self.max_candidates} must be >= 1 (or None: all)")

    def params(self) -> dict[str, Any]:
        ref = self.ref_model
        if ref is None and self.model is not None:
            ref = str(getattr(getattr(self.model, "config", None), "_name_or_path", "") or "in-memory")
        return {"mode": self.mode, "score_tokens": self.score_tokens,
                "max_candidates": self.max_candidates, "reference_model": ref}

    def select(self, pool: WindowPool, n: int, seed: int) -> Selection:
        pool.require(n)
        candidates = np.arange(len(pool))
        if self.max_candidates is not None and len(pool) > self.max_candidates:
            if self.max_candidates < n:
                raise ConfigError(f"max_candidates={self.max_candidates} is below n={n}; raise it")
            rng = np.random.default_rng(seed)
            candidates = np.sort(rng.choice(len(pool), size=self.max_candidates, replace=False))
        model = self.model
        load_seconds = None
        if model is None:
            from qcal.devices import resolve_device

            started = time.perf_counter()
            model = load_reference_model(pool.tokenizer, self.ref_model)
            model.to(resolve_device(self.device or "auto"))
            # Part of the selection's cost, reported apart so costs can be compared with or
            # without it (a caller that passes a loaded model pays none).
            load_seconds = round(time.perf_counter() - started, 3)
        ids = pool.ids[torch.from_numpy(candidates)]
        if self.score_tokens is not None:
            ids = ids[:, :self.score_tokens]
        was_training = model.training
        model.eval()
        try:
            scores = sequence_perplexity(model, ids, batch_size=self.batch_size, progress=self.progress)
        finally:
            model.train(was_training)
        keep = rank_by_score(scores, n, self.mode)
        chosen = scores[keep]
        finite = scores[torch.isfinite(scores)]
        info = {"scored": int(candidates.size), "reference_load_seconds": load_seconds,
                "pool_ppl": _quantiles(finite), "selected_ppl": _quantiles(chosen)}
        return Selection([int(candidates[i]) for i in keep], info)


def _quantiles(x: torch.Tensor) -> dict[str, float]:
    if x.numel() == 0:
        return {}
    q = torch.quantile(x.double(), torch.tensor([0.0, 0.5, 1.0], dtype=torch.float64))
    return {"min": _r(q[0]), "median": _r(q[1]), "max": _r(q[2]), "mean": _r(x.double().mean())}


def _r(v: torch.Tensor) -> float:
    f = float(v)
    return round(f, 4) if math.isfinite(f) else f


SELECTORS.register("perplexity", PerplexitySelector)
