"""SignRound (AutoRound's algorithm; Cheng et al., "Optimize Weight Rounding via Signed
Gradient Descent for the Quantization of LLMs", 2023) as pure tensor functions.

Each weight gets a learnable rounding offset v (one per weight, kept in [-0.5, 0.5]: it
can flip a rounding up or down, never further) and each group learnable clipping factors
for its min and max (in [0, 1]: they only shrink the range). The fake-quantized weight

    q = clamp(round(w / s + v) + z, 0, maxq),   s = (max * f_max - min * f_min) / maxq

is differentiable through straight-through rounding, so a block's output error can train
v and the factors (qcal.methods.autoround). With v = 0 and both factors 1 it is RTN's
min/max grid exactly, which is where the training starts.
"""

from __future__ import annotations

import torch

from qcal.config import QuantScheme
from qcal.quant import intgrid as grid
from qcal.quant.base import QuantResult


def _round_ste(x: torch.Tensor) -> torch.Tensor:
    """round(x) forward, identity backward (the straight-through estimator)."""
    return x + (torch.round(x) - x).detach()


def _clipped_grid(wg: torch.Tensor, scheme: QuantScheme, f_min: torch.Tensor,
                  f_max: torch.Tensor, ste: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, zero) [out, groups] of the min/max grid of `wg` [out, groups, g] with its
    range scaled by the factors; `qcal.quant.intgrid.find_params`'s arithmetic, so factors
    of 1 give its grid bit for bit."""
    maxq = scheme.maxq
    xmin = torch.clamp(wg.amin(dim=-1), max=0.0) * f_min
    xmax = torch.clamp(wg.amax(dim=-1), min=0.0) * f_max
    if scheme.sym:
        xmax = torch.maximum(xmin.abs(), xmax)
        xmin = torch.where(xmin < 0, -xmax, xmin)
    empty = (xmin == 0) & (xmax == 0)  # a zero row (or factors of 0): a unit range
    xmin = torch.where(empty, torch.full_like(xmin, -1.0), xmin)
    xmax = torch.where(empty, torch.full_like(xmax, 1.0), xmax)
    scale = (xmax - xmin) / maxq
    if scheme.sym:
        return scale, torch.full_like(scale, (maxq + 1) / 2)
    ratio = -xmin / scale
    zero = torch.clamp(_round_ste(ratio) if ste else torch.round(ratio), 0, maxq)
    return scale, zero


def signround_weight(weight: torch.Tensor, scheme: QuantScheme, v: torch.Tensor,
                     f_min: torch.Tensor, f_max: torch.Tensor) -> torch.Tensor:
    """The fake-quantized weight [out, in] (float32), differentiable in `v` [out, groups, g]
    and the factors [out, groups]; `weight` itself is a constant."""
    out_f, in_f = weight.shape
    wg = grid.group_view(weight.detach(), scheme)
    scale, zero = _clipped_grid(wg, scheme, f_min, f_max, ste=True)
    s, z = scale.unsqueeze(-1), zero.unsqueeze(-1)
    q = torch.clamp(_round_ste(wg / s + v) + z, 0, scheme.maxq)
    return ((q - z) * s).reshape(out_f, -1)[:, :in_f]


def signround_result(weight: torch.Tensor, scheme: QuantScheme, v: torch.Tensor,
                     f_min: torch.Tensor, f_max: torch.Tensor) -> QuantResult:
    """The learned grid as integer codes: what `signround_weight` computes, stored. Its
    `loss` is the squared error of the dequantized weight."""
    out_f, in_f = weight.shape
    with torch.no_grad():
        wg = grid.group_view(weight, scheme)
        scale, zero = _clipped_grid(wg, scheme, f_min.float(), f_max.float(), ste=False)
        s, z = scale.unsqueeze(-1), zero.unsqueeze(-1)
        q = torch.div(wg, s).add_(v.float()).round_().add_(z).clamp_(0, scheme.maxq)
        codes = q.to(torch.int32).reshape(out_f, -1)[:, :in_f].contiguous()
        g_idx = grid.group_index(in_f, scheme.effective_group(in_f))
        result = QuantResult(codes, scale.T.contiguous(), zero.T.contiguous().to(torch.int32),
                             g_idx, scheme)
        result.loss = float((result.dequantize() - weight.float()).pow(2).sum())
    return result


def sign_step_(params: list[torch.Tensor], lr: float) -> None:
    """Signed gradient descent, in place: p -= lr * sign(grad); gradients are cleared."""
    with torch.no_grad():
        for p in params:
            if p.grad is not None:
                p.sub_(torch.sign(p.grad), alpha=lr)
                p.grad = None
