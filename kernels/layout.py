"""Shape checks and group-layout analysis shared by the int4 backends."""

from __future__ import annotations

import torch
from qcal_kernels.errors import KernelUnsupportedError

__all__ = ["KernelUnsupportedError", "check_packed", "contiguous_group_size", "sorted_group_layout"]


def check_packed(
    qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor, bits: int
) -> tuple[int, int, int]:
    """(K, N, groups) of a packed GPTQ-layout weight; raises on inconsistent shapes or dtypes."""
    if qweight.dim() != 2 or qweight.dtype != torch.int32:
        raise KernelUnsupportedError(
            f"qweight must be a 2-D int32 tensor [K*{bits}/32, N], got {tuple(qweight.shape)} "
            f"{qweight.dtype}"
        )
    # Codes fill a bit stream of int32 words: K codes take K*bits/32 words (3 bits straddle).
    k, n = qweight.shape[0] * 32 // bits, qweight.shape[1]
    groups = scales.shape[0]
    if scales.shape != (groups, n) or qzeros.shape != (groups, n * bits // 32) or n * bits % 32:
        raise KernelUnsupportedError(
            f"scales {tuple(scales.shape)} / qzeros {tuple(qzeros.shape)} do not match qweight "
            f"{tuple(qweight.shape)}: expected [G, {n}] and [G, {n * bits // 32}]; the checkpoint "
            "is malformed"
        )
    if g_idx.shape != (k,):
        raise KernelUnsupportedError(
            f"g_idx has shape {tuple(g_idx.shape)}, expected [{k}] (one group index per input channel)"
        )
    return k, n, groups


def contiguous_group_size(g_idx: torch.Tensor, groups: int) -> int:
    """g if g_idx == arange(K) // g (ragged last group allowed), else 0 (act-order / arbitrary).

    Reads g_idx on the host once; callers cache the answer per layer.
    """
    gi = g_idx.detach().to("cpu", torch.int64)
    k = gi.numel()
    if k == 0:
        return 0
    first = int((gi == gi[0]).sum())
    if int(gi[0]) != 0 or first == 0:
        return 0
    if torch.equal(gi, torch.arange(k) // first) and -(-k // first) == groups:
        return first
    return 0


def sorted_group_layout(g_idx: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
    """(perm, sorted g_idx): the input-channel order that makes every group contiguous.

    perm is None when g_idx is already sorted (no act-order), so callers skip the gather.
    """
    gi = g_idx.detach().to("cpu", torch.int64)
    if gi.numel() < 2 or bool((gi[1:] >= gi[:-1]).all()):
        return None, gi
    perm = torch.argsort(gi, stable=True)
    return perm, gi[perm]
