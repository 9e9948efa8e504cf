"""Bit packing of the GPTQ checkpoint layout: codes laid end to end in a little-endian
bit stream of int32 words (`bits * K / 32` words for K codes).

qweight packs codes along in_features (rows of the [in, out] matrix): code k of a column
occupies stream bits [k*bits, (k+1)*bits). For 2, 4 and 8 bits that is `32 // bits` whole
codes per word (element j of word i holds code[i * per_word + j] in bits [j*bits, (j+1)*bits));
3-bit codes straddle words, 32 of them in 3 words, as GPTQ's and GPTQModel's 3-bit layout and
compressed-tensors' dense packing lay them. qzeros pack along out_features the same way.
"""

from __future__ import annotations

import sys

import torch
from qcal_kernels.errors import KernelError

PACKABLE_BITS = (2, 3, 4, 8)


def _per_word(bits: int) -> int:
    if bits not in PACKABLE_BITS:
        raise KernelError(f"{bits}-bit codes cannot be packed; packable widths are {PACKABLE_BITS}")
    return 32 // bits


def whole_words(bits: int) -> bool:
    """Whether `bits`-bit codes fill int32 words exactly (no code straddles two words)."""
    return 32 % bits == 0


def packed_length(count: int, bits: int) -> int:
    """Words holding `count` codes; raises unless they fill whole words."""
    _per_word(bits)
    if count * bits % 32:
        per = 32 // bits if whole_words(bits) else 32
        raise KernelError(f"cannot pack {count} rows into int32 words of {bits}-bit codes "
                          f"(needs a multiple of {per})")
    return count * bits // 32


def _pack_stream(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """[K, N] codes -> int32 [K*bits/32, N] words of one bit stream per column."""
    words = packed_length(codes.shape[0], bits)
    n = codes.shape[1]
    device = codes.device
    shifts = torch.arange(bits, dtype=torch.int64, device=device).view(1, bits, 1)
    stream = ((codes.to(torch.int64).unsqueeze(1) >> shifts) & 1).reshape(words, 32, n)
    weights = torch.arange(32, dtype=torch.int64, device=device).view(1, 32, 1)
    return _to_int32((stream << weights).sum(dim=1))


def unpack_stream(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """Inverse of the stream packing, on `packed`'s own device: int32 [W, N] -> codes
    [W*32/bits, N] (int32)."""
    _per_word(bits)
    w, n = packed.shape
    device = packed.device
    words = packed.to(torch.int64) & 0xFFFFFFFF
    weights = torch.arange(32, dtype=torch.int64, device=device).view(1, 32, 1)
    stream = ((words.unsqueeze(1) >> weights) & 1).reshape(w * 32 // bits, bits, n)
    shifts = torch.arange(bits, dtype=torch.int64, device=device).view(1, bits, 1)
    return (stream << shifts).sum(dim=1).to(torch.int32)


def _to_int32(x: torch.Tensor) -> torch.Tensor:
    # Words are built in int64; values >= 2**31 are reinterpreted as negative int32.
    x = torch.where(x >= 2**31, x - 2**32, x)
    return x.to(torch.int32)


def pack_rows(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack int codes [K, N] into int32 [K * bits / 32, N]."""
    per = _per_word(bits)
    if not whole_words(bits):
        return _pack_stream(codes, bits)
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
    if not whole_words(bits):
        return _pack_stream(codes.T.contiguous(), bits)
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
    """Inverse of `pack_rows`: int32 [K * bits / 32, N] -> int32 codes [K, N]."""
    per = _per_word(bits)
    if not whole_words(bits):
        return unpack_stream(packed, bits)
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
