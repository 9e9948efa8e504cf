"""Triton int4 kernels on a real GPU vs the torch reference (skipped without CUDA).

The broad sweep uses the fixed configs (QCAL_AUTOTUNE=0: few compiles); the autotuned
paths are checked on the shapes scripts/bench_kernels.py measures, so the benchmark reuses
their compiled kernels.
"""

from __future__ import annotations

import pytest
import torch
from qcal_kernels.configs import KernelConfig
from qcal_kernels.reference import int4_matmul_reference
from qcal_kernels.testing import random_packed_weight

from qcal.config import QuantScheme
from qcal.packing.qlinear import QuantLinear
from qcal.quant.base import rtn_quantize

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

REL_TOL = {torch.float16: 3e-3, torch.bfloat16: 1.5e-2, torch.float32: 1e-4}


def packed_weight(k: int, n: int, group: int, act_order: bool = False, seed: int = 0):
    return tuple(t.cuda() for t in random_packed_weight(k, n, group, act_order, seed))

def rel_err(y: torch.Tensor, x: torch.Tensor, weight) -> float:
    ref = int4_matmul_reference(x.float(), *weight)
    return float((y.float() - ref).norm() / ref.norm())


SWEEP = [(m, k, n, g, act, dt) for m in (1, 5, 16, 128, 300)
         for (k, n) in ((1024, 768), (576, 1536)) for g in (32, 128) for act in (False, True)
         for dt in (torch.float16, torch.bfloat16)]


@pytest.mark.parametrize("m, k, n, group, act, dtype", SWEEP)
def test_fixed_config_sweep(monkeypatch: pytest.MonkeyPatch, m, k, n, group, act, dtype) -> None:
    from qcal_kernels.int4_matmul import int4_matmul

    monkeypatch.setenv("QCAL_AUTOTUNE", "0")
    weight = packed_weight(k, n, group, act)
    x = torch.randn(m, k, device="cuda", dtype=dtype)
    y = int4_matmul(x, *weight)
    assert y.dtype == dtype and y.shape == (m, n)
    assert rel_err(y, x, weight) < REL_TOL[dtype]


BRANCHES = [  # (M, K, N, group, config): each reaches another compile-time branch or edge
    (16, 1024, 512, 32, KernelConfig(64, 128, 128, num_stages=3)),  # groups inside a tile
    (3, 576, 512, 128, KernelConfig(16, 64, 256, split_k=2)),  # ragged, groups inside a tile
    (16, 576, 512, 128, KernelConfig(32, 64, 64)),  # ragged, one group per tile
    (40, 960, 256, 48, KernelConfig(32, 64, 64)),  # group 48: per-row gather
    (7, 1024, 520, 64, KernelConfig(16, 128, 64, split_k=5)),  # N tail, uneven split
]


@pytest.mark.parametrize("m, k, n, group, config", BRANCHES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_branches(m, k, n, group, config, dtype) -> None:
    from qcal_kernels.int4_matmul import int4_matmul

    weight = packed_weight(k, n, group)
    x = torch.randn(m, k, device="cuda", dtype=dtype)
    assert rel_err(int4_matmul(x, *weight, config=config), x, weight) < REL_TOL[dtype]


@pytest.mark.parametrize("m", [1, 64])
@pytest.mark.parametrize("act", [False, True])
def test_autotuned_paths(monkeypatch: pytest.MonkeyPatch, m: int, act: bool) -> None:
    from qcal_kernels.int4_matmul import int4_matmul

    monkeypatch.setenv("QCAL_AUTOTUNE", "1")
    weight = packed_weight(4096, 4096, 128, act)
    x = torch.randn(m, 4096, device="cuda", dtype=torch.float16)
    group = 0 if act else 128
    first = int4_matmul(x, *weight, group_size=group)  # autotunes (atomics must be reset)
    second = int4_matmul(x, *weight, group_size=group)
    assert rel_err(first, x, weight) < REL_TOL[torch.float16]
    assert rel_err(second, x, weight) < REL_TOL[torch.float16]


@pytest.mark.parametrize("m", [1, 33])
def test_float32_activations_and_strided_input(monkeypatch: pytest.MonkeyPatch, m: int) -> None:
    from qcal_kernels.int4_matmul import int4_matmul

    monkeypatch.setenv("QCAL_AUTOTUNE", "0")
    weight = packed_weight(512, 256, 64)
    x = torch.randn(512, m, device="cuda").T  # non-contiguous rows
    assert rel_err(int4_matmul(x, *weight), x, weight) < REL_TOL[torch.float32]


def test_quant_linear_dispatches_to_triton_on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QCAL_KERNEL", raising=False)
    monkeypatch.setenv("QCAL_AUTOTUNE", "0")
    w = torch.randn(384, 576, generator=torch.Generator().manual_seed(3))
    layer = QuantLinear.from_result(rtn_quantize(w, QuantScheme(4, 128)), torch.randn(384)).eval()
    x_cpu = torch.randn(3, 576, dtype=torch.bfloat16)
    with torch.no_grad():
        layer(x_cpu)  # fills the CPU repack cache, which the move must drop
        layer.cuda()
        assert not layer._kernel_cache
        x = x_cpu.half().cuda()
        assert layer.kernel_backend(x) == "triton"
        y = layer(x)
        ref = torch.nn.functional.linear(x.float(), layer.dequantized_weight().cuda(), layer.bias.float())
    assert y.device.type == "cuda" and y.dtype == torch.float16
    assert float((y.float() - ref).norm() / ref.norm()) < REL_TOL[torch.float16]
    monkeypatch.setenv("QCAL_KERNEL", "reference")
    with torch.no_grad():
        torch.testing.assert_close(layer(x).float(), ref, rtol=1e-2, atol=1e-2)
