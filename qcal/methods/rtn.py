"""Round-to-nearest: every linear on its own min/max grid, no calibration data."""

from __future__ import annotations

import torch
from torch import nn
from tqdm.auto import tqdm

from qcal.config import RTNConfig
from qcal.methods.registry import QuantMethod, RunOptions, apply_result, iter_layer_linears
from qcal.model.arch import get_module
from qcal.model.resolve import arch_for
from qcal.quant.base import rtn_quantize


def run_rtn(model: nn.Module, cfg: RTNConfig, calib: torch.Tensor | None,
            opts: RunOptions) -> dict[str, float | None]:
    arch = arch_for(model)
    losses: dict[str, float | None] = {}
    names = iter_layer_linears(model, arch, opts.selection)
    for _, name in tqdm(names, desc="rtn", disable=not opts.progress):
        weight = get_module(model, name).weight.detach()
        result = rtn_quantize(weight, cfg.scheme, name=name)
        losses[name] = float((result.dequantize() - weight.float()).pow(2).sum())
        apply_result(model, name, result, opts.packed)
    return losses


METHOD = QuantMethod("rtn", RTNConfig, False, run_rtn)


METHOD = QuantMethod("rtn", RTNConfig, False, run_rtn)
