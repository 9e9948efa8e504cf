"""CPU int4 path (torch's int4 op on a repack) and QuantLinear's backend dispatch vs the reference."""

from __future__ import annotations

import pytest
import torch
from qcal_kernels.cpu import cpu_int4_available, cpu_int4_matmul, pack_for_cpu, unsupported_reason
from qcal_kernels.errors import KernelError
from qcal_kernels.layout import KernelUnsupportedError, contiguous_group_size
from qcal_kernels.reference import int4_matmul_reference
from qcal_kernels.testing import random_packed_weight

from qcal.config import QuantScheme
from qcal.packing.qlinear import QuantLinear
from qcal.quant.base import rtn_quantize

pytestmark = pytest.mark.unit
needs_op = pytest.mark.skipif(not cpu_int4_available(), reason="this torch has no CPU int4 ops")

# bf16 activations, scales and outputs: ~3 significant digits (see kernels/cpu.py).
BF16_REL = 1e-2


def packed_weight(k: int, n: int, group: int, act_order: bool = False, seed: int = 0):
    """Random codes/zeros/scales in the GPTQ layout; group -1 = per channel."""
    return random_packed_weight(k, n, group, act_order, seed)

def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.float() - ref.float()).norm() / ref.float().norm())


LAYOUTS = [  # (K, N, group, act_order)
    (128, 128, 32, False),
    (256, 256, 128, False),
    (256, 128, 128, True),
    (128, 256, 32, True),
    (576, 128, 128, False),  # ragged: SmolLM2's hidden size with group 128
    (576, 64, -1, False),  # per channel
    (96, 64, 64, False),  # ragged, served by blocks of 32
]


@needs_op
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda t: "k{}n{}g{}{}".format(*t[:3], "-act" * t[3]))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m", [1, 4, 16])
def test_cpu_path_matches_reference(layout, dtype: torch.dtype, m: int) -> None:
    k, n, group, act = layout
    qw, qz, s, gi = packed_weight(k, n, group, act)
    x = torch.randn(m, k, dtype=dtype)
    y = cpu_int4_matmul(x, pack_for_cpu(qw, qz, s, gi))
    ref = int4_matmul_reference(x.float(), qw, qz, s, gi)
    assert y.dtype == dtype and y.shape == (m, n)
    assert rel_err(y, ref) < BF16_REL


@needs_op
def test_cpu_repack_block_sizes_and_permutation() -> None:
    assert pack_for_cpu(*packed_weight(576, 64, 128)).block == 64  # ragged 128 -> blocks of 64
    assert pack_for_cpu(*packed_weight(1536, 64, 128)).block == 128
    assert pack_for_cpu(*packed_weight(1024, 64, 512)).block == 256  # 512 is not an op size
    assert pack_for_cpu(*packed_weight(256, 64, 128)).perm is None
    assert pack_for_cpu(*packed_weight(256, 64, 128, act_order=True)).perm is not None


@needs_op
def test_cpu_keeps_leading_dims_and_empty_batches() -> None:
    qw, qz, s, gi = packed_weight(128, 64, 32)
    w = pack_for_cpu(qw, qz, s, gi)
    x = torch.randn(2, 3, 128)
    y = cpu_int4_matmul(x, w)
    assert y.shape == (2, 3, 64)
    assert rel_err(y, int4_matmul_reference(x, qw, qz, s, gi)) < BF16_REL
    assert cpu_int4_matmul(torch.randn(0, 128), w).shape == (0, 64)
    with pytest.raises(KernelUnsupportedError, match="expects 128"):
        cpu_int4_matmul(torch.randn(1, 64), w)


@needs_op
@pytest.mark.parametrize(
    "args, needle",
    [
        ((256, 24, 32), "% 16"),  # out_features the op cannot tile
        ((96, 64, 48), "multiple of 32"),  # group boundaries off every op block size
    ],
)
def test_cpu_unsupported_layouts_say_why(args, needle: str) -> None:
    qw, qz, s, gi = packed_weight(*args)
    assert needle in (unsupported_reason(qw, qz, s, gi, 4) or "")
    with pytest.raises(KernelUnsupportedError, match="QCAL_KERNEL"):
        pack_for_cpu(qw, qz, s, gi)


