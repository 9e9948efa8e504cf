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


# From this many input channels on, `accumulate_hessian(upper_only=True)` pays off: it
# computes the upper triangle in row blocks, about 0.55x a full product's multiply-adds
# (1.9x faster at 8960 channels on this project's CPU; scripts in results/gptq_phase_split.md).
# Below it the saving is milliseconds, and the small models' checkpoints stay bit-identical.
SYMMETRIC_FROM = 4096
_BLOCK = 512


def accumulate_hessian(
    inp: torch.Tensor, hessian: torch.Tensor | None, n: int, upper_only: bool = False,
) -> tuple[torch.Tensor, int]:
    """Fold a batch of inputs `inp` [..., in] into the running mean H = 2/n * sum x x^T.

    Returns (H, n) with n counting tokens. Rows are scaled by sqrt(2 / n_total) before
    the product, so H stays a float32 mean of O(|x|^2) whatever the token count.
    `upper_only` fills only the upper triangle (diagonal included): H is symmetric, so half
    the work suffices; `mirror_upper_` completes it once every batch is in.
    """
    x = inp.reshape(-1, inp.shape[-1])
    tokens = x.shape[0]
    if hessian is None:
        hessian = torch.zeros(x.shape[1], x.shape[1], dtype=torch.float32, device=x.device)
    if tokens == 0:
        return hessian, n
    total = n + tokens
    hessian.mul_(n / total)
    if not upper_only:
        x = x.to(torch.float32) * math.sqrt(2.0 / total)
        hessian.addmm_(x.T, x)
        return hessian, total
    # The scale goes into the product (alpha), not into a scaled copy of x: at 8960 channels
    # one batch's copy is 0.14 GiB beside the MLP's own intermediates.
    x = x.to(torch.float32)
    for start in range(0, x.shape[1], _BLOCK):
        stop = start + _BLOCK
        # Rows [start, stop) from the diagonal block rightwards: a view with H's own row
        # stride, which BLAS writes in place.
        hessian[start:stop, start:].addmm_(x[:, start:stop].T, x[:, start:], alpha=2.0 / total)
    return hessian, total


def mirror_upper_(hessian: torch.Tensor) -> torch.Tensor:
    """Copy the strict upper triangle onto the lower one, in place, a block at a time (no
    second in x in matrix): completes an `accumulate_hessian(upper_only=True)` result."""
    n = hessian.shape[0]
    for start in range(0, n, _BLOCK):
        stop = min(start + _BLOCK, n)
        block = hessian[start:stop, start:stop]
        block.copy_(block.triu() + block.triu(1).T)
        hessian[stop:, start:stop] = hessian[start:stop, stop:].T
    return hessian


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
    max_damp_percent: float = MAX_DAMP_PERCENT, perm: torch.Tensor | None = None,
    dead: torch.Tensor | None = None,
) -> tuple[torch.Tensor, float]:
    """Upper Cholesky factor U of (H' + damp * mean(diag H') * I)^-1, and the damp used,
    where H' is H with rows and columns in the order `perm` (act-order; None: as is) and a
    diagonal of 1 at the channels `dead` marks (a bool mask in H' order: inputs that were
    zero on every token, see `dead_columns`).

    H' is built straight into the one working matrix, never as a copy of its own: beside
    the caller's H that is the only in^2 matrix here. When H' + damp is not positive
    definite in float32, damp_percent grows by DAMP_GROWTH up to `max_damp_percent`; past
    that a NumericalError says so.
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
    damp = damp_percent
    n = hessian.shape[-1]
    while True:
        # The factorisation, the inverse and its factor all run in place on `work` (822 MB
        # for a 14336-channel input). It is laid out column-major, as LAPACK works, or
        # torch would make a private copy at every step.
        work = torch.empty_strided((n, n), (1, n), dtype=hessian.dtype, device=hessian.device)
        _fill(work, hessian, perm, dead)
        mean_diag = float(work.diagonal().mean())
        if mean_diag <= 0:
            raise NumericalError(
                f"the Hessian of {name} has no positive diagonal entries (all inputs are "
                "zero); check the calibration data reaches this layer"
            )
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


def _fill(work: torch.Tensor, hessian: torch.Tensor, perm: torch.Tensor | None,
          dead: torch.Tensor | None) -> None:
    """work[i, j] = hessian[perm[i], perm[j]], a block of columns at a time (each gather
    is in x 512 floats), then a diagonal of 1 where `dead`."""
    if perm is None:
        work.copy_(hessian)
    else:
        for start in range(0, work.shape[1], _BLOCK):
            cols = perm[start:start + _BLOCK]
            work[:, start:start + cols.numel()] = hessian[:, cols][perm]
    if dead is not None and bool(dead.any()):
        work.diagonal()[dead] = 1.0


def hessian_loss(weight: torch.Tensor, quantized: torch.Tensor, hessian: torch.Tensor) -> float:
    """tr(D H D^T) / 2 with D = W - Q: with H from `accumulate_hessian`, the mean over
    calibration tokens of the squared output error ||(W - Q) x||^2 (summed over outputs)."""
    d = weight.float() - quantized.float()
    return float((d @ hessian).mul_(d).sum()) / 2.0
