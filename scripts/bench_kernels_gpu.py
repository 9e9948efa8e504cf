"""GPU part of scripts/bench_kernels.py: Triton int4 kernels vs torch.matmul fp16.

Times with `triton.testing.do_bench` (median; it zeroes a large buffer between calls, so
weights are read from HBM rather than L2, and the CPU launch overlaps that clear). Bytes
counted are the minimum each product must move: weights (+ scales and zero points) once,
x and y once. Peak bandwidth: the device's memory clock x bus width (torch properties or
NVML); a device-to-device copy measured here is reported beside it.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from typing import Any

import torch
from qcal_kernels.reference import dequantize_packed, int4_matmul_reference
from qcal_kernels.testing import random_packed_weight

from qcal.results import provenance
from qcal.studies.kernels import copy_bandwidth, peak_bandwidth

DEVICE = torch.device("cuda")
SIZES = (4096, 8192)
MS = (1, 16, 64, 256)
GROUP = 128


def make_weight(k: int, n: int, act_order: bool, seed: int = 0) -> tuple[torch.Tensor, ...]:
    weight = random_packed_weight(k, n, GROUP, act_order, seed, scale_range=(1e-4, 2.1e-3))
    return tuple(t.to(DEVICE) for t in weight)

def _bench(fn) -> float:  # noqa: ANN001
    import triton.testing

    fn()  # autotunes on first use: keep that out of do_bench's time estimate
    torch.cuda.synchronize(DEVICE)
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def _config(m: int) -> str:
    from qcal_kernels import int4_matmul as tk

    tuner = tk._decode_tuned if m <= tk.DECODE_MAX_M else tk._prefill_tuned
    best = getattr(tuner, "best_config", None)
    if best is None:
        return ""
    meta = {**best.kwargs, "num_warps": best.num_warps, "num_stages": best.num_stages}
    return " ".join(f"{k}={v}" for k, v in meta.items() if k != "GROUP_M")


def gpu_part(repeats: int) -> Iterator[dict[str, Any]]:
    """Yield the GPU section after every measured shape (so a timeout keeps what was done)."""
    import triton

    peak, peak_src = peak_bandwidth(DEVICE)
    copy = copy_bandwidth(DEVICE)
    ref_bw = peak or copy
    section: dict[str, Any] = {
        "provenance": provenance(
            triton=triton.__version__,
            data="random int4 codes/zeros/scales (group 128) and fp16 activations",
            timing="triton.testing.do_bench median (L2 cleared between calls), after autotuning",
        ),
        "device": torch.cuda.get_device_name(0), "peak_GBps": peak and peak / 1e9,
        "peak_source": peak_src, "copy_GBps": copy / 1e9, "rows": [], "errors": [],
    }
    torch.manual_seed(0)
    for kn in SIZES:
        yield from _measure_size(kn, section, ref_bw)
        torch.cuda.empty_cache()
    if not section["rows"]:
        raise RuntimeError(f"no GPU shape was measured: {section['errors']}")
    section["median_speedup"] = statistics.median(r["speedup"] for r in section["rows"])
    yield section


def _measure_size(kn: int, section: dict[str, Any], ref_bw: float) -> Iterator[dict[str, Any]]:
    from qcal_kernels.int4_matmul import int4_matmul

    plain, act = make_weight(kn, kn, False), make_weight(kn, kn, True)
    w16 = dequantize_packed(*plain, 4, torch.float16)  # [K, N]: the same weights in fp16
    for m in MS:
        try:
            x = torch.randn(m, kn, device=DEVICE, dtype=torch.float16)
            t16 = _bench(lambda: torch.matmul(x, w16))  # noqa: B023 - called before x changes
            t4 = _bench(lambda: int4_matmul(x, *plain, group_size=GROUP))  # noqa: B023
            cfg = _config(m)
            t4a = _bench(lambda: int4_matmul(x, *act, group_size=0))  # noqa: B023
            errs = []
            for weight, group in ((plain, GROUP), (act, 0)):
                ref = int4_matmul_reference(x.float(), *weight)
                y = int4_matmul(x, *weight, group_size=group).float()
                errs.append(float((y - ref).norm() / ref.norm()))
            io = 2 * m * kn * 2
            b4 = kn * kn // 2 + (kn // GROUP) * kn * (2 + 0.5) + io
            b16 = kn * kn * 2 + io
            row = {"M": m, "K": kn, "N": kn, "fp16_ms": t16, "int4_ms": t4, "int4_actorder_ms": t4a,
                   "speedup": t16 / t4, "int4_GBps": b4 / (t4 * 1e-3) / 1e9,
                   "int4_frac_peak": b4 / (t4 * 1e-3) / ref_bw,
                   "fp16_GBps": b16 / (t16 * 1e-3) / 1e9, "fp16_frac_peak": b16 / (t16 * 1e-3) / ref_bw,
                   "int4_TFLOPs": 2 * m * kn * kn / (t4 * 1e-3) / 1e12,
                   "max_rel_err": max(errs), "config": cfg}
            section["rows"].append(row)
            print(row, flush=True)
        except Exception as err:  # noqa: BLE001 - record and keep measuring the other shapes
            section["errors"].append(f"M={m} K=N={kn}: {type(err).__name__}: {err}")
            print(section["errors"][-1], flush=True)
        yield section
