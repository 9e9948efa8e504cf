"""Pure-torch reference for the packed GPTQ layout: the test oracle and the fallback."""

from __future__ import annotations

import torch

from qcal.packing.format import unpack_cols, unpack_rows


def dequantize_packed(
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    g_idx: torch.Tensor,
    bits: int,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Weight [in, out] = scales[g] * (q - z[g]); qzeros hold the true zero points."""
    q = unpack_rows(qweight, bits)  # [in, out]
    z = unpack_cols(qzeros, bits)  # [groups, out]
    g = g_idx.long()
    w = scales.float()[g] * (q.float() - z.float()[g])
    return w.to(dtype)


def int4_matmul_reference(
    x: torch.Tensor,
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    g_idx: torch.Tensor,
    bits: int = 4,
) -> torch.Tensor:
    """y = x @ dequant(W), computed in float32 and returned in x's dtype."""
    w = dequantize_packed(qweight, qzeros, scales, g_idx, bits, torch.float32)
    return (x.float() @ w).to(x.dtype)