def test_contiguous_group_size_detection() -> None:
    assert contiguous_group_size(torch.arange(576) // 128, 5) == 128
    assert contiguous_group_size(torch.zeros(64, dtype=torch.int32), 1) == 64
    assert contiguous_group_size(torch.arange(256)[torch.randperm(256)] // 32, 8) == 0


# --- QuantLinear dispatch ------------------------------------------------------------


def quant_linear(k: int, n: int, group: int, bias: bool = False, bits: int = 4) -> QuantLinear:
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(1))
    res = rtn_quantize(w, QuantScheme(bits, group, allow_ragged=True))
    b = torch.randn(n) if bias else None
    return QuantLinear.from_result(res, b).eval()


def exact(layer: QuantLinear, x: torch.Tensor) -> torch.Tensor:
    b = None if layer.bias is None else layer.bias.float()
    return torch.nn.functional.linear(x.float(), layer.dequantized_weight(), b)


@needs_op
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_inputs_use_cpu_op_by_default(monkeypatch: pytest.MonkeyPatch, bias: bool,
                                          dtype: torch.dtype) -> None:
    monkeypatch.delenv("QCAL_KERNEL", raising=False)
    layer = quant_linear(576, 192, 128, bias)
    x = torch.randn(3, 576, dtype=dtype)
    with torch.no_grad():
        assert layer.kernel_backend(x) == "cpu"
        y = layer(x)
    assert y.dtype == dtype
    assert rel_err(y, exact(layer, x)) < BF16_REL
    assert "cpu_int4" in layer._kernel_cache


@needs_op
def test_float32_inputs_stay_exact_unless_cpu_is_forced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QCAL_KERNEL", raising=False)
    layer = quant_linear(256, 128, 64, bias=True)
    x = torch.randn(5, 256)
    with torch.no_grad():
        assert layer.kernel_backend(x) == "reference"
        torch.testing.assert_close(layer(x), exact(layer, x), rtol=1e-5, atol=1e-5)
        monkeypatch.setenv("QCAL_KERNEL", "cpu")
        assert layer.kernel_backend(x) == "cpu"
        y = layer(x)
    assert y.dtype == torch.float32
    assert 0 < rel_err(y, exact(layer, x)) < BF16_REL


def test_forced_reference_is_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QCAL_KERNEL", "reference")
    layer = quant_linear(256, 128, 64, bias=True)
    x = torch.randn(5, 256)
    with torch.no_grad():
        assert layer.kernel_backend(x) == "reference"
        torch.testing.assert_close(layer(x), exact(layer, x), rtol=1e-5, atol=1e-5)


@needs_op
def test_unservable_layer_falls_back_or_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    layer = quant_linear(256, 24, 32)  # N=24: not a multiple of 16
    x = torch.randn(2, 256, dtype=torch.bfloat16)
    monkeypatch.delenv("QCAL_KERNEL", raising=False)
    with torch.no_grad():
        assert layer.kernel_backend(x) == "reference"
        assert rel_err(layer(x), exact(layer, x)) < BF16_REL  # bf16 F.linear
        monkeypatch.setenv("QCAL_KERNEL", "cpu")
        with pytest.raises(KernelUnsupportedError, match="% 16"):
            layer(x)


def test_eight_bit_layers_use_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QCAL_KERNEL", raising=False)
    layer = quant_linear(128, 64, 32, bits=8)
    x = torch.randn(2, 128)
    with torch.no_grad():
        assert layer.kernel_backend(x) == "reference"
        torch.testing.assert_close(layer(x), exact(layer, x), rtol=1e-5, atol=1e-5)


def test_bad_backend_name_is_a_kernel_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QCAL_KERNEL", "cuda-magic")
    with pytest.raises(KernelError, match="reference"):
        quant_linear(128, 64, 32)(torch.randn(1, 128))


def test_forced_triton_on_cpu_without_interpreter_is_clear(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("triton")
    import qcal_kernels.int4_matmul as tk

    if tk.is_interpreted():
        pytest.skip("this process runs Triton interpreted; covered by test_kernels_triton.py")
    monkeypatch.setenv("QCAL_KERNEL", "triton")
    with torch.no_grad(), pytest.raises(KernelError, match="CUDA"):
        quant_linear(128, 64, 32)(torch.randn(1, 128))


@needs_op
def test_gradients_flow_through_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QCAL_KERNEL", raising=False)
    layer = quant_linear(128, 64, 32)
    x = torch.randn(2, 128, dtype=torch.bfloat16).float().requires_grad_()
    assert layer.kernel_backend(x) == "reference"
    layer(x).sum().backward()
    torch.testing.assert_close(x.grad, layer.dequantized_weight().sum(0).expand(2, -1))
    monkeypatch.setenv("QCAL_KERNEL", "cpu")
    with pytest.raises(KernelUnsupportedError, match="no_grad"):
        layer(x)


@needs_op
def test_in_place_weight_updates_rebuild_the_repack(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QCAL_KERNEL", raising=False)
    layer = quant_linear(128, 64, 32)
    x = torch.randn(2, 128, dtype=torch.bfloat16)
    with torch.no_grad():
        before = layer(x)
        layer.scales.mul_(2)  # what load_state_dict's copy_ does to a cached layer
        after = layer(x)
    assert rel_err(after, 2 * before) < BF16_REL
    layer.to(torch.device("cpu"))
    assert not layer._kernel_cache


def test_reference_unpacks_on_the_weights_device() -> None:
    from qcal_kernels.format import unpack_rows
    from qcal_kernels.reference import _unpack_rows

    qw, qz, _, _ = packed_weight(64, 32, 32)
    assert torch.equal(_unpack_rows(qw, 4), unpack_rows(qw, 4))
    assert torch.equal(_unpack_rows(qz.T, 4).T, unpack_rows(qz.T.contiguous(), 4).T)
    meta = _unpack_rows(torch.empty(8, 16, dtype=torch.int32, device="meta"), 4)
    assert meta.device.type == "meta" and meta.shape == (64, 16)  # no CPU-side shift table
