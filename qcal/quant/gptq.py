"""GPTQ as a pure tensor function: quantize one weight matrix given its Hessian.

Columns are quantized one at a time; each column's rounding error, scaled by the
inverse Hessian's Cholesky factor, is pushed onto the columns not yet quantized
(lazily: inside a block of `block_size` columns at once, onto the trailing columns
once per block). With act-order the columns are visited by descending diag(H);
codes are returned in the original column order and g_idx records each column's
group, which is what the GPTQ checkpoint layout stores.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from qcal.config import GPTQConfig, QuantScheme
from qcal.errors import ConfigError
from qcal.quant import intgrid as grid
from qcal.quant.base import QuantResult
from qcal.quant.gptaq import asymmetry_feedback
from qcal.quant.hessian import dead_columns, hessian_loss, inverse_cholesky

# Scales are stored as fp16 in the checkpoint. Rounding them *before* quantizing
# makes the error feedback see the grid that is actually stored, so the packed
# layer reproduces the fake-quant weights exactly.
_FP16_TINY = 2.0**-24


def _store_scale(scale: torch.Tensor) -> torch.Tensor:
    return scale.clamp(min=_FP16_TINY).to(torch.float16).float()


def group_params(
    w: torch.Tensor, scheme: QuantScheme, cfg: GPTQConfig,
    importance: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale [rows], zero [rows]) of the grid for the columns of `w` [rows, cols].

    With `cfg.mse_clip`, each row's range is shrunk by the factor (searched over
    1 - i / mse_grid) that minimises sum |w - q|^mse_norm, as in the GPTQ reference; with
    `cfg.imatrix_clip` each column's error is weighted by `importance` [cols] (its input
    channel's calibration energy: diag H).
    """
    scale, zero = grid.find_params(w, scheme.bits, scheme.sym)
    if cfg.mse_clip or cfg.imatrix_clip:
        w = w.float()
        best = torch.full((w.shape[0],), float("inf"), device=w.device)
        for i in range(int(cfg.mse_maxshrink * cfg.mse_grid) + 1):
            shrink = 1.0 - i / cfg.mse_grid
            s, z = grid.find_params(w, scheme.bits, scheme.sym, shrink=shrink)
            s = _store_scale(s)
            q = grid.fake_quantize(w, s.unsqueeze(1), z.unsqueeze(1), scheme.maxq)
            err = (q - w).abs_().pow_(cfg.mse_norm)
            err = (err if importance is None else err.mul_(importance)).sum(dim=1)
            better = err < best
            best = torch.where(better, err, best)
            scale = torch.where(better, s, scale)
            zero = torch.where(better, z, zero)
    return _store_scale(scale), zero


# Below this many input channels a Hessian's factorisation, the loss product and the
# per-block trailing update are small enough that extra intra-op threads only spin-wait on
# each other (and a thread count changes the rounding of a factorisation: the default
# models, all below it, keep their bit-identical checkpoints). From here on they are
# compute-bound (a 14336-channel Cholesky: ~95 s on one core, half on two), so they use
# every thread torch has.
LARGE_INPUT = 4096


@contextmanager
def _threads(device: torch.device, count: int | None) -> Iterator[None]:
    """Run the block with `count` intra-op threads on the CPU (None: leave as is)."""
    if device.type != "cpu" or count is None or count == torch.get_num_threads():
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _few_threads(device: torch.device, in_features: int) -> contextlib.AbstractContextManager[None]:
    """GPTQ's column loop is thousands of tiny ops; on a CPU shared with other work,
    intra-op threads spin-wait on each other and made the loop and small factorisations
    ~10-25x slower than one thread (measured on 2 busy cores). Large inputs keep their
    threads for the big products (see LARGE_INPUT)."""
    return _threads(device, None if in_features >= LARGE_INPUT else 1)


def act_order_perm(hessian: torch.Tensor) -> torch.Tensor:
    """Column visiting order for act-order: descending diag(H), ties by index (stable)."""
    return _descending(hessian.diagonal())


