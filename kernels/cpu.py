"""Fast CPU path: torch's own int4 CPU kernel on a one-time repack of the GPTQ layout.

torch (2.13) ships `aten._convert_weight_to_int4pack_for_cpu` (int32 codes [N, K] ->
uint8 [N, K/2]) and `aten._weight_int4pack_mm_for_cpu(x, packed, group, sz)`, which
computes x @ w^T with w[n, k] = (q - 8) * sz[k//group, n, 0] + sz[k//group, n, 1].
Our layout is w = s * (q - z), so the repack stores scale s and zero s * (8 - z).

The op needs N % 16 == 0, a group size in {32, 64, 128, 256} dividing K, and contiguous
groups. A group size that the op does not take (ragged, per channel, or 512) is served
by splitting every group into sub-blocks of a size it does take (scales repeat); act-order
g_idx is served by permuting the weight rows once at repack and x's columns per call.

Accuracy: the op is fast only with bf16 activations (fp32/fp16 inputs hit a slow path,
10-100x slower than the reference), so x is rounded to bf16, the scales and zeros are
stored in bf16, and the output (bf16) is cast back to x's dtype. That is about 3
significant digits: relative errors of ~0.5% on single outputs, far below the 4-bit
quantization error itself. `QCAL_KERNEL=reference` gives the exact float32 path.
"""

from __future__ import annotations

import dataclasses

import torch
from qcal_kernels.format import unpack_cols, unpack_rows
from qcal_kernels.layout import KernelUnsupportedError, check_packed, sorted_group_layout

CPU_GROUP_SIZES = (256, 128, 64, 32)
COMPUTE_DTYPE = torch.bfloat16


@dataclasses.dataclass(frozen=True)
class CpuInt4Weight:
    """A weight repacked for torch's CPU int4 op."""

    packed: torch.Tensor  # uint8 [N, K/2]
    scales_zeros: torch.Tensor  # bf16 [K / block, N, 2]
    block: int  # the op's group size (a divisor of our group layout)
    perm: torch.Tensor | None  # x column order for act-order weights, else None
    in_features: int
    out_features: int


def cpu_int4_available() -> bool:
    return hasattr(torch.ops.aten, "_convert_weight_to_int4pack_for_cpu") and hasattr(
        torch.ops.aten, "_weight_int4pack_mm_for_cpu"
    )


def _block_size(sorted_groups: torch.Tensor) -> int | None:
    """Largest op group size such that every block of that many sorted rows is one group."""
    k = sorted_groups.numel()
    starts = torch.nonzero(sorted_groups[1:] != sorted_groups[:-1]).flatten() + 1
    for block in CPU_GROUP_SIZES:
        if k % block == 0 and bool((starts % block == 0).all()):
            return block
    return None


def unsupported_reason(
    qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor, bits: int
) -> str | None:
    """Why the CPU int4 op cannot serve this weight, or None when it can."""
    if not cpu_int4_available():
        return f"torch {torch.__version__} has no CPU int4 ops (aten._weight_int4pack_mm_for_cpu)"
    if bits != 4:
        return f"the CPU int4 op takes 4-bit codes only, this layer has {bits}-bit codes"
    k, n, _ = check_packed(qweight, qzeros, scales, g_idx, bits)
    if n % 16:
        return f"the CPU int4 op needs out_features % 16 == 0, got {n}"
    _, sorted_groups = sorted_group_layout(g_idx)
    if _block_size(sorted_groups) is None:
        return (
            f"no block size in {CPU_GROUP_SIZES} divides in_features={k} and every group boundary; "
            "use a group size that is a multiple of 32 and divides in_features"
        )
    return None


def pack_for_cpu(
    qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor, bits: int = 4
) -> CpuInt4Weight:
    """Repack a GPTQ-layout weight for `cpu_int4_matmul`; raises KernelUnsupportedError if impossible."""
    reason = unsupported_reason(qweight, qzeros, scales, g_idx, bits)
    if reason is not None:
        raise KernelUnsupportedError(f"{reason}; unset QCAL_KERNEL (or set it to 'reference')")
    qweight, qzeros, scales = qweight.cpu(), qzeros.cpu(), scales.cpu()
    perm, sorted_groups = sorted_group_layout(g_idx)
    block = _block_size(sorted_groups)
    assert block is not None  # unsupported_reason checked it
    codes = unpack_rows(qweight, bits)  # [K, N]
    if perm is not None:
        codes = codes[perm]
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.T.contiguous(), 1)
    block_group = sorted_groups[::block]  # the (single) group of each block
    s = scales.float()[block_group]  # [K / block, N]
    z = unpack_cols(qzeros, bits).float()[block_group]
    scales_zeros = torch.stack([s, s * (8.0 - z)], dim=-1).to(COMPUTE_DTYPE).contiguous()
    return CpuInt4Weight(packed, scales_zeros, block, perm, codes.shape[0], codes.shape[1])


def cpu_int4_matmul(x: torch.Tensor, weight: CpuInt4Weight) -> torch.Tensor:
    """y = x @ W for x [..., K] on the CPU, computed in bf16 and returned in x's dtype."""
    if x.shape[-1] != weight.in_features:
        raise KernelUnsupportedError(
            f"input has {x.shape[-1]} features, the int4 weight expects {weight.in_features}"
        )
    lead = x.shape[:-1]
    x2 = x.reshape(-1, weight.in_features)
    if weight.perm is not None:
        x2 = x2[:, weight.perm]
    y = torch.ops.aten._weight_int4pack_mm_for_cpu(
        x2.to(COMPUTE_DTYPE).contiguous(), weight.packed, weight.block, weight.scales_zeros
    )
    return y.to(x.dtype).reshape(*lead, weight.out_features)
