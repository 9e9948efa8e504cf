"""The packed QuantLinear on Gemma-3-270M's linear shapes: the reference path and the CPU
int4 op against F.linear on the dequantized weight.

Gemma's shapes differ from SmolLM2's where kernels are picky: q_proj and o_proj are wider
than hidden (4 heads x 256 = 1024 vs 640), k/v_proj are narrow (one KV head, 256), and 640
is no multiple of 256 (the CPU op serves group 128 with blocks of 128)."""

from __future__ import annotations

import pytest
import torch
from qcal_kernels.cpu import cpu_int4_available, cpu_int4_matmul, pack_for_cpu
from qcal_kernels.reference import int4_matmul_reference
from qcal_kernels.testing import random_packed_weight

from qcal.config import QuantScheme
from qcal.packing.qlinear import QuantLinear
from qcal.quant.base import rtn_quantize

pytestmark = pytest.mark.unit
needs_op = pytest.mark.skipif(not cpu_int4_available(), reason="this torch has no CPU int4 ops")

# (in_features, out_features) of each linear in a Gemma-3-270M decoder layer.
SHAPES = {"q_proj": (640, 1024), "k_v_proj": (640, 256), "o_proj": (1024, 640),
          "gate_up_proj": (640, 2048), "down_proj": (2048, 640)}
BF16_REL = 1e-2  # the CPU op computes in bf16 (see kernels/cpu.py)


def _layer(k: int, n: int, group: int, bias: bool = False) -> QuantLinear:
    # Gemma-like weight magnitudes; the layout, not the values, is under test.
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(k + n)) * 0.03
    res = rtn_quantize(w, QuantScheme(4, group))
    b = torch.randn(n) * 0.1 if bias else None
    return QuantLinear.from_result(res, b).eval()


def _exact(layer: QuantLinear, x: torch.Tensor) -> torch.Tensor:
    b = None if layer.bias is None else layer.bias.float()
    return torch.nn.functional.linear(x.float(), layer.dequantized_weight(), b)


def _rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.float() - ref).norm() / ref.norm())


@pytest.mark.parametrize("group", [128, 32, -1])
@pytest.mark.parametrize("name", SHAPES)
def test_reference_forward_is_the_dequantized_linear(monkeypatch: pytest.MonkeyPatch, name: str,
                                                    group: int) -> None:
    monkeypatch.setenv("QCAL_KERNEL", "reference")
    layer = _layer(*SHAPES[name], group, bias=name == "q_proj")
    x = torch.randn(2, 5, SHAPES[name][0])
    with torch.no_grad():
        assert layer.kernel_backend(x) == "reference"
        y = layer(x)
    assert y.shape == (2, 5, SHAPES[name][1])
    torch.testing.assert_close(y, _exact(layer, x), rtol=1e-5, atol=1e-5)


@needs_op
@pytest.mark.parametrize("group", [128, 32, -1])
@pytest.mark.parametrize("name", SHAPES)
def test_cpu_int4_path_matches_on_gemma_shapes(monkeypatch: pytest.MonkeyPatch, name: str,
                                              group: int) -> None:
    monkeypatch.delenv("QCAL_KERNEL", raising=False)
    layer = _layer(*SHAPES[name], group)
    x = torch.randn(3, SHAPES[name][0], dtype=torch.bfloat16)
    with torch.no_grad():
        assert layer.kernel_backend(x) == "cpu"  # bf16 activations take the int4 op
        y = layer(x)
        assert y.dtype == torch.bfloat16
        assert _rel(y, _exact(layer, x)) < BF16_REL
        monkeypatch.setenv("QCAL_KERNEL", "cpu")  # float32 activations, forced onto the op
        x32 = torch.randn(1, SHAPES[name][0])
        assert _rel(layer(x32), _exact(layer, x32)) < BF16_REL


@needs_op
@pytest.mark.parametrize("name", SHAPES)
def test_cpu_int4_path_with_act_order_on_gemma_shapes(name: str) -> None:
    """GPTQ --desc-act checkpoints permute g_idx; the repack must follow it."""
    k, n = SHAPES[name]
    qw, qz, s, gi = random_packed_weight(k, n, 128, act_order=True, seed=k + n)
    x = torch.randn(4, k, dtype=torch.bfloat16)
    ref = int4_matmul_reference(x.float(), qw, qz, s, gi)
    assert _rel(cpu_int4_matmul(x, pack_for_cpu(qw, qz, s, gi)), ref) < BF16_REL
