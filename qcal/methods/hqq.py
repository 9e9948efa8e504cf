"""HQQ: half-quadratic quantization (Badri & Shaji, 2023): a group's scale and zero point
solved with no calibration data, the data-free baseline every calibration claim must beat.

HQQ minimises the sparsity-promoting error ||W - s (Q - z)||_p^p (p = lp_norm < 1, so a
few large errors cost less than many small ones) by half-quadratic splitting: an auxiliary
error W_e is shrunk by the generalised soft-threshold of the l_p norm, then the grid has a
closed form on W - W_e; beta grows by kappa each iteration. Defaults as the reference
(hqq's optimize_weights_proximal: p 0.7, beta 10, kappa 1.01, 20 iterations).

Where qcal differs from the reference, and why: the reference keeps the min/max scale and
solves a *float* zero point. Every format qcal writes stores integer zero points, and
rounded, that zero-only step never moves off RTN's zero (measured on the unit tests'
weights: every group identical to RTN). So the closed-form step here fits scale and zero
together (the least-squares line of W - W_e on the codes), rounds the zero to the grid and
refits the scale for it; the float zeros are never approximated silently. And instead of
stopping the whole tensor at the first iteration whose mean |W - W_r| grows, each group
keeps its best iterate by that error, the start (plain RTN's min/max grid, whose range
contains 0) included, so no group ends worse than RTN. A ragged group's zero padding is
left out of the fit and the error. The result is an ordinary grid: it packs, saves, loads
and streams as RTN does.

This file is the whole method: config, pure function, runner, CLI flags and their schema.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Annotated, Any

import torch
from pydantic import Field

from qcal.config import QuantScheme
from qcal.errors import ConfigError
from qcal.methods.registry import MethodFlag, QuantMethod
from qcal.methods.rtn import weight_only_runner
from qcal.quant import intgrid as grid
from qcal.quant.base import QuantResult, grid_result


@dataclasses.dataclass(frozen=True)
class HQQConfig:
    """HQQ's half-quadratic grid solver: l_p norm, penalty beta growing by kappa."""

    scheme: QuantScheme = QuantScheme()
    lp_norm: float = 0.7
    beta: float = 10.0
    kappa: float = 1.01
    iters: int = 20

    def __post_init__(self) -> None:
        if self.scheme.sym:
            raise ConfigError("HQQ solves for zero points, which a symmetric grid fixes; "
                              "drop --sym")
        if not 0 < self.lp_norm <= 1:  # NaN fails this too
            raise ConfigError(f"lp_norm={self.lp_norm} must lie in (0, 1]; try 0.7")
        if not (self.beta > 0 and math.isfinite(self.beta)):
            raise ConfigError(f"beta={self.beta} must be > 0; try 10")
        if not (self.kappa >= 1 and math.isfinite(self.kappa)):
            raise ConfigError(f"kappa={self.kappa} must be >= 1; try 1.01")
        if isinstance(self.iters, bool) or not isinstance(self.iters, int) or self.iters < 0:
            raise ConfigError(f"iters={self.iters!r} must be an integer >= 0; try 20")


def shrink_lp(x: torch.Tensor, beta: float, p: float) -> torch.Tensor:
    """The proximal operator of |x|^p / beta (generalised soft-threshold), elementwise."""
    magnitude = x.abs()
    if p == 1:
        threshold = torch.full_like(magnitude, 1.0 / beta)
    else:
        threshold = (magnitude + 1e-8).pow(p - 1) / beta
    return torch.sign(x) * torch.relu(magnitude - threshold)


def _dequant(view: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor,
             maxq: int) -> torch.Tensor:
    return (torch.round(view / scale) + zero).clamp_(0, maxq).sub_(zero).mul_(scale)


