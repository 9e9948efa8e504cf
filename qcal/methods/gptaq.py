"""GPTAQ ("GPTQ v2", asymmetric calibration): GPTQ whose quantized layer is fitted to the
float layer's outputs on the float model's inputs, min ||W X - Q X~||, instead of to its
own outputs on the quantized model's inputs (the tensor side: qcal.quant.gptaq).

The driver carries both streams layer by layer (qcal.model.sequential's reference stream:
the float model's hidden states, and a float copy of the layer being quantized, so memory
grows by one layer and one set of activations, both spilled and resumed like the
quantized stream). For each true-sequential step, every calibration batch goes through the
float copy (its linear inputs X) and then through the partly quantized layer (X~); the
step's Hessians H = X~ X~^T and cross terms C = (X - X~) X~^T accumulate side by side, one
per distinct input as GPTQ's do, and GPTQ's column loop runs with GPTAQ's extra feedback.
Everything else (act-order, groups, clip search, formats, torchrun, MoE) is GPTQ's.

This file is the whole method: config, statistics sink, runner, CLI flags.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Annotated

import torch
from pydantic import Field
from torch import nn

from qcal.config import GPTQConfig
from qcal.errors import ConfigError
from qcal.methods.gptq_runner import FLAGS as GPTQ_FLAGS
from qcal.methods.gptq_runner import HessianSink, checkpoint_fields, run_hessian_method
from qcal.methods.gptq_runner import option_rules as gptq_option_rules
from qcal.methods.registry import MethodFlag, QuantMethod, RunOptions
from qcal.model.capture import LayerInputs, feed_linear_inputs
from qcal.quant.gptaq import accumulate_cross


@dataclasses.dataclass(frozen=True)
class GPTAQConfig(GPTQConfig):
    """GPTQ's fields and defaults, plus `alpha`: the weight of the asymmetry correction
    (0.25, as the reference implementation and GPTQModel's `v2_alpha`; 0 is GPTQ)."""

    alpha: float = 0.25

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 <= self.alpha <= 1:
            raise ConfigError(f"alpha={self.alpha} must lie in [0, 1]; try 0.25")


class AsymmetricSink(HessianSink):
    """GPTQ's Hessians of the quantized model's inputs, and beside each the cross term C of
    the float model's inputs to the same linear (qcal.quant.gptaq.accumulate_cross)."""

    def __init__(self, names: list[str] | tuple[str, ...], alpha: float) -> None:
        super().__init__(names)
        self.alpha = alpha
        self.crosses: dict[str, torch.Tensor] = {}
        self._float: dict[str, torch.Tensor] = {}  # this batch's float inputs, by linear

    def feed(self, layer: nn.Module, inputs: LayerInputs, device: str) -> None:
        ref = inputs.reference
        if ref is None:
            raise ConfigError("GPTAQ needs the float model's stream beside the quantized one; "
                              "run it through qcal.methods.gptaq.run_gptaq")
        for index in range(len(inputs.hidden)):
            # Batch by batch, float first: C pairs each token's float and quantized inputs.
            self._float.clear()
            feed_linear_inputs(ref.layer, inputs.batch(index, reference=True), self.names,
                               self._float.__setitem__, device)
            feed_linear_inputs(layer, inputs.batch(index), self.names, self, device)
        self._float.clear()

    def __call__(self, name: str, x: torch.Tensor) -> None:
        before = self.counts.get(name, 0)
        super().__call__(name, x)
        if name in self.alias:  # shares an input already folded in for another linear
            return
        if name not in self._float:
            raise ConfigError(f"{name} received no input in the float layer; GPTAQ needs the "
                              "same linears on both streams")
        self.crosses[name], _ = accumulate_cross(self._float[name], x, self.crosses.get(name),
                                                 before)

    def asymmetry(self, name: str) -> tuple[torch.Tensor, float] | None:
        return self.crosses[self.owner(name)], self.alpha

    def statistics(self) -> tuple[dict[str, torch.Tensor], ...]:
        return (self.hessians, self.crosses)


def run_gptaq(model: nn.Module, cfg: GPTAQConfig, calib: torch.Tensor | None,
              opts: RunOptions) -> dict[str, float | None]:
    """Quantize every linear of the model's ArchSpec with GPTAQ; returns per-linear losses
    (GPTQ's: the output error on the quantized model's inputs)."""
    return run_hessian_method("gptaq", model, cfg, calib, opts,
                              functools.partial(AsymmetricSink, alpha=cfg.alpha),
                              reference_stream=True)


FLAGS = (
    *GPTQ_FLAGS,
    MethodFlag("gptaq_alpha", "alpha", "GPTAQ: weight of the asymmetry correction (0: GPTQ)",
               value_type=float, default=0.25,
               schema=Annotated[float, Field(ge=0, le=1, description="a weight in [0, 1]",
                                             examples=[0.25])]),
)

# GPTQ's rules between its flags and the format hold for GPTAQ as they are.
METHOD = QuantMethod("gptaq", GPTAQConfig, True, run_gptaq, checkpoint_fields, FLAGS,
                     gptq_option_rules)