def _descending(diagonal: torch.Tensor) -> torch.Tensor:
    return torch.argsort(diagonal, descending=True, stable=True)


def gptq_quantize(
    weight: torch.Tensor, hessian: torch.Tensor, cfg: GPTQConfig, name: str = "layer",
    with_loss: bool = True, asymmetry: tuple[torch.Tensor, float] | None = None,
) -> QuantResult:
    """Quantize `weight` [out, in] against `hessian` [in, in] (from `accumulate_hessian`).

    Returns a QuantResult whose `loss` is `hessian_loss` of the final weights under the
    undamped Hessian (mean squared output error over the calibration tokens); with
    `with_loss=False` (the caller splits stacked rows and scores each part) it is None.
    `asymmetry` = (C, alpha) turns the loop into GPTAQ's (qcal.quant.gptaq): C [in, in] is
    2/n * sum (x - x~) x~^T of the float inputs x against the quantized model's x~ (which
    `hessian` is of); None (or C = 0) is plain GPTQ.
    """
    with _few_threads(weight.device, weight.shape[1]):
        return _gptq(weight, hessian, cfg, name, with_loss, asymmetry)


def _gptq(weight: torch.Tensor, hessian: torch.Tensor, cfg: GPTQConfig, name: str,
          with_loss: bool, asymmetry: tuple[torch.Tensor, float] | None = None) -> QuantResult:
    scheme = cfg.scheme
    out_f, in_f = weight.shape
    if tuple(hessian.shape) != (in_f, in_f):
        raise ConfigError(
            f"Hessian of {name} has shape {tuple(hessian.shape)}, expected {(in_f, in_f)}; "
            "it must come from the inputs of this very linear"
        )
    groups = scheme.groups_for(in_f, name)
    g = scheme.effective_group(in_f)
    w = weight.detach().to(torch.float32).clone()
    # H is the largest matrix here (in_f^2: 822 MB for a 14336-channel input): it is never
    # copied here; inverse_cholesky builds its permuted, dead-fixed form in its one working
    # matrix.
    h = hessian.detach().to(device=w.device, dtype=torch.float32)
    dead = dead_columns(h)
    w[:, dead] = 0.0
    # imatrix clipping's column weights: each input channel's mean square, diag H / 2 (the
    # factor is common to all columns, so diag H itself; a dead channel weighs nothing).
    imp = h.diagonal().clone() if cfg.imatrix_clip else None

    static: tuple[torch.Tensor, torch.Tensor] | None = None
    if cfg.static_groups and scheme.group_size != -1:
        pairs = [group_params(w[:, s:s + g], scheme, cfg, None if imp is None else imp[s:s + g])
                 for s in range(0, in_f, g)]
        static = (torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs]))

    order: torch.Tensor | None = None
    if cfg.desc_act:
        diag = h.diagonal().clone()
        diag[dead] = 1.0  # never seen: any value works, 1 keeps H invertible
        order = _descending(diag)  # act_order_perm of H with its dead channels fixed
        w = w[:, order]
        dead = dead[order]
        imp = None if imp is None else imp[order]
    perm = order if order is not None else torch.arange(in_f, device=w.device)
    upper, damp = inverse_cholesky(h, cfg.damp_percent, name, perm=order, dead=dead)
    if damp != cfg.damp_percent:
        warnings.warn(f"{name}: the Hessian needed damp_percent={damp:g} (asked "
                      f"{cfg.damp_percent:g}) to be positive definite", stacklevel=2)
    del h
    feedback = None
    if asymmetry is not None:
        feedback = asymmetry_feedback(asymmetry[0], upper, order, dead, asymmetry[1])

    codes, scales, zeros = _quantize_columns(w, upper, perm, static, scheme, cfg, g, imp,
                                             feedback)
    del upper, w, feedback
    codes = codes.contiguous()  # only now: the factor and w (in^2 + out x in floats) are gone

    if static is not None:
        scale_t, zero_t = static
        g_idx = grid.group_index(in_f, g).to(codes.device)
    else:
        scale_t, zero_t = torch.stack(scales), torch.stack(zeros)
        g_idx = torch.empty(in_f, dtype=torch.int32, device=codes.device)
        g_idx[perm] = torch.arange(in_f, dtype=torch.int32, device=codes.device) // g
    if cfg.desc_act:
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(in_f, device=perm.device)
        codes = codes[:, inv]
    assert scale_t.shape[0] == groups, (scale_t.shape, groups)
    result = QuantResult(codes.contiguous(), scale_t.contiguous(), zero_t.to(torch.int32),
                         g_idx, scheme)
    if with_loss:  # callers that split stacked rows compute it per part instead
        result.loss = hessian_loss(weight, result.dequantize(), hessian.float())
    return result


