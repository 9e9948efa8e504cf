"""`QuantLinear`: a linear layer whose weight lives packed in the GPTQ layout."""

from __future__ import annotations

import torch
from qcal_kernels.format import PACKABLE_BITS, pack_cols, pack_transposed
from torch import nn

from qcal.quant.base import QuantResult


class QuantLinear(nn.Module):
    """y = x @ dequant(qweight)^T + bias, dispatched to the best kernel for x's device.

    Buffers follow the checkpoint names (qweight, qzeros, scales, g_idx, bias) so
    a state_dict is the checkpoint. qzeros hold true zero points; the v1 "minus one"
    storage is converted at save/load time only.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bits: int,
        group_size: int,
        bias: bool,
        scale_dtype: torch.dtype = torch.float16,
    ) -> None:
        super().__init__()
        if bits not in PACKABLE_BITS:
            raise ValueError(f"QuantLinear supports {PACKABLE_BITS}-bit codes, got {bits}")
        g = in_features if group_size == -1 else group_size
        groups = -(-in_features // g)  # a ragged last group is allowed (see QuantScheme)
        self.in_features, self.out_features = in_features, out_features
        self.bits, self.group_size = bits, group_size
        # A bit stream of int32 words per column/row: K codes take K*bits/32 words.
        self.register_buffer("qweight", torch.zeros(in_features * bits // 32, out_features,
                                                    dtype=torch.int32))
        self.register_buffer("qzeros", torch.zeros(groups, out_features * bits // 32,
                                                   dtype=torch.int32))
        self.register_buffer("scales", torch.zeros(groups, out_features, dtype=scale_dtype))
        self.register_buffer("g_idx", torch.arange(in_features, dtype=torch.int32) // g)
        if bias:
            self.register_buffer("bias", torch.zeros(out_features, dtype=scale_dtype))
        else:
            self.bias = None
        # Backend-specific repacked weights (e.g. torch's CPU int4 layout), built lazily.
        self._kernel_cache: dict[str, object] = {}
        # Whether the reference path may keep its dequantized float weight between calls
        # (fast; but over all layers of a big model that is a float copy of it).
        self.cache_dequantized = True

    @classmethod
    def from_result(
        cls, result: QuantResult, bias: torch.Tensor | None, scale_dtype: torch.dtype = torch.float16
    ) -> QuantLinear:
        out_f, in_f = result.codes.shape
        scheme = result.scheme
        layer = cls(in_f, out_f, scheme.bits, scheme.group_size, bias is not None, scale_dtype)
        layer.qweight.copy_(pack_transposed(result.codes, scheme.bits))
        layer.qzeros.copy_(pack_cols(result.zeros, scheme.bits))
        layer.scales.copy_(result.scales.to(scale_dtype))
        layer.g_idx.copy_(result.g_idx.to(torch.int32))
        if bias is not None:
            layer.bias = bias.detach().to(scale_dtype).clone()
        return layer

    def dequantized_weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The float weight [out, in] this layer represents."""
        from qcal_kernels.reference import dequantize_packed

        w = dequantize_packed(self.qweight, self.qzeros, self.scales, self.g_idx, self.bits)
        return w.T.contiguous().to(dtype)

    def _apply(self, fn, recurse=True):  # type: ignore[no-untyped-def]
        self._kernel_cache.clear()  # a device/dtype move invalidates repacked weights
        return super()._apply(fn, recurse)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Triton on CUDA, torch's int4 op on CPU, else the reference (kernels/dispatch.py;
        `QCAL_KERNEL=reference|cpu|triton` forces one)."""
        from qcal_kernels.dispatch import quant_linear_forward

        return quant_linear_forward(self, x)

    def kernel_backend(self, x: torch.Tensor) -> str:
        """The backend `forward(x)` would use: 'triton', 'cpu' or 'reference'."""
        from qcal_kernels.dispatch import select_backend

        return select_backend(self, x)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bits={self.bits}, group_size={self.group_size}, bias={self.bias is not None}"
        )
