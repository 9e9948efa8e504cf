"""Packing of the GPTQ layout and QuantLinear against the fake-quant weight."""

from __future__ import annotations

import pytest
import torch
from qcal_kernels.errors import KernelError
from qcal_kernels.format import pack_cols, pack_rows, unpack_cols, unpack_rows
from qcal_kernels.reference import dequantize_packed

from qcal.config import QuantScheme
from qcal.packing.qlinear import QuantLinear
from qcal.quant.base import rtn_quantize

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_pack_unpack_rows_identity(bits: int) -> None:
    torch.manual_seed(bits)
    codes = torch.randint(0, 2**bits, (64, 24), dtype=torch.int32)
    packed = pack_rows(codes, bits)
    assert packed.dtype == torch.int32 and packed.shape == (64 * bits // 32, 24)
    assert torch.equal(unpack_rows(packed, bits), codes)


def test_pack_cols_identity_and_known_word() -> None:
    codes = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 15]], dtype=torch.int32)
    packed = pack_cols(codes, 4)
    # code j sits in bits [4j, 4j+4): 0xF7654321 read as a signed int32
    assert packed.item() == 0xF7654321 - 2**32
    assert torch.equal(unpack_cols(packed, 4), codes)


def test_unpackable_widths_raise_clear_errors() -> None:
    with pytest.raises(KernelError, match="5-bit codes cannot be packed"):
        pack_rows(torch.zeros(32, 8, dtype=torch.int32), 5)
    with pytest.raises(KernelError, match="cannot pack 48 rows .* multiple of 32"):
        pack_rows(torch.zeros(48, 8, dtype=torch.int32), 3)
    with pytest.raises(KernelError, match="cannot pack 12 rows"):
        pack_rows(torch.zeros(12, 8, dtype=torch.int32), 4)


@pytest.mark.parametrize("group_size", [32, 128, -1])
@pytest.mark.parametrize("sym", [False, True])
def test_quant_linear_reproduces_fake_quant(group_size: int, sym: bool) -> None:
    torch.manual_seed(1)
    w, b = torch.randn(48, 256), torch.randn(48)
    res = rtn_quantize(w, QuantScheme(4, group_size, sym))
    layer = QuantLinear.from_result(res, b, scale_dtype=torch.float32)
    torch.testing.assert_close(layer.dequantized_weight(), res.dequantize())
    x = torch.randn(5, 256)
    torch.testing.assert_close(layer(x), x @ res.dequantize().T + b, rtol=1e-5, atol=1e-5)
    deq = dequantize_packed(layer.qweight, layer.qzeros, layer.scales, layer.g_idx, 4)
    torch.testing.assert_close(deq.T, res.dequantize())


