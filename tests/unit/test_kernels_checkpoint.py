"""A loaded qcal checkpoint runs its QuantLinears on the CPU int4 op (tiny random Llama)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from qcal_kernels.cpu import cpu_int4_available

from qcal.config import QuantScheme, RTNConfig
from qcal.packing.checkpoint import load_checkpoint, quant_modules
from qcal.pipeline import quantize_model_dir

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
    ids = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(0))
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
