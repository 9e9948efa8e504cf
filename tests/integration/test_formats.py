"""Checkpoint formats: GPTQ layout, compressed-tensors pack-quantized and AWQ GEMM, in both
directions; transformers loads the compressed-tensors export and computes qcal's logits;
the AWQ packing equals AutoAWQ's reference loop; every checkpoint carries a model card."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from qcal.cli import main
from qcal.config import GPTQConfig, QuantScheme, RTNConfig
from qcal.methods import METHODS, RunOptions
from qcal.model.loading import load_model
from qcal.model.tiny import stdlib_text
from qcal.packing.checkpoint import quant_modules, save_checkpoint
from qcal.packing.checkpoint_load import load_checkpoint
from qcal.packing.formats import AWQ_ORDER, codes_of

pytestmark = pytest.mark.integration
PROMPTS = torch.tensor([[5, 17, 99, 240, 3, 77, 12, 8, 150, 42, 9, 300],
                        [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]])


def _quantized(model_dir: Path, config, calib: torch.Tensor | None = None):
    net, tok, _ = load_model(model_dir)
    method = "gptq" if isinstance(config, GPTQConfig) else "rtn"
    METHODS.get(method).run(net, config, calib, RunOptions(progress=False, log=lambda _: None))
    return net, tok


def _assert_same_codes(a, b) -> None:
    qa, qb = quant_modules(a), quant_modules(b)
    assert qa.keys() == qb.keys()
    for name in qa:
        ca, cb = codes_of(qa[name]), codes_of(qb[name])
        assert torch.equal(ca.codes, cb.codes) and torch.equal(ca.zeros, cb.zeros), name
        assert torch.equal(ca.scales.float(), cb.scales.float()), name
        assert torch.equal(ca.g_idx, cb.g_idx), name


@pytest.mark.parametrize("fmt", ["gptq", "compressed-tensors", "awq"])
@pytest.mark.parametrize("sym", [False, True])
def test_round_trip_keeps_every_code(tiny_model_dir: Path, tmp_path: Path, fmt: str,
                                     sym: bool) -> None:
    net, tok = _quantized(tiny_model_dir, RTNConfig(QuantScheme(4, 32, sym=sym)))
    save_checkpoint(net, tmp_path / fmt, tok, sym=sym, fmt=fmt)
    back = load_checkpoint(tmp_path / fmt)
    assert json.loads((tmp_path / fmt / "config.json").read_text())[
        "quantization_config"]["quant_method"] == fmt
    _assert_same_codes(net, back)
    torch.testing.assert_close(back(PROMPTS).logits, net(PROMPTS).logits, rtol=0, atol=0)


@pytest.mark.parametrize("fmt", ["gptq", "compressed-tensors"])
@pytest.mark.parametrize("bits", [2, 3, 8])
def test_round_trip_of_other_widths(tiny_model_dir: Path, tmp_path: Path, fmt: str,
                                    bits: int) -> None:
    # 8-bit codes span 0..255: the signed values plus the offset must wrap exactly in a byte.
    net, tok = _quantized(tiny_model_dir, RTNConfig(QuantScheme(bits, 32, sym=False)))
    save_checkpoint(net, tmp_path / fmt, tok, sym=False, fmt=fmt)
    back = load_checkpoint(tmp_path / fmt)
    _assert_same_codes(net, back)
    torch.testing.assert_close(back(PROMPTS).logits, net(PROMPTS).logits, rtol=0, atol=0)


@pytest.mark.parametrize("fmt", ["gptq", "compressed-tensors"])
def test_a_loaded_checkpoint_owns_its_tensors(tiny_model_dir: Path, tmp_path: Path,
                                              fmt: str) -> None:
    # Read, not mapped: a model that shared pages with its files would change (or crash)
    # when they are rewritten, and would count the pages it read in memory twice.
    net, tok = _quantized(tiny_model_dir, RTNConfig(QuantScheme(4, 32, sym=False)))
    save_checkpoint(net, tmp_path / fmt, tok, sym=False, fmt=fmt)
    back = load_checkpoint(tmp_path / fmt)
    before = back(PROMPTS).logits
    for f in (tmp_path / fmt).glob("*.safetensors"):
        with open(f, "r+b") as handle:  # same length, every tensor byte zeroed in place
            length = int.from_bytes(handle.read(8), "little")
            handle.seek(8 + length)
            handle.write(bytes(f.stat().st_size - 8 - length))
    torch.testing.assert_close(back(PROMPTS).logits, before, rtol=0, atol=0)


def test_act_order_exports_to_compressed_tensors_but_not_awq(tiny_model_dir: Path,
                                                            tmp_path: Path) -> None:
    from compressed_tensors.quantization import QuantizationConfig

    from qcal.errors import CheckpointError

    # compressed-tensors 0.20 stores act-order as actorder "weight" (static groups, no g_idx):
    # the value its own config classes accept, so the export validates as theirs.
    calib = torch.randint(0, 400, (4, 32), generator=torch.Generator().manual_seed(0))
    net, tok = _quantized(tiny_model_dir, GPTQConfig(QuantScheme(4, 32), desc_act=True,
                                                     static_groups=True), calib)
    save_checkpoint(net, tmp_path / "ct", tok, sym=False, fmt="compressed-tensors",
                    fields={"desc_act": True})
    qcfg = json.loads((tmp_path / "ct" / "config.json").read_text())["quantization_config"]
    assert qcfg["config_groups"]["group_0"]["weights"]["actorder"] == "weight"
    parsed = QuantizationConfig.model_validate(qcfg).config_groups["group_0"].weights
    assert (parsed.actorder, parsed.symmetric, parsed.group_size) == ("weight", False, 32)
    _assert_same_codes(net, load_checkpoint(tmp_path / "ct"))
    # Act-order groups recorded in g_idx (no static groups) have no compressed-tensors form.
    dynamic, tok = _quantized(tiny_model_dir, GPTQConfig(QuantScheme(4, 32), desc_act=True), calib)
    with pytest.raises(CheckpointError, match="act-order groups .g_idx., which compressed-tensors"):
        save_checkpoint(dynamic, tmp_path / "ct2", tok, sym=False, fmt="compressed-tensors")
    with pytest.raises(CheckpointError, match="AWQ GEMM layout holds 4-bit weights with contiguous"):
        save_checkpoint(dynamic, tmp_path / "awq", tok, sym=False, fmt="awq")


@pytest.mark.parametrize("sym", [False, True])
def test_transformers_loads_the_compressed_tensors_export(tiny_model_dir: Path, tmp_path: Path,
                                                          sym: bool) -> None:
    from transformers import AutoModelForCausalLM

    net, tok = _quantized(tiny_model_dir, RTNConfig(QuantScheme(4, 32, sym=sym)))
    save_checkpoint(net, tmp_path / "ct", tok, sym=sym, fmt="compressed-tensors")
    # No extra argument: an asymmetric export's config.json asks for load-time decompression.
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path / "ct"), dtype=torch.float32)
    with torch.no_grad():
        ours, theirs = net(PROMPTS).logits, hf(PROMPTS).logits
    assert float((ours - theirs).abs().max() / ours.abs().max()) < 1e-3  # float32: 1e-3 relative
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))


def _autoawq_pack(intweight: torch.Tensor, bits: int = 4) -> torch.Tensor:
    """AutoAWQ's WQLinear_GEMM packing, written as its loop: the independent oracle."""
    pack_num = 32 // bits
    packed = torch.zeros(intweight.shape[0], intweight.shape[1] // pack_num, dtype=torch.int64)
    for col in range(intweight.shape[1] // pack_num):
        for i in range(pack_num):
            packed[:, col] |= intweight[:, col * pack_num + AWQ_ORDER[i]].to(torch.int64) << (i * bits)
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


def test_awq_layout_matches_autoawq_packing_and_loads(tiny_model_dir: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    net, tok = _quantized(tiny_model_dir, RTNConfig(QuantScheme(4, 32)))
    save_checkpoint(net, tmp_path / "awq", tok, sym=False, fmt="awq")
    state = load_file(str(tmp_path / "awq" / "model.safetensors"))
    for name, layer in quant_modules(net).items():
        c = codes_of(layer)
        assert torch.equal(state[f"{name}.qweight"], _autoawq_pack(c.codes.T.contiguous()))
        assert torch.equal(state[f"{name}.qzeros"], _autoawq_pack(c.zeros))
    # A checkpoint packed by the oracle (as AutoAWQ writes it) loads in qcal.
    for name, layer in quant_modules(net).items():
        state[f"{name}.qweight"] = _autoawq_pack(codes_of(layer).codes.T.contiguous())
    save_file(state, str(tmp_path / "awq" / "model.safetensors"))
    _assert_same_codes(net, load_checkpoint(tmp_path / "awq"))


def test_cli_format_export_and_model_card(tiny_model_dir: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture) -> None:
    text = tmp_path / "calib.txt"
    text.write_text("\n\n".join(stdlib_text()[:40]), encoding="utf-8")
    ct = tmp_path / "ct"
    assert main(["quantize", "--model", str(tiny_model_dir), "--method", "gptq", "--group-size",
                 "32", "--calib", str(text), "--nsamples", "4", "--seqlen", "32", "--format",
                 "compressed-tensors", "-o", str(ct)]) == 0
    card = (ct / "README.md").read_text()
    log = json.loads((ct / "quant_log.json").read_text())
    assert card.startswith("---\nbase_model:") and "GPTQ w4 g32" in card
    assert log["calibration"]["digest"][:16] in card and "--format compressed-tensors" in card
    assert main(["export", "--model", str(ct), "--format", "awq", "-o", str(tmp_path / "awq")]) == 0
    assert main(["export", "--model", str(tmp_path / "awq"), "--format", "gptq",
                 "-o", str(tmp_path / "gptq")]) == 0
    a, b = load_checkpoint(ct), load_checkpoint(tmp_path / "gptq")
    _assert_same_codes(a, b)
    assert "compressed-tensors" in (tmp_path / "awq" / "quant_log.json").read_text()
    capsys.readouterr()
    assert main(["quantize", "--model", str(tiny_model_dir), "--group-size", "48", "--format", "awq",
                 "--allow-ragged-groups", "-o", str(tmp_path / "ragged")]) == 2
    err = capsys.readouterr().err
    assert "needs whole groups" in err and not (tmp_path / "ragged").exists()
    assert main(["export", "--model", str(tiny_model_dir), "--format", "awq",
                 "-o", str(tmp_path / "x")]) == 2
    assert "not a quantized checkpoint" in capsys.readouterr().err


def test_default_group_size_divides_every_linear(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture) -> None:
    from qcal.model.tiny import build_tiny_llama

    model = build_tiny_llama(tmp_path / "m", hidden=192, intermediate=384, heads=4, kv_heads=2)
    out = tmp_path / "ckpt"
    assert main(["quantize", "--model", str(model), "-o", str(out)]) == 0
    assert "group size 64: the largest of 128/64/32 that divides" in capsys.readouterr().err
    qcfg = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qcfg["config_groups"]["group_0"]["weights"]["group_size"] == 64
    assert "group size 64" in (out / "README.md").read_text()
    assert main(["quantize", "--model", str(model), "--group-size", "128", "-o",
                 str(tmp_path / "x")]) == 2
    assert "--allow-ragged-groups" in capsys.readouterr().err
    assert main(["quantize", "--model", str(model), "--group-size", "128", "--format", "gptq",
                 "--allow-ragged-groups", "-o", str(tmp_path / "ragged")]) == 0
