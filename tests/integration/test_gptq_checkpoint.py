"""GPTQ-layout checkpoints of GPTQ results: ragged groups, act-order g_idx, and the
v1 / v2 zero-point storage, each through save -> load with equal logits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from qcal.config import GPTQConfig, QuantScheme
from qcal.methods import RunOptions, apply_result
from qcal.methods.gptq_runner import run_gptq
from qcal.model.loading import load_model
from qcal.model.tiny import stdlib_text
from qcal.packing.checkpoint import save_checkpoint
from qcal.packing.checkpoint_load import load_checkpoint

pytestmark = pytest.mark.integration

QUIET = RunOptions(progress=False, log=lambda _: None)


@pytest.fixture(scope="module")
def ids(tiny_model_dir: Path) -> torch.Tensor:
    _, tok, _ = load_model(tiny_model_dir)
    return tok("\n\n".join(stdlib_text()), return_tensors="pt")["input_ids"][0][:16 * 40].view(16, 40)


def _round_trip(net: torch.nn.Module, tok, out: Path, ids: torch.Tensor, cfg: GPTQConfig):  # type: ignore[no-untyped-def]
    save_checkpoint(net, out, tok, sym=cfg.scheme.sym, fields={"desc_act": cfg.desc_act})
    loaded = load_checkpoint(out)
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, net(input_ids=ids).logits,
                                   rtol=1e-5, atol=1e-5)
    return json.loads((out / "config.json").read_text())["quantization_config"], load_file(
        str(out / "model.safetensors"))


def test_ragged_groups_with_act_order(tiny_model_dir: Path, ids: torch.Tensor, tmp_path: Path) -> None:
    """group 96 on in_features 128 (like 128 on SmolLM2's 576): 2 groups, the last of 32."""
    net, tok, _ = load_model(tiny_model_dir)
    cfg = GPTQConfig(QuantScheme(4, 96, sym=False, allow_ragged=True), desc_act=True)
    run_gptq(net, cfg, ids[:8], QUIET)
    qc, state = _round_trip(net, tok, tmp_path / "ragged", ids[8:], cfg)
    assert qc["group_size"] == 96 and qc["desc_act"] is True
    g_idx = state["model.layers.0.self_attn.q_proj.g_idx"]
    assert state["model.layers.0.self_attn.q_proj.scales"].shape == (2, 128)
    assert torch.bincount(g_idx.long()).tolist() == [96, 32]
    assert state["model.layers.0.mlp.down_proj.scales"].shape == (3, 128)  # 256 = 96 + 96 + 64


def test_zero_point_zero_is_stored_as_v2(tiny_model_dir: Path, ids: torch.Tensor, tmp_path: Path) -> None:
    """An asymmetric group whose weights are all >= 0 has zero point 0, which the v1
    "minus one" storage cannot hold: the checkpoint must say gptq_v2 and still load."""
    net, tok, _ = load_model(tiny_model_dir)
    with torch.no_grad():
        net.model.layers[1].mlp.up_proj.weight[:8].abs_()
    cfg = GPTQConfig(QuantScheme(4, 32, sym=False))
    run_gptq(net, cfg, ids[:8], QUIET)
    qc, _ = _round_trip(net, tok, tmp_path / "v2", ids[8:], cfg)
    assert qc["checkpoint_format"] == "gptq_v2"


def test_symmetric_checkpoint_is_v1_with_zeros_minus_one(tiny_model_dir: Path, ids: torch.Tensor,
                                                         tmp_path: Path) -> None:
    from qcal_kernels.format import unpack_cols

    net, tok, _ = load_model(tiny_model_dir)
    cfg = GPTQConfig(QuantScheme(4, 64, sym=True), static_groups=True, desc_act=True)
    run_gptq(net, cfg, ids[:8], QUIET)
    qc, state = _round_trip(net, tok, tmp_path / "v1", ids[8:], cfg)
    assert qc["checkpoint_format"] == "gptq" and qc["sym"] is True
    # Symmetric 4-bit zero point 8 is stored as 7 in the v1 layout that other loaders expect.
    assert unpack_cols(state["model.layers.0.self_attn.o_proj.qzeros"], 4).unique().tolist() == [7]
    # static groups keep g_idx contiguous even with act-order.
    assert torch.equal(state["model.layers.0.self_attn.o_proj.g_idx"],
                       torch.arange(128, dtype=torch.int32) // 64)


def test_apply_result_keeps_act_order_columns(tiny_model_dir: Path) -> None:
    """The packed layer computes with the act-order result's columns in their original order."""
    from qcal.quant.gptq import gptq_quantize
    from qcal.quant.hessian import accumulate_hessian

    net, _, _ = load_model(tiny_model_dir)
    linear = net.model.layers[0].self_attn.q_proj
    x = torch.randn(300, 128) * torch.linspace(0.1, 4, 128)
    h, _ = accumulate_hessian(x, None, 0)
    result = gptq_quantize(linear.weight.data, h, GPTQConfig(QuantScheme(4, 32), desc_act=True))
    layer = apply_result(net, "model.layers.0.self_attn.q_proj", result)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), x @ result.dequantize().T, rtol=1e-5, atol=1e-5)
