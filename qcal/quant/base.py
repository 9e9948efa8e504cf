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


def grid_result(w: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                scheme: QuantScheme, with_loss: bool = True) -> QuantResult:
    """`w` [out, in] quantized on contiguous-group params `scales` / `zeros` [groups, out];
    `with_loss`: `loss` is the squared error of the dequantized weight."""
    g_idx = grid.group_index(w.shape[1], scheme.effective_group(w.shape[1]))
    codes = grid.quantize_grouped(w, scales, zeros, g_idx, scheme.maxq)
    result = QuantResult(codes, scales, zeros.to(torch.int32), g_idx, scheme)
    if with_loss:
        result.loss = float((result.dequantize() - w.float()).pow(2).sum())
    return result


def rtn_quantize(w: torch.Tensor, scheme: QuantScheme, name: str = "layer",
                 with_loss: bool = False) -> QuantResult:
    """Round-to-nearest on a per-group min/max grid (no calibration data).

    `with_loss` also sets `loss`, the squared error of the dequantized weight. Contiguous
    whole groups (every RTN call but a ragged last group) take a broadcast path over the
    [out, groups, group] view: the same grid, codes and loss as the gathered form, without
    [out, in]-sized copies of the scales and zeros (RTN of a large model is this loop)."""
    out_f, in_f = w.shape
    g = scheme.effective_group(in_f)
    groups = scheme.groups_for(in_f, name)
    g_idx = grid.group_index(in_f, g)
    if groups * g != in_f:
        scales, zeros = grid.grouped_params(w, scheme, name=name)
        return grid_result(w, scales, zeros, scheme, with_loss)
    wf = w.float().reshape(out_f, groups, g)
    scale, zero = grid.find_params(wf, scheme.bits, scheme.sym)  # [out, groups]
    s, z = scale.unsqueeze(-1), zero.unsqueeze(-1)
    q = torch.div(wf, s).round_().add_(z).clamp_(0, scheme.maxq)
    codes = q.to(torch.int32).reshape(out_f, in_f)
    loss = None
    if with_loss:
        loss = float(q.sub_(z).mul_(s).sub_(wf).pow_(2).sum())
    return QuantResult(codes, scale.T.contiguous(), zero.T.contiguous().to(torch.int32), g_idx,
                       scheme, loss)
