"""A loaded qcal checkpoint runs its QuantLinears on the CPU int4 op (tiny random Llama)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from qcal_kernels.cpu import cpu_int4_available

from qcal.config import QuantScheme, RTNConfig
from qcal.packing.checkpoint import quant_modules
from qcal.packing.checkpoint_load import load_checkpoint
from qcal.run import quantize_model_dir

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not cpu_int4_available(), reason="this torch has no CPU int4 ops"),
]


@pytest.fixture(scope="module")
def checkpoint(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("kernels-ckpt") / "tiny-rtn-g32"
    quantize_model_dir(tiny_model_dir, "rtn", RTNConfig(QuantScheme(4, 32)), out)
    return out


def logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits.float()


def test_bf16_checkpoint_forward_uses_cpu_op(checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QCAL_KERNEL", raising=False)
    # 2 x 8 tokens: few enough for the int4 op (dispatch.CPU_INT4_MAX_TOKENS).
    ids = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(0))
    model = load_checkpoint(checkpoint, dtype=torch.bfloat16)
    layers = quant_modules(model)
    assert layers
    fast = logits(model, ids)
    assert all("cpu_int4" in layer._kernel_cache for layer in layers.values())

    monkeypatch.setenv("QCAL_KERNEL", "reference")
    exact = logits(load_checkpoint(checkpoint, dtype=torch.float32), ids)
    err = float((fast - exact).norm() / exact.norm())
    assert err < 5e-2, err  # bf16 end to end (attention, norms and the int4 op)
    # Same top-1 predictions almost everywhere: the op is the checkpoint's weights, not noise.
    assert float((fast.argmax(-1) == exact.argmax(-1)).float().mean()) > 0.9


def test_float32_checkpoint_stays_on_the_exact_path(checkpoint: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QCAL_KERNEL", raising=False)
    model = load_checkpoint(checkpoint)
    x = torch.randn(1, 128)
    assert {layer.kernel_backend(x) for layer in quant_modules(model).values()} == {"reference"}
    monkeypatch.setenv("QCAL_KERNEL", "cpu")
    assert {layer.kernel_backend(x) for layer in quant_modules(model).values()} == {"cpu"}


def test_many_tokens_dequantize_then_gemm(checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Prefill-sized inputs take a float32 GEMM on the cached dequantized weight; a model
    whose dequantized weights would not fit (cache_dequantized=False) stays on the int4 op
    and keeps no float copy."""
    from qcal_kernels.dispatch import CPU_INT4_MAX_TOKENS

    monkeypatch.delenv("QCAL_KERNEL", raising=False)
    model = load_checkpoint(checkpoint, dtype=torch.bfloat16)
    layer = next(iter(quant_modules(model).values()))
    few = torch.randn(CPU_INT4_MAX_TOKENS, layer.in_features, dtype=torch.bfloat16)
    many = torch.randn(2, CPU_INT4_MAX_TOKENS // 2 + 1, layer.in_features, dtype=torch.bfloat16)
    assert layer.kernel_backend(few) == "cpu" and layer.kernel_backend(many) == "reference"
    exact = many.float() @ layer.dequantized_weight(torch.float32).T
    with torch.no_grad():
        y = layer(many)
        assert f"ref:{torch.float32}:cpu" in layer._kernel_cache
    assert float((y.float() - exact).norm() / exact.norm()) < 1e-2  # bf16 x, float32 GEMM
    layer._kernel_cache.clear()
    layer.cache_dequantized = False
    assert layer.kernel_backend(many) == "cpu"
    with torch.no_grad():
        layer(many)
    assert not any(key.startswith("ref:") for key in layer._kernel_cache)