def test_primed_reference_weight_equals_unpacked_and_expires() -> None:
    """What GPTQ hands the reference path (dequantized with the layer's float16 scales) is
    bit for bit what the path would unpack; a change to the buffers drops it."""
    from qcal_kernels.dispatch import prime_reference
    from qcal_kernels.errors import KernelError
    from qcal_kernels.reference import dequantize_packed

    from qcal.config import QuantScheme
    from qcal.packing.qlinear import QuantLinear
    from qcal.quant import intgrid
    from qcal.quant.base import rtn_quantize

    torch.manual_seed(5)
    result = rtn_quantize(torch.randn(48, 96), QuantScheme(4, 32))
    layer = QuantLinear.from_result(result, None)
    dense = intgrid.dequantize_grouped(result.codes, result.scales.to(layer.scales.dtype),
                                       result.zeros, result.g_idx)
    unpacked = dequantize_packed(layer.qweight, layer.qzeros, layer.scales, layer.g_idx, 4).T
    assert torch.equal(dense, unpacked)
    prime_reference(layer, dense)
    x = torch.randn(3, 96)
    expected = torch.nn.functional.linear(x, unpacked.contiguous())
    assert torch.equal(layer(x), expected)
    layer.scales.mul_(2)  # new buffers: the primed weight must not be used
    assert torch.allclose(layer(x), 2 * expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(KernelError, match="shape"):
        prime_reference(layer, dense.T)


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_packing_is_the_dense_bit_stream_compressed_tensors_writes(bits: int) -> None:
    """compressed-tensors' own packer (codes along dim 1, signed offset) is the oracle: 3-bit
    codes straddle words exactly as it (and GPTQ's 3-bit layout) lays them."""
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32
    from qcal_kernels.format import pack_transposed

    torch.manual_seed(bits)
    codes = torch.randint(0, 2**bits, (96, 10), dtype=torch.int32)  # [K, N]
    theirs = pack_to_int32((codes.T - (1 << (bits - 1))).to(torch.int8), bits).T
    assert torch.equal(pack_rows(codes, bits), theirs)
    assert torch.equal(pack_transposed(codes.T.contiguous(), bits), theirs)


def test_three_bit_quant_linear_computes_its_fake_quant() -> None:
    torch.manual_seed(3)
    w, b = torch.randn(64, 128), torch.randn(64)
    res = rtn_quantize(w, QuantScheme(3, 32))
    layer = QuantLinear.from_result(res, b, scale_dtype=torch.float32)
    assert layer.qweight.shape == (12, 64) and layer.qzeros.shape == (4, 6)
    x = torch.randn(5, 128)
    assert layer.kernel_backend(x) == "reference"
    torch.testing.assert_close(layer(x), x @ res.dequantize().T + b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("bits", "group_size", "in_features"),
                         [(4, 32, 128), (4, 128, 256), (4, -1, 64), (3, 32, 96), (8, 32, 64)])
def test_grouped_weight_is_the_transposed_reference_bit_for_bit(bits: int, group_size: int,
                                                                 in_features: int) -> None:
    from qcal_kernels.reference import dequantize_grouped_weight

    torch.manual_seed(bits)
    w = torch.randn(64, in_features) * torch.logspace(-2, 1, in_features)  # wide scales
    result = rtn_quantize(w, QuantScheme(bits, group_size, sym=False))
    layer = QuantLinear.from_result(result, None)
    g = in_features if group_size == -1 else group_size
    fast = dequantize_grouped_weight(layer.qweight, layer.qzeros, layer.scales, g, bits)
    ref = dequantize_packed(layer.qweight, layer.qzeros, layer.scales, layer.g_idx, bits).T
    assert fast.shape == (64, in_features) and fast.is_contiguous()
    assert torch.equal(fast, ref)


@pytest.mark.parametrize(("bits", "group_size", "act_order"),
                         [(4, 32, False), (4, 32, True), (3, 32, False), (8, -1, False)])
def test_a_layer_without_its_float_weight_unpacks_it_in_blocks(
        bits: int, group_size: int, act_order: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    import qcal_kernels.dispatch as dispatch

    torch.manual_seed(bits)
    w = torch.randn(160, 128)
    result = rtn_quantize(w, QuantScheme(bits, group_size, sym=False))
    layer = QuantLinear.from_result(result, torch.randn(160))
    if act_order:  # groups no longer contiguous: the gathering reference unpacks each block
        layer.g_idx.copy_(layer.g_idx[torch.randperm(128)])
    x = torch.randn(3, 7, 128)
    monkeypatch.setenv("QCAL_KERNEL", "reference")
    with torch.no_grad():
        whole = layer(x)
        layer._kernel_cache.clear()
        layer.cache_dequantized = False
        monkeypatch.setattr(dispatch, "UNPACK_BLOCK_WEIGHTS", 64 * 128)  # 64 rows: 3 blocks
        built: list[tuple[int, int]] = []
        unpack = dispatch._dequantized
        monkeypatch.setattr(dispatch, "_dequantized", lambda lay, dt, a=0, b=None: (
            built.append((a, b)), unpack(lay, dt, a, b))[1])
        blocks = layer(x)
    assert built == [(0, 64), (64, 128), (128, 160)]
    assert not any(key.startswith("ref:") for key in layer._kernel_cache)
    torch.testing.assert_close(blocks, whole, rtol=1e-6, atol=1e-5)
