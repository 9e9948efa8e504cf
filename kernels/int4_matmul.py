"""Triton kernels for y = x @ dequant(qweight, scales, qzeros, g_idx) in the packed GPTQ layout.

One kernel body, two launch paths:
- prefill (M > DECODE_MAX_M): a tiled GEMM, each program owns a BLOCK_M x BLOCK_N output tile
  and walks all of K; output written in x's dtype.
- decode (M <= DECODE_MAX_M): split-K, each program owns a BLOCK_N slice and 1/SPLIT_K of K,
  so the weight stream spreads over all multiprocessors; partial sums are atomically added
  to a float32 buffer (summation order, hence the last bits, may vary between runs).

Weights are dequantized in registers: codes are unpacked from int32 words (8 per word along
K), zero points from qzeros (8 per word along N), w = (q - z) * s in float32, then cast to
x's dtype for `tl.dot` with float32 accumulation. Groups are addressed in one of three ways,
chosen at compile time: contiguous groups with GROUP_SIZE a multiple of BLOCK_K (one scale row
per tile) or dividing it (one row per group in the tile, broadcast), both fine with a ragged
last group; otherwise a per-row gather (arbitrary `g_idx`, i.e. act-order).

Kernels run on CUDA tensors, or on CPU tensors under `TRITON_INTERPRET=1`, which must be set
before triton is first imported in the process (triton's own jit'd helpers are built then).
Interpreted launches use fixed tile configs and float32 dots (the interpreter's bf16 `tl.dot`
is wrong); see kernels/configs.py for `QCAL_AUTOTUNE`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from qcal_kernels.configs import (
    DECODE_CONFIGS,
    DECODE_MAX_M,
    FIXED_DECODE,
    FIXED_PREFILL,
    PREFILL_CONFIGS,
    KernelConfig,
    autotune_enabled,
    m_bucket,
)
from qcal_kernels.layout import KernelUnsupportedError, check_packed, contiguous_group_size

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


# M varies with every prompt; specializing on it (M == 1, M % 16 == 0) would only multiply compiles.
@triton.jit(do_not_specialize=["M", "M_BUCKET"])
def _int4_matmul_kernel(
    x_ptr, qw_ptr, sc_ptr, qz_ptr, gidx_ptr, out_ptr,
    M, N, K, M_BUCKET,
    stride_xm, stride_xk, stride_qk, stride_qn, stride_sg, stride_sn,
    stride_zg, stride_zn, stride_om, stride_on,
    GROUP_SIZE: tl.constexpr, DOT_FP32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    # Grouped tile order: programs running together share weight tiles in L2.
    per_group = GROUP_M * num_pid_n
    first_m = (pid // per_group) * GROUP_M
    size_m = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % size_m
    pid_n = (pid % per_group) // size_m

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < M
    n_mask = offs_n < N
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm
    z_shift = (offs_n % 8) * 4
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)

    word_rows = tl.arange(0, BLOCK_K // 8)
    code_shift = tl.arange(0, 8) * 4
    for k0 in range(pid_k * BLOCK_K, K, BLOCK_K * SPLIT_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < K
        x = tl.load(x_rows + offs_k[None, :] * stride_xk,
                    mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        # Each int32 word is loaded once and split into its 8 codes (rows k0 + 8*i + j).
        wk = k0 // 8 + word_rows
        words = tl.load(qw_ptr + wk[:, None] * stride_qk + offs_n[None, :] * stride_qn,
                        mask=(wk < K // 8)[:, None] & n_mask[None, :], other=0)
        q = tl.reshape((words[:, None, :] >> code_shift[None, :, None]) & 0xF, (BLOCK_K, BLOCK_N))
        if GROUP_SIZE > 0 and GROUP_SIZE % BLOCK_K == 0:
            # The whole tile lies in one group: one row of scales and zero points.
            g = k0 // GROUP_SIZE
            s = tl.load(sc_ptr + g * stride_sg + offs_n * stride_sn, mask=n_mask, other=0.0)
            zw = tl.load(qz_ptr + g * stride_zg + (offs_n // 8) * stride_zn, mask=n_mask, other=0)
            z = (zw >> z_shift) & 0xF
            w = (q - z[None, :]).to(tl.float32) * s.to(tl.float32)[None, :]
        elif GROUP_SIZE > 0 and BLOCK_K % GROUP_SIZE == 0 and GROUP_SIZE % 8 == 0:
            # Whole groups inside the tile: load their rows once, broadcast over each group.
            gr = k0 // GROUP_SIZE + tl.arange(0, BLOCK_K // GROUP_SIZE)
            g_mask = (gr * GROUP_SIZE < K)[:, None] & n_mask[None, :]
            s3 = tl.load(sc_ptr + gr[:, None] * stride_sg + offs_n[None, :] * stride_sn,
                         mask=g_mask, other=0.0)
            zw3 = tl.load(qz_ptr + gr[:, None] * stride_zg + (offs_n // 8)[None, :] * stride_zn,
                          mask=g_mask, other=0)
            z3 = (zw3 >> z_shift[None, :]) & 0xF
            q3 = tl.reshape(q, (BLOCK_K // GROUP_SIZE, GROUP_SIZE, BLOCK_N))
            w3 = (q3 - z3[:, None, :]).to(tl.float32) * s3.to(tl.float32)[:, None, :]
            w = tl.reshape(w3, (BLOCK_K, BLOCK_N))
        else:
            # Arbitrary g_idx (act-order) or group sizes off the tile grid: per-row gather.
            if GROUP_SIZE > 0:
                gk = offs_k // GROUP_SIZE
            else:
                gk = tl.load(gidx_ptr + offs_k, mask=k_mask, other=0)
            w_mask = k_mask[:, None] & n_mask[None, :]
            s2 = tl.load(sc_ptr + gk[:, None] * stride_sg + offs_n[None, :] * stride_sn,
                         mask=w_mask, other=0.0)
            zw2 = tl.load(qz_ptr + gk[:, None] * stride_zg + (offs_n // 8)[None, :] * stride_zn,
                          mask=w_mask, other=0)
            z2 = (zw2 >> z_shift[None, :]) & 0xF
            w = (q - z2).to(tl.float32) * s2.to(tl.float32)
        if DOT_FP32:
            acc = tl.dot(x.to(tl.float32), w, acc, input_precision="ieee")
        else:
            acc = tl.dot(x, w.to(x.dtype), acc)

    out = out_ptr + offs_m.to(tl.int64)[:, None] * stride_om + offs_n[None, :] * stride_on
    o_mask = m_mask[:, None] & n_mask[None, :]
    if SPLIT_K == 1:
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=o_mask)
    else:
        tl.atomic_add(out, acc, mask=o_mask)


def _triton_configs(configs: tuple[KernelConfig, ...]) -> list[triton.Config]:
    return [triton.Config(c.meta(), num_warps=c.num_warps, num_stages=c.num_stages) for c in configs]


def _prune_decode(configs, named_args, **kwargs):  # type: ignore[no-untyped-def]
    # Splits beyond K / BLOCK_K would only add empty programs and atomics.
    k = named_args["K"]
    kept = [c for c in configs if c.kwargs["BLOCK_K"] * c.kwargs["SPLIT_K"] <= max(k, 1)]
    return kept or list(configs[:1])


_TUNE_KEY = ["M_BUCKET", "N", "K", "GROUP_SIZE", "DOT_FP32"]
_prefill_tuned = triton.autotune(configs=_triton_configs(PREFILL_CONFIGS), key=_TUNE_KEY)(
    _int4_matmul_kernel
)
_decode_tuned = triton.autotune(
    configs=_triton_configs(DECODE_CONFIGS), key=_TUNE_KEY, reset_to_zero=["out_ptr"],
    prune_configs_by={"early_config_prune": _prune_decode},
)(_int4_matmul_kernel)


def is_interpreted() -> bool:
    """True when this module's kernels were built by the Triton interpreter (TRITON_INTERPRET=1)."""
    return type(_int4_matmul_kernel).__name__ == "InterpretedFunction"