def _masked_mean_abs(x: torch.Tensor, valid: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    return (x.abs_() * valid).sum(dim=-1, keepdim=True) / count


def _fit_grid(target: torch.Tensor, codes: torch.Tensor, valid: torch.Tensor,
              count: torch.Tensor, scale: torch.Tensor, maxq: int
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """The (scale, integer zero) whose grid s (Q - z) is closest to `target` in least squares
    on the codes Q: the regression line of target on Q gives s and z, z is rounded to the grid
    and s refitted for it. A group where the fit degenerates (constant codes, s <= 0) keeps
    its `scale`."""
    q_mean = (codes * valid).sum(-1, keepdim=True) / count
    t_mean = (target * valid).sum(-1, keepdim=True) / count
    dq = (codes - q_mean) * valid
    slope = (dq * (target - t_mean)).sum(-1, keepdim=True) / dq.pow(2).sum(-1, keepdim=True)
    ok = torch.isfinite(slope) & (slope > 0)
    slope = torch.where(ok, slope, scale)
    zero = torch.round(q_mean - t_mean / slope).clamp_(0, maxq)
    centred = (codes - zero) * valid
    refit = (centred * target).sum(-1, keepdim=True) / centred.pow(2).sum(-1, keepdim=True)
    ok = torch.isfinite(refit) & (refit > 0)
    return torch.where(ok, refit, scale), zero


def hqq_solve(view: torch.Tensor, valid: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor,
              maxq: int, cfg: HQQConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, integer zero) [rows, groups, 1] for `view` [rows, groups, g] (`valid` 1 on real
    entries, 0 on a ragged group's padding), starting from the min/max grid (`scale`,
    `zero`); each group keeps the iterate with the lowest mean |w - q|, the start included."""
    count = valid.sum(-1, keepdim=True)
    best_scale, best_zero = scale.clone(), zero.clone()
    best_err = _masked_mean_abs(_dequant(view, scale, zero, maxq) - view, valid, count)
    s, z, beta = scale.clone(), zero.clone(), cfg.beta
    for _ in range(cfg.iters):
        codes = (torch.round(view / s) + z).clamp_(0, maxq)
        err_aux = shrink_lp(view - (codes - z) * s, beta, cfg.lp_norm)
        s, z = _fit_grid(view - err_aux, codes, valid, count, s, maxq)
        beta *= cfg.kappa
        err = _masked_mean_abs(_dequant(view, s, z, maxq) - view, valid, count)
        better = err < best_err  # strict: the earlier iterate (RTN first) wins ties
        best_err = torch.where(better, err, best_err)
        best_scale = torch.where(better, s, best_scale)
        best_zero = torch.where(better, z, best_zero)
    return best_scale, best_zero


def hqq_quantize(w: torch.Tensor, cfg: HQQConfig, name: str = "layer") -> QuantResult:
    """Quantize `w` [out, in] on min/max scales with HQQ's zero points; `loss` is the
    squared error of the dequantized weight, as RTN's."""
    scheme = cfg.scheme
    view = grid.group_view(w, scheme, name)
    _, groups, g = view.shape
    valid = torch.ones(groups * g, dtype=torch.float32, device=w.device)
    valid[w.shape[1]:] = 0
    valid = valid.reshape(1, groups, g)
    scale, zero = grid.find_params(view, scheme.bits, sym=False)
    scale, zero = hqq_solve(view, valid, scale.unsqueeze(-1), zero.unsqueeze(-1), scheme.maxq,
                            cfg)
    return grid_result(w, scale.squeeze(-1).T.contiguous(), zero.squeeze(-1).T.contiguous(),
                       scheme)


def _quantize_weight(weight: torch.Tensor, cfg: HQQConfig, name: str) -> QuantResult:
    return hqq_quantize(weight, cfg, name)


def option_rules(options: Any) -> None:
    # Every method's rules see every command's options: this one is HQQ's alone.
    if options.method == "hqq" and options.sym:
        raise ValueError("--method hqq solves for zero points, which --sym fixes; drop --sym")


FLAGS = (
    MethodFlag("hqq_lp_norm", "lp_norm", "HQQ: the p of the l_p error it minimises, in (0, 1] "
               "(default %(default)s)", value_type=float, default=0.7,
               schema=Annotated[float, Field(gt=0, le=1, description="a number in (0, 1]")]),
    MethodFlag("hqq_iters", "iters", "HQQ: half-quadratic iterations (default %(default)s)",
               value_type=int, default=20,
               schema=Annotated[int, Field(ge=0, le=10_000,
                                           description="an integer in [0, 10000]")]),
)

METHOD = QuantMethod("hqq", HQQConfig, False, weight_only_runner("hqq", _quantize_weight),
                     flags=FLAGS, option_rules=option_rules)
