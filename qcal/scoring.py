"""Next-token negative log-likelihood of a causal LM's logits: the one function that
perplexity evaluation and perplexity-based calibration selection both score with.

Pure tensor code. Each row is scored on its own contiguous [L-1, vocab] slice of the
logits: flattening `logits[:, :-1]` copies the whole tensor (2 GB for 4 x 512 positions of
Gemma-3's 262k-token vocabulary), and a cross-entropy over the class dimension of a
transposed view runs a strided softmax that is several times slower and less accurate in
float32. Row by row gives exactly the flattened result (same per-row kernel) without the
copy.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def next_token_nll(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """NLL [B, L-1] (float32) of predicting ids[:, 1:] from logits[:, :-1] ([B, L, vocab])."""
    if logits.dim() != 3 or ids.shape != logits.shape[:2] or ids.shape[1] < 2:
        raise ValueError(f"need logits [B, L>=2, V] and ids [B, L], got {tuple(logits.shape)} "
                         f"and {tuple(ids.shape)}")
    logits = logits.float()
    return torch.stack([F.cross_entropy(logits[row, :-1], ids[row, 1:], reduction="none")
                        for row in range(ids.shape[0])])