def _check_inputs(x: torch.Tensor, qweight: torch.Tensor, bits: int) -> None:
    if bits != 4:
        raise KernelUnsupportedError(
            f"the Triton kernel takes 4-bit codes only, got bits={bits}; use the reference "
            "path (QCAL_KERNEL=reference)"
        )
    if x.dtype not in SUPPORTED_DTYPES:
        raise KernelUnsupportedError(
            f"the Triton kernel takes float16/bfloat16/float32 activations, got {x.dtype}"
        )
    if x.device != qweight.device:
        raise KernelUnsupportedError(f"x is on {x.device} but the weights are on {qweight.device}")
    if x.device.type != "cuda" and not is_interpreted():
        raise KernelUnsupportedError(
            f"Triton kernels need CUDA tensors, got {x.device}; on CPU use the cpu/reference "
            "backend, or set TRITON_INTERPRET=1 before triton is imported"
        )


def int4_matmul(
    x: torch.Tensor, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
    g_idx: torch.Tensor, bits: int = 4, *, group_size: int | None = None,
    config: KernelConfig | None = None,
) -> torch.Tensor:
    """y [..., N] = x [..., K] @ dequant(W) with the Triton kernels, in x's dtype.

    group_size: g when g_idx == arange(K) // g, 0 for arbitrary g_idx; None detects it
    (one host read of g_idx; QuantLinear caches it). config: a fixed tile config instead
    of autotuning (its split_k decides the decode path when > 1).
    """
    _check_inputs(x, qweight, bits)
    k, n, groups = check_packed(qweight, qzeros, scales, g_idx, bits)
    if x.shape[-1] != k:
        raise KernelUnsupportedError(f"x has {x.shape[-1]} features, the int4 weight expects {k}")
    if group_size is None:
        group_size = contiguous_group_size(g_idx, groups)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    if m == 0 or n == 0:
        return x.new_zeros(*lead, n)
    interpreted = is_interpreted()
    dot_fp32 = x.dtype == torch.float32 or (interpreted and x.dtype == torch.bfloat16)
    tuned = autotune_enabled() and not interpreted and config is None
    decode = config.split_k > 1 if config is not None else m <= DECODE_MAX_M
    if decode:
        out = torch.zeros(m, n, device=x.device, dtype=torch.float32)
    else:
        out = torch.empty(m, n, device=x.device, dtype=x.dtype)

    def grid(meta: dict[str, int]) -> tuple[int, int]:
        tiles = triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"])
        return (tiles, meta["SPLIT_K"])

    args = (x2, qweight, scales, qzeros, g_idx, out, m, n, k, m_bucket(m),
            x2.stride(0), x2.stride(1), qweight.stride(0), qweight.stride(1),
            scales.stride(0), scales.stride(1), qzeros.stride(0), qzeros.stride(1),
            out.stride(0), out.stride(1))
    if tuned:
        kernel = _decode_tuned if decode else _prefill_tuned
        kernel[grid](*args, GROUP_SIZE=group_size, DOT_FP32=dot_fp32)
    else:
        cfg = config or (FIXED_DECODE if decode else FIXED_PREFILL)
        _int4_matmul_kernel[grid](*args, GROUP_SIZE=group_size, DOT_FP32=dot_fp32, **cfg.meta(),
                                  num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return out.to(x.dtype).reshape(*lead, n)
