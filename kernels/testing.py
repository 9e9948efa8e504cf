"""Random int4 weights in the GPTQ layout, for kernel tests and benchmarks."""

from __future__ import annotations

import torch
from qcal_kernels.format import pack_cols, pack_rows


def random_packed_weight(
    k: int, n: int, group: int, act_order: bool = False, seed: int = 0,
    scale_range: tuple[float, float] = (0.002, 0.022),
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(qweight, qzeros, scales, g_idx) with random codes, zeros and fp16 scales.

    group -1 means one group per output channel; a group that does not divide k leaves a
    ragged last group (ceil(k / group) scale rows). act_order shuffles g_idx, as a
    desc_act checkpoint does. Scales are uniform in `scale_range`.
    """
    gen = torch.Generator().manual_seed(seed)
    g = k if group == -1 else group
    groups = -(-k // g)
    codes = torch.randint(0, 16, (k, n), generator=gen, dtype=torch.int32)
    zeros = torch.randint(0, 16, (groups, n), generator=gen, dtype=torch.int32)
    low, high = scale_range
    scales = (torch.rand(groups, n, generator=gen) * (high - low) + low).half()
    g_idx = torch.arange(k, dtype=torch.int32) // g
    if act_order:
        g_idx = g_idx[torch.randperm(k, generator=gen)]
    return pack_rows(codes, 4), pack_cols(zeros, 4), scales, g_idx
