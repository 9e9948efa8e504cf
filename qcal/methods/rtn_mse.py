"""RTN-MSE: round-to-nearest on a clipped grid, the clip searched per group; no calibration data.

Each group's min/max range is shrunk by the factor 1 - i/mse_grid (i = 0 .. mse_maxshrink *
mse_grid) that minimises sum |w - q|^mse_norm over the group, the weight-only "mse" observer
that GPTQ's reference, GPTQModel and llm-compressor offer (defaults 100, 0.8, 2.4 as there).
Factor 1 (plain RTN) is always a candidate and wins ties, so a one-point grid is RTN itself.
The result is an ordinary grid (scales, zeros, contiguous g_idx): it packs, saves, loads and
streams from disk exactly as RTN does, through RTN's runner.

This file is the whole method: config, pure function, runner, CLI flags and their schema.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Annotated

import torch
from pydantic import Field

from qcal.config import QuantScheme
from qcal.errors import ConfigError
from qcal.methods.registry import MethodFlag, QuantMethod
from qcal.methods.rtn import weight_only_runner
from qcal.quant import intgrid as grid
from qcal.quant.base import QuantResult, grid_result


@dataclasses.dataclass(frozen=True)
class RTNMSEConfig:
    """RTN with a per-group clip: shrink factors 1 - i/mse_grid down to 1 - mse_maxshrink,
    the one minimising sum |w - q|^mse_norm kept."""

    scheme: QuantScheme = QuantScheme()
    mse_grid: int = 100
    mse_maxshrink: float = 0.8
    mse_norm: float = 2.4

    def __post_init__(self) -> None:
        if isinstance(self.mse_grid, bool) or not isinstance(self.mse_grid, int) \
                or self.mse_grid < 1:
            raise ConfigError(f"mse_grid={self.mse_grid!r} must be an integer >= 1; try 100")
        if not 0 <= self.mse_maxshrink < 1:
            raise ConfigError(f"mse_maxshrink={self.mse_maxshrink} must lie in [0, 1); try 0.8")
        if not (self.mse_norm > 0 and math.isfinite(self.mse_norm)):
            raise ConfigError(f"mse_norm={self.mse_norm} must be > 0; try 2.4 (or 2: squared error)")

    def shrink_factors(self) -> list[float]:
        return [1.0 - i / self.mse_grid for i in range(int(self.mse_maxshrink * self.mse_grid) + 1)]


def mse_clip_quantize(w: torch.Tensor, cfg: RTNMSEConfig, name: str = "layer",
                      importance: torch.Tensor | None = None) -> QuantResult:
    """Quantize `w` [out, in] on per-group grids whose clip minimises sum |w - q|^mse_norm,
    or, given `importance` [in] (an input channel's calibration energy E[x^2], llama.cpp's
    imatrix), sum importance * |w - q|^mse_norm: the error where the inputs are large counts
    for more, a diagonal estimate of the output error.

    `loss` is the squared error of the dequantized weight, as RTN's. A ragged last group is
    scored with zero padding, which the grid represents exactly (its range contains 0)."""
    scheme = cfg.scheme
    view = grid.group_view(w, scheme, name)
    weights = None
    if importance is not None:
        if tuple(importance.shape) != (w.shape[1],):
            raise ConfigError(f"the importances of {name} have shape {tuple(importance.shape)}, "
                              f"its weight {tuple(w.shape)}: they must come from its inputs")
        # Padding channels weigh 0, as they hold exact zeros.
        weights = grid.group_view(importance.reshape(1, -1), scheme, name)
    best = best_scale = best_zero = torch.empty(0)
    for i, shrink in enumerate(cfg.shrink_factors()):
        scale, zero = grid.find_params(view, scheme.bits, scheme.sym, shrink=shrink)
        s, z = scale.unsqueeze(-1), zero.unsqueeze(-1)
        # intgrid.fake_quantize's arithmetic in one float buffer (no integer round trip):
        # the search is this line, mse_grid * mse_maxshrink + 1 times per weight.
        err = (torch.div(view, s).round_().add_(z).clamp_(0, scheme.maxq).sub_(z).mul_(s)
               .sub_(view).abs_().pow_(cfg.mse_norm))
        err = (err if weights is None else err.mul_(weights)).sum(dim=-1)
        if i == 0:  # the full range (plain RTN) is the start, whatever its error
            best, best_scale, best_zero = err, scale, zero
            continue
        better = err < best  # strict: the wider range wins ties
        best = torch.where(better, err, best)
        best_scale = torch.where(better, scale, best_scale)
        best_zero = torch.where(better, zero, best_zero)
    return grid_result(w, best_scale.T.contiguous(), best_zero.T.contiguous(), scheme)


def _quantize_weight(weight: torch.Tensor, cfg: RTNMSEConfig, name: str) -> QuantResult:
    return mse_clip_quantize(weight, cfg, name)


FLAGS = (
    MethodFlag("mse_grid", "mse_grid", "RTN-MSE/RTN-imatrix: shrink factors 1 - i/N searched per group "
               "(default %(default)s)", value_type=int, default=100,
               schema=Annotated[int, Field(ge=1, le=10_000,
                                           description="an integer in [1, 10000]")]),
    MethodFlag("mse_maxshrink", "mse_maxshrink", "RTN-MSE/RTN-imatrix: the most a group's range may shrink, "
               "a fraction in [0, 1) (default %(default)s)", value_type=float, default=0.8,
               schema=Annotated[float, Field(ge=0, lt=1, description="a fraction in [0, 1)")]),
    MethodFlag("mse_norm", "mse_norm", "RTN-MSE/RTN-imatrix: the error each clip is scored by, sum "
               "|w - q|^p (default %(default)s; 2: squared error)", value_type=float, default=2.4,
               # inf would score every clip alike and turn the search off silently (issue 52)
               schema=Annotated[float, Field(gt=0, le=100, allow_inf_nan=False,
                                             description="a number in (0, 100]")]),
)

METHOD = QuantMethod("rtn-mse", RTNMSEConfig, False,
                     weight_only_runner("rtn-mse", _quantize_weight), flags=FLAGS)
