"""Perplexity over fixed-length windows (paper convention) or a strided sliding window.

Fixed mode: the text is tokenized once, cut into non-overlapping windows of
`seqlen` tokens (the tail is dropped), and PPL = exp(total NLL / predicted tokens).
Strided mode: windows of `seqlen` advance by `stride`, and each window scores only
tokens not scored before, so every token gets up to `seqlen - stride` of context.
Strided numbers are lower and not comparable with fixed-window ones.

A tokenizer that prepends a special token to every text (Gemma's ``<bos>``;
`qcal.tokenization.text_prefix`) gets it in front of every window: the window holds
`seqlen - len(prefix)` text tokens, all of them scored (the first one is predicted
from the prefix), and the prefix itself is never scored.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from qcal.errors import ConfigError
from qcal.scoring import next_token_nll


@dataclasses.dataclass
class PerplexityResult:
    ppl: float
    nll_sum: float
    tokens: int
    windows: int
    seqlen: int
    mode: str
    token_nll: torch.Tensor  # float32 [tokens] in scoring order, for per-sample comparisons
    window_tokens: list[int] = dataclasses.field(default_factory=list)  # scored tokens per window

    def window_nll(self) -> list[float]:
        """Summed NLL of each window: the unit paired tests resample (qcal.eval.stats)."""
        if not self.window_tokens:
            return []
        return [round(float(w.double().sum()), 6)
                for w in torch.split(self.token_nll, self.window_tokens)]

    def summary(self) -> dict[str, Any]:
        return {"ppl": self.ppl, "nll": self.nll_sum / max(self.tokens, 1),
                "tokens": self.tokens, "windows": self.windows, "seqlen": self.seqlen,
                "mode": self.mode, "window_nll": self.window_nll(),
                "window_tokens": list(self.window_tokens)}


def tokenize_text(tokenizer: Any, text: str) -> torch.Tensor:
    if not text or not text.strip():
        raise ConfigError("the evaluation text is empty; check the corpus or --text file")
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"][0]
    return ids.to(torch.long)


def window_spans(n_tokens: int, seqlen: int, stride: int | None,
                 first_scored: int = 1) -> list[tuple[int, int, int]]:
    """(start, end, first scored position within window) for each window of the text.

    `first_scored` is 1 when a window starts with text (its first token has no context)
    and 0 when a prefix token stands before it."""
    if stride is None:
        return [(s, s + seqlen, first_scored) for s in range(0, n_tokens - seqlen + 1, seqlen)]
    if not 0 < stride <= seqlen:
        raise ConfigError(f"stride={stride} must lie in (0, seqlen={seqlen}]")
    spans, scored_until = [], 0
    for start in range(0, max(n_tokens - 1, 1), stride):
        end = min(start + seqlen, n_tokens)
        first = max(scored_until - start, first_scored)
        if end - start > first:
            spans.append((start, end, first))
        scored_until = end
        if end == n_tokens:
            break
    return spans


def text_spans(n_tokens: int, seqlen: int, stride: int | None,
               prefix: Sequence[int] = ()) -> list[tuple[int, int, int]]:
    """Spans of text per window when each window is `prefix` + text of `seqlen` in all."""
    if len(prefix) >= seqlen:
        raise ConfigError(f"seqlen={seqlen} leaves no room for text after the tokenizer's "
                          f"{len(prefix)} leading special tokens; use a larger --seqlen")
    if stride is not None and prefix:
        stride = min(stride, seqlen - len(prefix))
    return window_spans(n_tokens, seqlen - len(prefix), stride, 0 if prefix else 1)


def with_prefix(window: torch.Tensor, prefix: Sequence[int]) -> torch.Tensor:
    """`prefix` + window as one id tensor (the window itself when there is no prefix)."""
    if not prefix:
        return window
    return torch.cat([torch.tensor(list(prefix), dtype=window.dtype), window])


@torch.no_grad()
def window_nll(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """Per-token NLL [B, L-1] of predicting batch[:, 1:] from the prefix."""
    return next_token_nll(model(input_ids=batch, use_cache=False).logits, batch)


def perplexity_of_ids(
    model: nn.Module, ids: torch.Tensor, seqlen: int = 512, stride: int | None = None,
    batch_size: int = 4, max_windows: int | None = None, progress: bool = True,
    desc: str = "ppl", prefix: Sequence[int] = (),
) -> PerplexityResult:
    spans = text_spans(ids.numel(), seqlen, stride, prefix)
    if max_windows is not None:
        spans = spans[:max_windows]
    if not spans:
        raise ConfigError(
            f"the text has {ids.numel()} tokens, fewer than one window of seqlen={seqlen}; "
            "use a longer text or a smaller --seqlen"
        )
    device = next(model.parameters()).device
    pieces: list[torch.Tensor] = []
    # Same-length windows batch together; strided tails differ, so group by length.
    bar = tqdm(total=len(spans), desc=desc, disable=not progress, leave=False)
    i = 0
    while i < len(spans):
        length = spans[i][1] - spans[i][0]
        j = i
        while j < len(spans) and j - i < batch_size and spans[j][1] - spans[j][0] == length:
            j += 1
        batch = torch.stack([with_prefix(ids[s:e], prefix) for s, e, _ in spans[i:j]]).to(device)
        nll = window_nll(model, batch).cpu()
        for row, (_, _, first) in enumerate(spans[i:j]):
            pieces.append(nll[row, len(prefix) + first - 1:])
        bar.update(j - i)
        i = j
    bar.close()
    token_nll = torch.cat(pieces)
    total = float(token_nll.double().sum())
    return PerplexityResult(
        ppl=math.exp(total / token_nll.numel()), nll_sum=total, tokens=token_nll.numel(),
        windows=len(spans), seqlen=seqlen, mode="fixed" if stride is None else f"stride{stride}",
        token_nll=token_nll, window_tokens=[p.numel() for p in pieces],
    )


def perplexity(
    model: nn.Module, tokenizer: Any, text: str, seqlen: int = 512, stride: int | None = None,
    batch_size: int = 4, max_windows: int | None = None, progress: bool = True,
    desc: str = "ppl",
) -> PerplexityResult:
    """Perplexity of `model` on `text` (see module docstring for the two modes)."""
    from qcal.tokenization import text_prefix

    ids = tokenize_text(tokenizer, text)
    return perplexity_of_ids(model, ids, seqlen, stride, batch_size, max_windows, progress, desc,
                             text_prefix(tokenizer))


def save_token_nll(path: Path | str, streams: dict[str, torch.Tensor],
                   meta: dict[str, str] | None = None) -> Path:
    """Write named token-NLL streams (e.g. "model/en", "base/en") as one safetensors file.

    Streams computed over the same windows line up token by token, so two models can be
    compared sample by sample (`load_token_nll` reads them back). Written atomically.
    """
    from safetensors.torch import save

    from qcal.fsio import atomic_write_bytes

    tensors = {k: v.detach().float().contiguous().cpu() for k, v in streams.items()}
    atomic_write_bytes(Path(path), save(tensors, metadata=meta or {}))
    return Path(path)


def load_token_nll(path: Path | str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    if not Path(path).is_file():
        raise ConfigError(f"token-NLL file {path} does not exist; write it with `qcal eval -o ...`")
    return load_file(str(path))