def _quantize_columns(
    w: torch.Tensor, upper: torch.Tensor, perm: torch.Tensor,
    static: tuple[torch.Tensor, torch.Tensor] | None, scheme: QuantScheme, cfg: GPTQConfig, g: int,
    importance: torch.Tensor | None = None, feedback: torch.Tensor | None = None,
) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """The GPTQ loop over the (permuted) columns of `w`, updated in place; returns the
    codes in visiting order (a transposed view) and the grids of the groups as they were
    formed. `importance` [in], in the same column order, weights imatrix clipping.
    `feedback` [in, in] (GPTAQ's P, strictly upper triangular in visiting order) adds each
    column's pre-rounding value times its row of P onto the later columns; as in the
    published GPTAQ loop, the lazy trailing update applies P to the block as it ends up
    (its rounded values)."""
    out_f, in_f = w.shape
    # The loop works on columns, so it keeps them as contiguous rows (codes and each block
    # transposed): a rank-1 update of a contiguous block runs ~9x faster than of the
    # row-major one, with the same elementwise arithmetic (bit-identical results).
    codes_t = torch.empty(in_f, out_f, dtype=torch.int32, device=w.device)
    scales: list[torch.Tensor] = []
    zeros: list[torch.Tensor] = []
    scale = zero = torch.empty(0)
    if scheme.group_size == -1:
        scale, zero = group_params(w, scheme, cfg, importance)
        scales, zeros = [scale], [zero]
    for i1 in range(0, in_f, cfg.block_size):
        i2 = min(i1 + cfg.block_size, in_f)
        w1_t = w[:, i1:i2].T.contiguous()
        err1_t = torch.zeros_like(w1_t)
        u1 = upper[i1:i2, i1:i2].contiguous()
        p1 = None if feedback is None else feedback[i1:i2, i1:i2].contiguous()
        with _threads(w.device, 1):
            for i in range(i2 - i1):
                col = i1 + i
                if static is not None:
                    gi = int(perm[col]) // g
                    scale, zero = static[0][gi], static[1][gi]
                elif scheme.group_size != -1 and col % g == 0:
                    # The group's grid comes from its *current* (already compensated) weights.
                    seg = w1_t[i:i + g].T
                    if i + g > i2 - i1:
                        seg = torch.cat([seg, w[:, i2:col + g]], dim=1)
                    scale, zero = group_params(seg.contiguous(), scheme, cfg, None if importance
                                               is None else importance[col:col + g])
                    scales.append(scale)
                    zeros.append(zero)
                col_w = w1_t[i]
                q = grid.quantize(col_w, scale, zero, scheme.maxq)
                codes_t[col] = q
                err = (col_w - grid.dequantize(q, scale, zero)) / u1[i, i]
                # Computed before the update below changes col_w (a view of row i).
                pull = None if p1 is None else p1[i, i:, None] * col_w
                w1_t[i:].sub_(u1[i, i:, None] * err)
                if pull is not None:
                    w1_t[i:].add_(pull)
                err1_t[i] = err
        w[:, i2:].sub_(err1_t.T.contiguous() @ upper[i1:i2, i2:])
        if feedback is not None:
            w[:, i2:].add_(w1_t.T @ feedback[i1:i2, i2:])
    return codes_t.T, scales, zeros
