"""Folding an AWQ scale into modules: the previous op's output becomes x / s and each
consumer linear's columns W * s, so the float function is unchanged. Shared by the AWQ
runner and by the architecture resolver's fold probe, which checks exactly this on a twin."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from qcal.quant import awq


@torch.no_grad()
def fold_into(prev: nn.Module, linears: Iterable[nn.Module], s: torch.Tensor,
              norm_offset: float = 0.0) -> None:
    """`prev` (a linear, or a norm scaling by w + norm_offset) and its consumer `linears`."""
    bias = getattr(prev, "bias", None)
    if isinstance(prev, nn.Linear):
        w, b = awq.fold_into_linear_out(prev.weight, bias, s)
    else:
        w, b = awq.fold_into_norm(prev.weight, bias, s, norm_offset)
    prev.weight.copy_(w)
    if b is not None:
        bias.copy_(b)
    for lin in linears:
        lin.weight.copy_(awq.scale_linear_in(lin.weight, s))
