"""Chooses the int4 matmul implementation for a QuantLinear by device, layout and environment.

Backends:
- ``triton``: the Triton kernels of kernels/int4_matmul.py; chosen for CUDA inputs with
  4-bit codes and float16/bfloat16/float32 activations.
- ``cpu``: torch's CPU int4 op on a one-time repack (kernels/cpu.py); chosen for CPU inputs
  in bfloat16/float16 with 4-bit codes whose group layout it can serve. It computes in bf16
  (see kernels/cpu.py for the accuracy implication), so float32 inputs stay on the exact
  reference unless ``QCAL_KERNEL=cpu`` asks for the op: a float32 model (what `qcal eval`
  loads) keeps float32 accuracy, and a checkpoint loaded in bfloat16 runs on the int4 op.
- ``reference``: dequantize once (cached per dtype and device, unless the layer says
  ``cache_dequantized = False``), then `F.linear`: exact float math, the CPU path for
  many tokens (more than ``CPU_INT4_MAX_TOKENS`` rows, where a float32 GEMM on the cached
  dequantized weight beats the int4 op), and the fallback for everything else: other devices, 2/8-bit codes,
  layouts the fast paths cannot serve, and inputs that need gradients.

``QCAL_KERNEL=reference|cpu|triton`` forces one backend. A forced backend that cannot serve
a layer raises `KernelUnsupportedError` (naming why) instead of falling back; the automatic
choice falls back to ``reference`` silently (logged at debug level).

Repacked weights live in ``layer._kernel_cache``, keyed by backend and tagged with the
buffers' version counters, so in-place weight updates (``load_state_dict``) rebuild them;
``QuantLinear._apply`` (``.to()``, ``.half()``) clears the cache.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any, Protocol

import torch
from qcal_kernels.errors import KernelError
from qcal_kernels.layout import KernelUnsupportedError, check_packed, contiguous_group_size
from qcal_kernels.reference import dequantize_grouped_weight, dequantize_packed


class QuantLinear(Protocol):
    """What dispatch needs of a packed linear (qcal's QuantLinear is one): the GPTQ-layout
    buffers, its widths, and a dict the kernels may cache prepared weights in."""

    qweight: torch.Tensor
    qzeros: torch.Tensor
    scales: torch.Tensor
    g_idx: torch.Tensor
    bits: int
    in_features: int
    out_features: int
    _kernel_cache: dict[str, Any]

BACKENDS = ("reference", "cpu", "triton")
# Activation dtypes for which the automatic choice on CPU is the (bf16-computing) int4 op.
CPU_AUTO_DTYPES = (torch.bfloat16, torch.float16)
# Above this many tokens (rows of x) the int4 op loses to a float32 GEMM on a cached
# dequantized weight: the op's cost grows with M like a GEMM without the BLAS blocking
# (results/kernels.md, "CPU per shape", 4096 x 4096: a tie at M = 64, the GEMM 1.35x
# faster at M = 512). Without the cache (a model too big for float copies) dequantizing on
# every call costs ~as much as the op saves at M = 512 and far more below: the op stays.
CPU_INT4_MAX_TOKENS = 64
# Dequantize-then-GEMM on the CPU runs in float32 (x upcast, output cast back): every CPU
# has a fast float32 GEMM, while bf16/fp16 GEMMs are emulated (10x slower than float32)
# on CPUs without native bf16 (e.g. AVX2-only), and float32 is the more exact of the two.
CPU_GEMM_DTYPE = torch.float32
# Weights per block when a layer without a cached float weight is unpacked for a matmul
# (16 MB of float32): small next to the layer, big enough for an efficient GEMM.
UNPACK_BLOCK_WEIGHTS = 1 << 22
ENV_VAR = "QCAL_KERNEL"
_log = logging.getLogger(__name__)


def forced_backend() -> str | None:
    """The backend named by QCAL_KERNEL, or None for the automatic choice."""
    value = os.environ.get(ENV_VAR, "").strip().lower()
    if value in ("", "auto"):
        return None
    if value not in BACKENDS:
        raise KernelError(f"{ENV_VAR}={value!r} is not a kernel backend; use one of {BACKENDS} or unset it")
    return value


def _weights_version(layer: QuantLinear) -> tuple[int, ...] | None:
    try:
        return tuple(t._version for t in (layer.qweight, layer.qzeros, layer.scales, layer.g_idx))
    except RuntimeError:  # inference-mode tensors keep no version counter
        return None


def _cached(layer: QuantLinear, key: str, build: Callable[[], Any]) -> Any:
    version = _weights_version(layer)
    hit = layer._kernel_cache.get(key)
    if hit is not None and hit[0] == version:
        return hit[1]
    value = build()
    layer._kernel_cache[key] = (version, value)
    return value


def _cpu_plan(layer: QuantLinear) -> Any:
    """The layer's CpuInt4Weight, or a string saying why the CPU op cannot serve it."""
    from qcal_kernels.cpu import pack_for_cpu, unsupported_reason

    def build() -> Any:
        reason = unsupported_reason(layer.qweight, layer.qzeros, layer.scales, layer.g_idx, layer.bits)
        if reason is not None:
            return reason
        return pack_for_cpu(layer.qweight, layer.qzeros, layer.scales, layer.g_idx, layer.bits)

    return _cached(layer, "cpu_int4", build)


def _triton_reason(layer: QuantLinear, x: torch.Tensor) -> str | None:
    if layer.bits != 4:
        return f"the Triton kernel takes 4-bit codes only, this layer has {layer.bits}-bit codes"
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return f"the Triton kernel takes float16/bfloat16/float32 activations, got {x.dtype}"
    try:
        import qcal_kernels.int4_matmul  # noqa: F401
    except ImportError as err:
        return f"triton is not importable ({err})"
    return None


def select_backend(layer: QuantLinear, x: torch.Tensor) -> str:
    """The backend that will serve `layer(x)`; raises KernelUnsupportedError if a forced one cannot."""
    forced = forced_backend()
    needs_grad = torch.is_grad_enabled() and (x.requires_grad or layer.scales.requires_grad)
    if forced == "reference":
        return "reference"
    if needs_grad:
        if forced is not None:
            raise KernelUnsupportedError(
                f"{ENV_VAR}={forced} cannot serve inputs that need gradients (the int4 kernels have "
                "no backward); run under torch.no_grad() or set QCAL_KERNEL=reference"
            )
        return "reference"
    tokens = x.numel() // max(1, x.shape[-1])
    if (forced is None and x.device.type == "cpu" and tokens > CPU_INT4_MAX_TOKENS
            and getattr(layer, "cache_dequantized", True)):
        return "reference"  # many tokens: float32 GEMM on the cached dequantized weight
    if forced == "cpu" or (forced is None and x.device.type == "cpu" and x.dtype in CPU_AUTO_DTYPES):
        plan = _cpu_plan(layer)
        if not isinstance(plan, str):
            if x.device.type != "cpu":
                raise KernelUnsupportedError(f"{ENV_VAR}=cpu needs CPU inputs, got {x.device}")
            return "cpu"
        if forced == "cpu":
            raise KernelUnsupportedError(f"{ENV_VAR}=cpu cannot serve {layer!r}: {plan}; unset {ENV_VAR}")
        _log.debug("CPU int4 op cannot serve %r (%s): using the reference path", layer, plan)
        return "reference"
    if forced == "triton" or x.device.type == "cuda":
        reason = _triton_reason(layer, x)
        if reason is None:
            return "triton"
        if forced == "triton":
            raise KernelUnsupportedError(
                f"{ENV_VAR}=triton cannot serve {layer!r}: {reason}; unset {ENV_VAR}"
            )
        _log.debug("Triton cannot serve %r (%s): using the reference path", layer, reason)
    return "reference"


def prime_reference(layer: QuantLinear, weight: torch.Tensor) -> None:
    """Give the reference path the float weight [out, in] it would otherwise dequantize from
    the packed buffers, for inputs of weight's dtype and device. A quantizer that has just
    made the layer holds exactly these values (scale times code minus zero, with the
    layer's own scale dtype) and saves the unpacking; the entry is dropped like any other
    when the buffers change."""
    if tuple(weight.shape) != (layer.out_features, layer.in_features):
        raise KernelError(f"primed weight has shape {tuple(weight.shape)}, the layer is "
                          f"[{layer.out_features}, {layer.in_features}]")
    key = f"ref:{weight.dtype}:{weight.device}"
    layer._kernel_cache[key] = (_weights_version(layer), weight.detach().contiguous())


def _dequantized(layer: QuantLinear, dtype: torch.dtype, start: int = 0,
                 stop: int | None = None) -> torch.Tensor:
    """The float weight [stop - start, in] of output rows start..stop (all by default),
    unpacked from the layer's buffers (its packed columns start..stop)."""
    stop = layer.out_features if stop is None else stop
    bits = layer.bits
    qweight, scales = layer.qweight[:, start:stop], layer.scales[:, start:stop]
    qzeros = layer.qzeros[:, start * bits // 32: stop * bits // 32]  # packed along outputs
    group = _cached(layer, "group_size", lambda: contiguous_group_size(
        layer.g_idx, layer.scales.shape[0]))
    if group and layer.in_features % group == 0:
        return dequantize_grouped_weight(qweight, qzeros, scales, group, bits, dtype)
    return dequantize_packed(qweight, qzeros, scales, layer.g_idx, bits, dtype).T.contiguous()


def _linear_in_blocks(layer: QuantLinear, x: torch.Tensor,
                      bias: torch.Tensor | None) -> torch.Tensor:
    """x @ W^T + bias with W unpacked a block of output rows at a time: a layer that keeps
    no float copy of its weight never holds one whole either (an 8B model's down_proj
    would be 235 MB of float32 at once). Blocks start at multiples of 32 rows, where
    every packed width's zero-point words begin."""
    rows = max(32, UNPACK_BLOCK_WEIGHTS // layer.in_features // 32 * 32)
    blocks = [torch.nn.functional.linear(
        x, _dequantized(layer, x.dtype, start, min(start + rows, layer.out_features)),
        None if bias is None else bias[start:start + rows])
        for start in range(0, layer.out_features, rows)]
    return blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=-1)


def _reference(layer: QuantLinear, x: torch.Tensor) -> torch.Tensor:
    out_dtype = x.dtype
    if x.device.type == "cpu" and x.dtype in CPU_AUTO_DTYPES:
        x = x.to(CPU_GEMM_DTYPE)
    bias = None if layer.bias is None else layer.bias.to(x.dtype)
    # A model bigger than memory sets cache_dequantized=False (qcal's load_checkpoint): the
    # float weights of every layer together would be the float model again.
    key = f"ref:{x.dtype}:{x.device}"
    hit = layer._kernel_cache.get(key)
    if not getattr(layer, "cache_dequantized", True) and (hit is None
                                                          or hit[0] != _weights_version(layer)):
        return _linear_in_blocks(layer, x, bias).to(out_dtype)
    w = _cached(layer, key, lambda: _dequantized(layer, x.dtype))
    return torch.nn.functional.linear(x, w, bias).to(out_dtype)


def _triton(layer: QuantLinear, x: torch.Tensor) -> torch.Tensor:
    from qcal_kernels.int4_matmul import int4_matmul

    def build() -> int:
        _, _, groups = check_packed(layer.qweight, layer.qzeros, layer.scales, layer.g_idx, layer.bits)
        return contiguous_group_size(layer.g_idx, groups)

    group = _cached(layer, "triton_group", build)
    y = int4_matmul(x, layer.qweight, layer.qzeros, layer.scales, layer.g_idx, layer.bits, group_size=group)
    return y if layer.bias is None else y + layer.bias.to(y.dtype)


def _cpu(layer: QuantLinear, x: torch.Tensor) -> torch.Tensor:
    from qcal_kernels.cpu import cpu_int4_matmul

    y = cpu_int4_matmul(x, _cpu_plan(layer))
    return y if layer.bias is None else y + layer.bias.to(y.dtype)


_FORWARDS = {"reference": _reference, "cpu": _cpu, "triton": _triton}


def quant_linear_forward(layer: QuantLinear, x: torch.Tensor) -> torch.Tensor:
    """y = x @ dequant(W)^T + bias through the backend `select_backend` picks."""
    return _FORWARDS[select_backend(layer, x)](layer, x)
