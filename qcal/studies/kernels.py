"""Measurements of the int4 kernels' study (scripts/bench_kernels.py): a random int4 layer,
the backend forced through QCAL_KERNEL, greedy decoding with the KV cache, and the bytes a
model holds in weights and in its backends' caches."""

from __future__ import annotations

import contextlib
import inspect
import os
import time
from collections.abc import Iterator

import torch

from qcal.config import QuantScheme
from qcal.packing.qlinear import QuantLinear
from qcal.quant.base import rtn_quantize


@contextlib.contextmanager
def kernel_env(value: str | None) -> Iterator[None]:
    old = os.environ.get("QCAL_KERNEL")
    if value is None:
        os.environ.pop("QCAL_KERNEL", None)
    else:
        os.environ["QCAL_KERNEL"] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("QCAL_KERNEL", None)
        else:
            os.environ["QCAL_KERNEL"] = old


def random_layer(k: int, n: int, group: int, seed: int = 0) -> QuantLinear:
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.02
    return QuantLinear.from_result(rtn_quantize(w, QuantScheme(4, group)), None).eval()


@torch.no_grad()
def greedy_decode(model: torch.nn.Module, ids: torch.Tensor, steps: int) -> tuple[torch.Tensor, float]:
    """(generated ids, seconds for the steps after the prefill) with the KV cache."""
    # transformers 5.24 renamed past_key_values to cache; older 5.x still take the old name.
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    out = model(input_ids=ids, use_cache=True)
    nxt = out.logits[:, -1:].argmax(-1)
    tokens = [nxt]
    start = time.perf_counter()
    for _ in range(steps):
        out = model(input_ids=nxt, use_cache=True, **{name: out.get(name)})
        nxt = out.logits[:, -1:].argmax(-1)
        tokens.append(nxt)
    return torch.cat(tokens, 1), time.perf_counter() - start


def weight_bytes(model: torch.nn.Module) -> int:
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total


def kernel_cache_bytes(model: torch.nn.Module) -> int:
    """Bytes held by the backends' repacked/dequantized weights (beyond the checkpoint buffers)."""
    total = 0
    for layer in model.modules():
        for _, value in getattr(layer, "_kernel_cache", {}).values():
            parts = [value] if isinstance(value, torch.Tensor) else getattr(value, "__dict__", {}).values()
            total += sum(t.numel() * t.element_size() for t in parts if isinstance(t, torch.Tensor))
    return total


def peak_bandwidth(device: torch.device) -> tuple[float | None, str]:
    """A CUDA device's theoretical DRAM bandwidth in bytes/s and where it came from."""
    props = torch.cuda.get_device_properties(device)
    clock_khz = getattr(props, "memory_clock_rate", None)
    bus_bits = getattr(props, "memory_bus_width", None)
    if clock_khz and bus_bits:
        return 2 * clock_khz * 1e3 * bus_bits / 8, "torch device properties (2 x memory clock x bus width)"
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
        mhz = pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM)
        bits = pynvml.nvmlDeviceGetMemoryBusWidth(handle)
        return 2 * mhz * 1e6 * bits / 8, "NVML (2 x max memory clock x bus width)"
    except Exception:  # noqa: BLE001 - any NVML failure just means no theoretical peak
        return None, "unknown (no clock/bus width available); fractions use the measured copy"


def copy_bandwidth(device: torch.device) -> float:
    """A device-to-device copy's bandwidth in bytes/s (1 GiB, median of triton's do_bench)."""
    import triton.testing

    src = torch.empty(2**28, dtype=torch.float32, device=device)  # 1 GiB
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=10, rep=100, return_mode="median")
    return 2 * src.numel() * 4 / (ms * 1e-3)
