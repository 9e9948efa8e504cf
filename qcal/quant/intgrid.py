"""The uniform integer grid shared by every quantizer.

Convention (the GPTQ one): w ~= scale * (q - zero) with q, zero integers in
[0, maxq]. Symmetric grids fix zero at (maxq + 1) / 2, so the grid is centred on
0 and one code more is spent on the negative side. The range always includes 0
(min <= 0 <= max) so that exact zeros stay exact, as GPTQ does.
"""

from __future__ import annotations

import torch

from qcal.config import QuantScheme


def find_params(
    w: torch.Tensor, bits: int, sym: bool, shrink: float | torch.Tensor = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row (scale, zero) of a min/max grid over the last dimension of `w` [rows, cols].

    `shrink` < 1 narrows the range (clip search); it may be a per-row tensor.
    Returns float32 scale [rows] and float32 integer-valued zero [rows].
    """
    maxq = 2**bits - 1
    w = w.float()
    xmin = torch.clamp(w.amin(dim=-1), max=0.0) * shrink
    xmax = torch.clamp(w.amax(dim=-1), min=0.0) * shrink
    if sym:
        xmax = torch.maximum(xmin.abs(), xmax)
        xmin = torch.where(xmin < 0, -xmax, xmin)
    # An all-zero row would give scale 0: use a unit range so the row stays exactly zero.
    empty = (xmin == 0) & (xmax == 0)
    xmin = torch.where(empty, torch.full_like(xmin, -1.0), xmin)
    xmax = torch.where(empty, torch.full_like(xmax, 1.0), xmax)
    scale = (xmax - xmin) / maxq
    if sym:
        zero = torch.full_like(scale, (maxq + 1) / 2)
    else:
        zero = torch.clamp(torch.round(-xmin / scale), 0, maxq)
    return scale, zero


def quantize(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, maxq: int) -> torch.Tensor:
    """Integer codes (int32) of `w` on the grid; scale/zero broadcast against `w`."""
    return torch.clamp(torch.round(w.float() / scale) + zero, 0, maxq).to(torch.int32)


def dequantize(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    return scale * (q.float() - zero)


def fake_quantize(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, maxq: int) -> torch.Tensor:
    return dequantize(quantize(w, scale, zero, maxq), scale, zero)


def group_index(in_features: int, group_size: int) -> torch.Tensor:
    """g_idx for contiguous groups: input channel k belongs to group k // group_size."""
    return torch.arange(in_features, dtype=torch.int32) // group_size


def grouped_params(
    w: torch.Tensor, scheme: QuantScheme, shrink: float | torch.Tensor = 1.0, name: str = "layer"
) -> tuple[torch.Tensor, torch.Tensor]:
    """(scales, zeros) of shape [groups, out_features] for a weight [out, in] (contiguous groups).

    A ragged last group is padded with zeros, which leaves min/max unchanged because
    the grid's range always contains 0. A per-group `shrink` must be [out, groups].
    """
    scale, zero = find_params(group_view(w, scheme, name), scheme.bits, scheme.sym, shrink)
    return scale.T.contiguous(), zero.T.contiguous()


def group_view(w: torch.Tensor, scheme: QuantScheme, name: str = "layer") -> torch.Tensor:
    """Float32 [out, groups, group] view of a weight [out, in] in contiguous groups; a ragged
    last group is padded with zeros, which every grid holds exactly (its range contains 0)."""
    out_f, in_f = w.shape
    groups = scheme.groups_for(in_f, name)
    g = scheme.effective_group(in_f)
    wf = w.float()
    if groups * g != in_f:
        wf = torch.nn.functional.pad(wf, (0, groups * g - in_f))
    return wf.reshape(out_f, groups, g)


def quantize_grouped(
    w: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, g_idx: torch.Tensor, maxq: int
) -> torch.Tensor:
    """Codes [out, in] for a weight [out, in] given [groups, out] params and g_idx [in]."""
    s = scales[g_idx.long()].T  # [out, in]
    z = zeros[g_idx.long()].T
    return quantize(w, s, z, maxq)


def dequantize_grouped(
    q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, g_idx: torch.Tensor
) -> torch.Tensor:
    """Float weight [out, in] from codes [out, in], [groups, out] params and g_idx [in]."""
    # In place on one [out, in] result, each gathered parameter freed before the next: for
    # an 8B down_proj every such matrix is 235 MB (the same values as s * (q - z)).
    index = g_idx.long()
    out = q.float()
    out.sub_(zeros.float()[index].T)
    return out.mul_(scales.float()[index].T)
