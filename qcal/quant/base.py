"""What every quantizer returns, and the RTN baseline."""

from __future__ import annotations

import dataclasses

import torch

from qcal.config import QuantScheme
from qcal.quant import intgrid as grid


@dataclasses.dataclass
class QuantResult:
    """One quantized linear layer, in the orientation of the GPTQ checkpoint layout.

    codes: int32 [out, in] in [0, 2**bits - 1]; scales: float32 [groups, out];
    zeros: int32 [groups, out] (true zero points, not the v1 "minus one" storage);
    g_idx: int32 [in] group of each input channel; loss: the method's layer loss.
    """

    codes: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor
    g_idx: torch.Tensor
    scheme: QuantScheme
    loss: float | None = None

    def dequantize(self) -> torch.Tensor:
        return grid.dequantize_grouped(self.codes, self.scales, self.zeros, self.g_idx)

    def validate(self, out_features: int, in_features: int) -> None:
        groups = self.scales.shape[0]
        assert self.codes.shape == (out_features, in_features), self.codes.shape
        assert self.scales.shape == (groups, out_features), self.scales.shape
        assert self.zeros.shape == (groups, out_features), self.zeros.shape
        assert self.g_idx.shape == (in_features,), self.g_idx.shape
        assert int(self.codes.min()) >= 0 and int(self.codes.max()) <= self.scheme.maxq


def rtn_quantize(w: torch.Tensor, scheme: QuantScheme, name: str = "layer") -> QuantResult:
    """Round-to-nearest on a per-group min/max grid (no calibration data)."""
    out_f, in_f = w.shape
    scales, zeros = grid.grouped_params(w, scheme, name=name)
    g_idx = grid.group_index(in_f, scheme.effective_group(in_f))
    codes = grid.quantize_grouped(w, scales, zeros, g_idx, scheme.maxq)
    return QuantResult(codes, scales, zeros.to(torch.int32), g_idx, scheme)
