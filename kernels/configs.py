"""Tile configurations for the Triton int4 kernels, and the switch that turns autotuning off.

`QCAL_AUTOTUNE=0` launches one fixed configuration per path instead of autotuning.
Tests set it (the autotuner needs a GPU driver, and the Triton interpreter has none),
and it gives reproducible launches when profiling. Interpreted kernels always use the
fixed configurations.
"""

from __future__ import annotations

import dataclasses
import os

# Decode (split-K) serves M up to this; larger M takes the tiled GEMM.
DECODE_MAX_M = 8


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    """One launch configuration: tile sizes, K splits and the compiler's warp/stage counts."""

    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 2

    def meta(self) -> dict[str, int]:
        """The kernel's constexpr tile parameters."""
        return {"BLOCK_M": self.block_m, "BLOCK_N": self.block_n, "BLOCK_K": self.block_k,
                "SPLIT_K": self.split_k, "GROUP_M": self.group_m}


# Small tiles keep the interpreter fast; BLOCK_K=32 divides every supported group size,
# so contiguous groups take the one-scale-row-per-tile path.
FIXED_PREFILL = KernelConfig(block_m=32, block_n=64, block_k=32, num_warps=4, num_stages=2)
FIXED_DECODE = KernelConfig(block_m=16, block_n=64, block_k=32, split_k=2, num_warps=4, num_stages=2)

# Prefill: a small set spanning skinny (M ~ 16) to square (M >= 256) problems on
# Hopper/Ampere-class GPUs; the autotuner picks per (M bucket, N, K, group) key.
PREFILL_CONFIGS = (
    KernelConfig(16, 128, 128, num_warps=4, num_stages=4),
    KernelConfig(32, 128, 64, num_warps=4, num_stages=4),
    KernelConfig(64, 128, 64, num_warps=4, num_stages=3),
    KernelConfig(64, 256, 64, num_warps=8, num_stages=3),
    KernelConfig(128, 128, 64, num_warps=8, num_stages=3),
    KernelConfig(128, 256, 64, num_warps=8, num_stages=3),
)

# Decode: memory-bound, so the weight stream must be spread over every multiprocessor;
# split-K gives N/BLOCK_N * SPLIT_K programs.
DECODE_CONFIGS = (
    KernelConfig(16, 64, 128, split_k=4, num_warps=4, num_stages=3),
    KernelConfig(16, 64, 128, split_k=8, num_warps=4, num_stages=3),
    KernelConfig(16, 128, 128, split_k=4, num_warps=4, num_stages=3),
    KernelConfig(16, 128, 64, split_k=8, num_warps=4, num_stages=4),
    KernelConfig(16, 64, 256, split_k=4, num_warps=4, num_stages=3),
    KernelConfig(16, 256, 64, split_k=8, num_warps=8, num_stages=3),
)


def autotune_enabled() -> bool:
    """False when `QCAL_AUTOTUNE=0` (or `false`/`no`/`off`): launch the fixed configs."""
    return os.environ.get("QCAL_AUTOTUNE", "1").strip().lower() not in {"0", "false", "no", "off"}


def m_bucket(m: int) -> int:
    """The autotune key for M: next power of two, capped, so each prompt length does not retune."""
    bucket = 1
    while bucket < m and bucket < 1024:
        bucket *= 2
    return bucket
