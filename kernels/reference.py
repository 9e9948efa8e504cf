"""Pure-torch reference for the packed GPTQ layout: the test oracle and the fallback."""

from __future__ import annotations

import torch
from qcal_kernels.errors import KernelError
from qcal_kernels.format import PACKABLE_BITS


def _unpack_rows(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """int32 [K / per, N] -> int32 codes [K, N] on packed's own device.

    Same layout as qcal_kernels.format.unpack_rows, whose shift table lives on the CPU
    (so it cannot unpack CUDA tensors).
    """
    if bits not in PACKABLE_BITS:
        raise KernelError(f"{bits}-bit codes are not packed; packable widths are {PACKABLE_BITS}")
    per = 32 // bits
    kp, n = packed.shape
    words = packed.to(torch.int64) & 0xFFFFFFFF
    shifts = torch.arange(per, device=packed.device, dtype=torch.int64).view(1, per, 1) * bits
    return ((words.unsqueeze(1) >> shifts) & (2**bits - 1)).reshape(kp * per, n).to(torch.int32)


def dequantize_packed(
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    g_idx: torch.Tensor,
    bits: int,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Weight [in, out] = scales[g] * (q - z[g]); qzeros hold the true zero points."""
    q = _unpack_rows(qweight, bits)  # [in, out]
    z = _unpack_rows(qzeros.T, bits).T  # [groups, out]
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
