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


def dequantize_grouped_weight(
    qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int,
    bits: int = 4, dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """`dequantize_packed(...).T.contiguous()`, the float weight [out, in] as a linear takes
    it, for contiguous whole groups of `group_size` input rows (no act-order): the same
    values, built in place in that one matrix (no [in, out] copy to transpose, no gathers of
    scales and zeros; for an 8B model's down_proj 235 MB instead of about 1 GB at once).
    Codes come out of the int32 words byte by byte (little-endian: code j of a word sits in
    byte j*bits//8); scale and zero broadcast over each group's columns."""
    k = qweight.shape[0] * 32 // bits
    n = qweight.shape[1]
    if bits != 4 or sys.byteorder != "little" or group_size <= 0 or k % group_size:
        g_idx = torch.arange(k, dtype=torch.int32, device=qweight.device) // max(group_size, 1)
        return dequantize_packed(qweight, qzeros, scales, g_idx, bits, dtype).T.contiguous()
    raw = qweight.contiguous().view(torch.uint8).view(k // 8, n, 4)
    codes = torch.stack([raw & 15, raw >> 4], dim=-1).view(k // 8, n, 8)  # code 8r+j of column c
    w = torch.empty(n, k, dtype=torch.float32, device=qweight.device)
    w.view(n, k // 8, 8).copy_(codes.permute(1, 0, 2))  # cast while transposing
    del codes
    groups = w.view(n, k // group_size, group_size)
    # (code - zero) is exact in float32 and one product rounds: the values of
    # scales * (codes - zeros), bit for bit, in whichever layout.
    groups.sub_(_unpack_rows(qzeros.T, bits).float().unsqueeze(2))
    groups.mul_(scales.float().T.unsqueeze(2))
    return w.to(dtype)
