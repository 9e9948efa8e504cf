"""Bit packing of the GPTQ checkpoint layout (`32 // bits` codes per int32).

qweight packs codes along in_features (rows of the [in, out] matrix):
element j of int32 row i holds code[i * per_word + j] in bits [j*bits, (j+1)*bits).
qzeros packs along out_features the same way. Only widths that divide 32 pack
(2, 4, 8); 3-bit results are kept as fake-quant.
"""

from __future__ import annotations

import sys

import torch
from qcal_kernels.errors import KernelError

PACKABLE_BITS = (2, 4, 8)


def _per_word(bits: int) -> int:
    if bits not in PACKABLE_BITS:
        raise KernelError(f"{bits}-bit codes cannot be packed; packable widths are {PACKABLE_BITS}")
    return 32 // bits


def _to_int32(x: torch.Tensor) -> torch.Tensor:
    # Words are built in int64; values >= 2**31 are reinterpreted as negative int32.
    x = torch.where(x >= 2**31, x - 2**32, x)
    return x.to(torch.int32)


def pack_rows(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack int codes [K, N] into int32 [K / per_word, N]."""
    per = _per_word(bits)
    k, n = codes.shape
    if k % per:
        raise KernelError(f"cannot pack {k} rows into int32 words of {per} {bits}-bit codes")
    c = codes.to(torch.int64).reshape(k // per, per, n)
    packed_device = codes.device
    shifts = (torch.arange(per, dtype=torch.int64, device=packed_device) * bits).view(1, per, 1)
    return _to_int32((c << shifts).sum(dim=1))


def pack_transposed(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """`pack_rows(codes.T)` for codes [N, K] (a linear's [out, in] orientation): the same
    words, built along K without transposing the wide code matrix. Codes are packed into
    bytes first (`8 // bits` per byte, in uint8) and the bytes read as little-endian int32
    words, which puts code j of a word at bits [j*bits, (j+1)*bits) exactly as
    `pack_rows` does; only the narrow packed matrix is transposed."""
    per = _per_word(bits)
    n, k = codes.shape
    if k % per:
        raise KernelError(f"cannot pack {k} rows into int32 words of {per} {bits}-bit codes")
    if sys.byteorder != "little":
        return pack_rows(codes.T.contiguous(), bits)
    c = codes.to(torch.uint8)
    per_byte = 8 // bits
    byte = c[:, 0::per_byte].clone() if per_byte > 1 else c.contiguous()
    for j in range(1, per_byte):
        byte.bitwise_or_(c[:, j::per_byte] << (j * bits))
    return byte.view(torch.int32).T.contiguous()


def unpack_rows(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """Inverse of `pack_rows`: int32 [K / per_word, N] -> int32 codes [K, N]."""
    per = _per_word(bits)
    kp, n = packed.shape
    words = packed.to(torch.int64) & 0xFFFFFFFF
    packed_device = packed.device
    shifts = (torch.arange(per, dtype=torch.int64, device=packed_device) * bits).view(1, per, 1)
    codes = (words.unsqueeze(1) >> shifts) & (2**bits - 1)
    return codes.reshape(kp * per, n).to(torch.int32)


def pack_cols(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack int codes [G, N] along N into int32 [G, N / per_word]."""
    return pack_rows(codes.T.contiguous(), bits).T.contiguous()


def unpack_cols(packed: torch.Tensor, bits: int) -> torch.Tensor:
    return unpack_rows(packed.T.contiguous(), bits).T.contiguous()
