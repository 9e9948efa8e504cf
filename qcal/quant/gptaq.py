"""GPTAQ's asymmetric calibration as pure tensor functions (Li et al., "GPTQv2: Efficient
Finetuning-Free Quantization with Asymmetric Calibration", ICML 2025).

GPTQ fits the quantized layer to its own inputs: min ||W X~ - Q X~||, where X~ are the
inputs the partly quantized model feeds it. GPTAQ fits it to what the float model computes:
min ||W X - Q X~||, X the float model's inputs to the same linear. Writing X = X~ + dX, the
extra term is W dX X~^T H^-1 (H = X~ X~^T); pushed through GPTQ's column loop it becomes one
more rank-one update per column, with

    P = alpha * triu(C U^T, 1) U,    C = 2/n * sum dX X~^T,    H^-1 = U^T U,

U being the upper Cholesky factor GPTQ already computes. When X = X~ (the first layer, or a
float model), C = 0 and the loop is GPTQ's exactly. `alpha` (0.25 in the reference code and
GPTQModel) damps the correction: C comes from a finite calibration set, as H does.
"""

from __future__ import annotations

import torch


def accumulate_cross(
    float_inp: torch.Tensor, quant_inp: torch.Tensor, cross: torch.Tensor | None, n: int,
) -> tuple[torch.Tensor, int]:
    """Fold one batch into the running mean C = 2/n * sum (x - x~) x~^T ([in, in]; rows index
    the float-minus-quantized difference, columns the quantized input), scaled exactly as
    `qcal.quant.hessian.accumulate_hessian` scales H, so C and H of the same tokens pair up.
    Returns (C, n) with n counting tokens."""
    x_f = float_inp.reshape(-1, float_inp.shape[-1])
    x_q = quant_inp.reshape(-1, quant_inp.shape[-1])
    if x_f.shape != x_q.shape:
        raise ValueError(f"float inputs {tuple(x_f.shape)} and quantized inputs "
                         f"{tuple(x_q.shape)} must cover the same tokens")
    tokens = x_q.shape[0]
    if cross is None:
        cross = torch.zeros(x_q.shape[1], x_q.shape[1], dtype=torch.float32, device=x_q.device)
    if tokens == 0:
        return cross, n
    total = n + tokens
    cross.mul_(n / total)
    diff = x_f.to(torch.float32) - x_q.to(torch.float32)
    cross.addmm_(diff.T, x_q.to(torch.float32), alpha=2.0 / total)
    return cross, total


def asymmetry_feedback(
    cross: torch.Tensor, upper: torch.Tensor, order: torch.Tensor | None,
    dead: torch.Tensor | None, alpha: float,
) -> torch.Tensor:
    """GPTAQ's P [in, in] in GPTQ's visiting order: alpha * triu(C' U^T, 1) U, where C' is
    `cross` with rows and columns in `order` (act-order; None: as is) and the columns of
    `dead` inputs (a mask in visiting order: zero on every token) zeroed, and `upper` is U,
    the factor `qcal.quant.hessian.inverse_cholesky` returned for the same order."""
    c = cross.to(device=upper.device, dtype=torch.float32)
    c = c[order][:, order] if order is not None else c.clone()
    if dead is not None and bool(dead.any()):
        c[:, dead] = 0.0
    c = c @ upper.T
    c.triu_(diagonal=1)
    feedback = c @ upper
    if alpha != 1.0:
        feedback.mul_(alpha)
    return feedback


def asymmetric_error(weight: torch.Tensor, quantized: torch.Tensor, float_inp: torch.Tensor,
                     quant_inp: torch.Tensor) -> float:
    """Mean over tokens of ||W x - Q x~||^2: what GPTAQ minimises (GPTQ: x = x~)."""
    x_f = float_inp.reshape(-1, float_inp.shape[-1]).float()
    x_q = quant_inp.reshape(-1, quant_inp.shape[-1]).float()
    out = x_f @ weight.float().T - x_q @ quantized.float().T
    return float(out.pow_(2).sum()) / max(1, x_q.shape[0])

