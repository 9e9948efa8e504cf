"""Pure-torch reference for the packed GPTQ layout: the test oracle and the fallback."""

from __future__ import annotations

import sys

import torch
from qcal_kernels.errors import KernelError
from qcal_kernels.format import PACKABLE_BITS, unpack_stream, whole_words


def _unpack_rows(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """int32 [K / per, N] -> int32 codes [K, N] on packed's own device.

    Same layout as qcal_kernels.format.unpack_rows, whose shift table lives on the CPU
    (so it cannot unpack CUDA tensors).
    """
    if bits not in PACKABLE_BITS:
        raise KernelError(f"{bits}-bit codes are not packed; packable widths are {PACKABLE_BITS}")
    if not whole_words(bits):  # 3-bit codes straddle words
        return unpack_stream(packed, bits)
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


def dequantize_grouped_fast(
    qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int,
    bits: int = 4, dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """`dequantize_packed` for contiguous whole groups of `group_size` rows (no act-order):
    the same values, without [in, out]-sized gathers of scales and zeros. Codes come out of
    the int32 words byte by byte (little-endian: code j of a word sits in byte j*bits//8),
    and scale/zero broadcast over each group's rows."""
    k = qweight.shape[0] * 32 // bits
    n = qweight.shape[1]
    if bits != 4 or sys.byteorder != "little" or group_size <= 0 or k % group_size:
        g_idx = torch.arange(k, dtype=torch.int32, device=qweight.device) // max(group_size, 1)
        return dequantize_packed(qweight, qzeros, scales, g_idx, bits, dtype)
    raw = qweight.contiguous().view(torch.uint8).view(k // 8, n, 4)
    codes = torch.stack([raw & 15, raw >> 4], dim=-1)  # [K/8, N, 4 bytes, 2 nibbles]
    codes = codes.view(k // 8, n, 8).permute(0, 2, 1).reshape(k // group_size, group_size, n)
    z = _unpack_rows(qzeros.T, bits).T.float().unsqueeze(1)  # [groups, 1, N]
    s = scales.float().unsqueeze(1)
    return (s * (codes.float() - z)).reshape(k, n).to(dtype)
