"""The second-order statistics GPTQ works from: H = 2 X X^T / n and its damped inverse.

Pure tensor functions; callers own the hooks that feed them.
"""

from __future__ import annotations

import math

import torch

from qcal.errors import NumericalError
from qcal.quant.finite import all_finite

# Each failed Cholesky multiplies damp_percent by this, up to MAX_DAMP_PERCENT
# (a damp of the full mean diagonal; beyond that GPTQ degenerates towards RTN).
DAMP_GROWTH = 10.0
MAX_DAMP_PERCENT = 1.0


def accumulate_hessian(
    inp: torch.Tensor, hessian: torch.Tensor | None, n: int
) -> tuple[torch.Tensor, int]:
    """Fold a batch of inputs `inp` [..., in] into the running mean H = 2/n * sum x x^T.

    Returns (H, n) with n counting tokens. Rows are scaled by sqrt(2 / n_total) before
    the product, so H stays a float32 mean of O(|x|^2) whatever the token count.
    """
    x = inp.reshape(-1, inp.shape[-1])
    tokens = x.shape[0]
    if hessian is None:
        hessian = torch.zeros(x.shape[1], x.shape[1], dtype=torch.float32, device=x.device)
    if tokens == 0:
        return hessian, n
    total = n + tokens
    hessian.mul_(n / total)
    x = x.to(torch.float32) * math.sqrt(2.0 / total)
    hessian.addmm_(x.T, x)
    return hessian, total


def check_hessian(hessian: torch.Tensor, name: str = "layer") -> None:
    """Raise NumericalError if H holds NaN/Inf (they come from the activations)."""
    if not all_finite(hessian):
        raise NumericalError(
            f"the calibration activations entering {name} contain NaN or Inf; check the model "
            "weights (does the float model produce finite logits?) and the calibration data, "
            "or run in float32"
        )


def dead_columns(hessian: torch.Tensor) -> torch.Tensor:
    """Bool mask [in] of input channels that were exactly zero on every calibration token."""
    return hessian.diagonal() == 0


def inverse_cholesky(
    hessian: torch.Tensor, damp_percent: float, name: str = "layer",
    max_damp_percent: float = MAX_DAMP_PERCENT,
) -> tuple[torch.Tensor, float]:
    """Upper Cholesky factor U of (H + damp * mean(diag H) * I)^-1, and the damp used.

    When H + damp is not positive definite in float32, damp_percent grows by
    DAMP_GROWTH up to `max_damp_percent`; past that a NumericalError says so.
    Dead channels must already have a non-zero diagonal (see `dead_columns`).
    """
    check_hessian(hessian, name)
    diag = hessian.diagonal()
    if bool((diag < 0).any()):
        worst = int(torch.argmin(diag))
        raise NumericalError(
            f"the Hessian of {name} has a negative diagonal entry ({float(diag[worst]):.3g} at "
            f"input {worst}); a sum of squares cannot be negative, so the statistics are corrupt "
            "(overflow in low precision?): quantize in float32 and check the calibration data"
        )
    mean_diag = float(diag.mean())
    if mean_diag <= 0:
        raise NumericalError(
            f"the Hessian of {name} has no positive diagonal entries (all inputs are zero); "
            "check the calibration data reaches this layer"
        )
    damp = damp_percent
    n = hessian.shape[-1]
    while True:
        # One in^2 matrix besides the caller's H (822 MB for a 14336-channel input): the
        # factorisation, the inverse and its factor all run in place on it. It is laid out
        # column-major, as LAPACK works, or torch would make a private copy at every step.
        work = torch.empty_strided((n, n), (1, n), dtype=hessian.dtype, device=hessian.device)
        work.copy_(hessian)
        work.diagonal().add_(damp * mean_diag)
        info = torch.empty((), dtype=torch.int32, device=hessian.device)
        torch.linalg.cholesky_ex(work, out=(work, info))
        if int(info) == 0:
            torch.cholesky_inverse(work, out=work)
            torch.linalg.cholesky_ex(work, upper=True, out=(work, info))
            if int(info) == 0 and all_finite(work):
                return work, damp
        del work
        if damp * DAMP_GROWTH > max_damp_percent * (1 + 1e-9):
            break
        damp *= DAMP_GROWTH
    # At the ceiling a larger --damp is no fix (GPTQ would degenerate towards RTN).
    larger = ("" if damp >= max_damp_percent * 0.999
              else f"pass a larger --damp (up to {max_damp_percent:g}), ")
    raise NumericalError(
        f"the Hessian of {name} is not positive definite even with damp_percent={damp:g}; "
        f"{larger}use more calibration samples (--nsamples), or check the calibration "
        "activations for degenerate values (NaN/Inf or constant inputs)"
    )


def hessian_loss(weight: torch.Tensor, quantized: torch.Tensor, hessian: torch.Tensor) -> float:
    """tr(D H D^T) / 2 with D = W - Q: with H from `accumulate_hessian`, the mean over
    calibration tokens of the squared output error ||(W - Q) x||^2 (summed over outputs)."""
    d = weight.float() - quantized.float()
    return float((d @ hessian).mul_(d).sum()) / 2.0
