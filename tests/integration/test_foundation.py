"""Tiny random Llama end to end: quantize -> save -> load -> perplexity, and bad input."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from qcal.cli import main
from qcal.config import QuantScheme, RTNConfig
from qcal.errors import CheckpointError, ConfigError, ModelNotFoundError
from qcal.eval.perplexity import perplexity
from qcal.model.loading import load_model
from qcal.model.tiny import stdlib_text
from qcal.packing.checkpoint_load import load_checkpoint
from qcal.packing.qlinear import QuantLinear
from qcal.run import quantize_model_dir

pytestmark = pytest.mark.integration

TEXT = "\n\n".join(stdlib_text()[:40])


@pytest.fixture(scope="module")
def rtn_checkpoint(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ckpt") / "tiny-rtn"
    quantize_model_dir(tiny_model_dir, "rtn", RTNConfig(QuantScheme(4, 32, sym=False)), out,
                       fmt="gptq")
    return out


def test_checkpoint_has_gptq_layout(rtn_checkpoint: Path) -> None:
    from safetensors.torch import load_file

    cfg = json.loads((rtn_checkpoint / "config.json").read_text())
    qc = cfg["quantization_config"]
    assert qc["quant_method"] == "gptq" and qc["bits"] == 4 and qc["group_size"] == 32
    assert qc["checkpoint_format"] in {"gptq", "gptq_v2"} and qc["sym"] is False
    state = load_file(str(rtn_checkpoint / "model.safetensors"))
    name = "model.layers.0.mlp.down_proj"  # in=256, out=128
    assert state[f"{name}.qweight"].shape == (256 // 8, 128)
    assert state[f"{name}.qweight"].dtype == torch.int32
    assert state[f"{name}.qzeros"].shape == (256 // 32, 128 // 8)
    assert state[f"{name}.scales"].shape == (256 // 32, 128)
    assert state[f"{name}.scales"].dtype == torch.float16
    assert state[f"{name}.g_idx"].shape == (256,)
    assert not any(p.name.startswith(".") for p in rtn_checkpoint.parent.iterdir())


def test_loaded_checkpoint_matches_quantized_weights(tiny_model_dir: Path,
                                                     rtn_checkpoint: Path) -> None:
    from qcal.quant.base import rtn_quantize

    float_model, _, _ = load_model(tiny_model_dir)
    qmodel = load_checkpoint(rtn_checkpoint)
    layer = qmodel.model.layers[1].self_attn.o_proj
    assert isinstance(layer, QuantLinear)
    w = float_model.model.layers[1].self_attn.o_proj.weight.detach()
    expected = rtn_quantize(w, QuantScheme(4, 32, sym=False)).dequantize()
    # scales are stored in fp16, so allow for its rounding
    torch.testing.assert_close(layer.dequantized_weight(), expected, rtol=2e-3, atol=2e-3)


def test_perplexity_after_round_trip_is_finite_and_close(tiny_model_dir: Path,
                                                         rtn_checkpoint: Path) -> None:
    fp, tok, _ = load_model(tiny_model_dir)
    q, _, _ = load_model(rtn_checkpoint)
    p_fp = perplexity(fp, tok, TEXT, seqlen=64, max_windows=8, progress=False)
    p_q = perplexity(q, tok, TEXT, seqlen=64, max_windows=8, progress=False)
    assert p_fp.tokens == p_q.tokens == 8 * 63
    assert math.isfinite(p_q.ppl) and p_q.ppl != p_fp.ppl
    # a random model is near-uniform: both sit near the vocabulary size
    vocab = fp.config.vocab_size
    assert 0.5 * vocab < p_fp.ppl < 2 * vocab and 0.5 * vocab < p_q.ppl < 2 * vocab


def test_cli_quantize_then_eval(tiny_model_dir: Path, tmp_path: Path,
                                capsys: pytest.CaptureFixture) -> None:
    text = tmp_path / "eval.txt"
    text.write_text(TEXT)
    out = tmp_path / "cli-rtn"
    assert main(["quantize", "--model", str(tiny_model_dir), "--method", "rtn", "--bits", "4",
                 "--group-size", "64", "--sym", "-o", str(out)]) == 0
    assert (out / "model.safetensors").is_file()
    log = json.loads((out / "quant_log.json").read_text())
    assert log["method"] == "rtn" and len(log["losses"]) == 2 * 7
    result = tmp_path / "ppl.json"
    assert main(["eval", "--model", str(out), "--ppl", "--text", str(text), "--seqlen", "64",
                 "--max-windows", "4", "-o", str(result)]) == 0
    data = json.loads(result.read_text())
    assert data["perplexity"]["model"]["file"]["tokens"] == 4 * 63


def test_unknown_model_path_is_a_clear_error(tmp_path: Path,
                                             capsys: pytest.CaptureFixture) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        load_model(missing)
    assert main(["quantize", "--model", str(missing)]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "Traceback" not in err


def test_group_size_that_does_not_divide_is_rejected(tiny_model_dir: Path,
                                                     tmp_path: Path) -> None:
    cfg = RTNConfig(QuantScheme(4, 96))
    with pytest.raises(ConfigError, match="group_size=96 does not divide in_features=128"):
        quantize_model_dir(tiny_model_dir, "rtn", cfg, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_empty_text_source_is_a_clear_error(tiny_model_dir: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    assert main(["eval", "--model", str(tiny_model_dir), "--text", str(empty)]) == 2
    assert "empty" in capsys.readouterr().err
    model, tok, _ = load_model(tiny_model_dir)
    with pytest.raises(ConfigError, match="fewer than one window"):
        perplexity(model, tok, "short text", seqlen=512, progress=False)


def test_corrupted_checkpoint_is_a_clear_error(rtn_checkpoint: Path, tmp_path: Path) -> None:
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(rtn_checkpoint, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="corrupted or truncated"):
        load_checkpoint(broken)
