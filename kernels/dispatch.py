"""Chooses the int4 matmul implementation for a QuantLinear by device."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from kernels.reference import dequantize_packed

if TYPE_CHECKING:
    from qcal.packing.qlinear import QuantLinear


def quant_linear_forward(layer: QuantLinear, x: torch.Tensor) -> torch.Tensor:
    """Reference path: dequantize (cached per dtype while weights are unchanged), then matmul."""
    key = f"ref:{x.dtype}:{x.device}"
    w = layer._kernel_cache.get(key)
    if w is None:
        w = dequantize_packed(
            layer.qweight, layer.qzeros, layer.scales, layer.g_idx, layer.bits, x.dtype
        ).T.contiguous()
        layer._kernel_cache[key] = w
    bias = None if layer.bias is None else layer.bias.to(x.dtype)
    return torch.nn.functional.linear(x, w, bias)
