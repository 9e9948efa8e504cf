"""`qcal quantize --method rtn-mse` end to end on the tiny model: in every checkpoint format the
saved codes and logits are those of the method run in memory, and the clip search lowers the
weight error of plain RTN."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from qcal.cli import main
from qcal.config import QuantScheme
from qcal.methods import METHODS, RunOptions
from qcal.methods.rtn_mse import RTNMSEConfig
from qcal.model.loading import load_model
from qcal.packing.checkpoint import quant_modules
from qcal.packing.checkpoint_load import load_checkpoint
from qcal.packing.formats import codes_of

pytestmark = pytest.mark.integration
PROMPTS = torch.tensor([[5, 17, 99, 240, 3, 77, 12, 8, 150, 42, 9, 300]])


def _in_memory(model_dir: Path, cfg: RTNMSEConfig) -> tuple[torch.nn.Module, dict]:
    net, _, _ = load_model(model_dir)
    losses = METHODS.get("rtn-mse").run(net, cfg, None, RunOptions(progress=False))
    return net, losses


@pytest.mark.parametrize(("fmt", "sym"), [("compressed-tensors", False), ("gptq", True),
                                          ("gptq_v2", False), ("awq", False)])
def test_cli_checkpoint_loads_back_with_equal_logits(tiny_model_dir: Path, tmp_path: Path,
                                                     fmt: str, sym: bool) -> None:
    out = tmp_path / fmt
    argv = ["quantize", "--model", str(tiny_model_dir), "--method", "rtn-mse", "--group-size",
            "32", "--device", "cpu", "--format", fmt, "--mse-grid", "40", "-o", str(out)]
    assert main([*argv, *(["--sym"] if sym else [])]) == 0
    log = json.loads((out / "quant_log.json").read_text())
    assert log["recipe"]["method"]["type"] == "RTNMSEConfig" and log["calibration"] is None
    cfg = RTNMSEConfig(QuantScheme(4, 32, sym=sym), mse_grid=40)
    ref, _ = _in_memory(tiny_model_dir, cfg)
    back = load_checkpoint(out)
    qa, qb = quant_modules(ref), quant_modules(back)
    assert qa.keys() == qb.keys() and len(qa) > 0
    for name in qa:
        a, b = codes_of(qa[name]), codes_of(qb[name])
        assert torch.equal(a.codes, b.codes) and torch.equal(a.zeros, b.zeros), name
    with torch.no_grad():
        torch.testing.assert_close(back(PROMPTS).logits, ref(PROMPTS).logits, rtol=0, atol=0)


def test_clip_search_lowers_the_weight_error_of_rtn(tiny_model_dir: Path) -> None:
    scheme = QuantScheme(4, 32)
    _, mse = _in_memory(tiny_model_dir, RTNMSEConfig(scheme, mse_norm=2.0))
    net, _, _ = load_model(tiny_model_dir)
    from qcal.config import RTNConfig

    rtn = METHODS.get("rtn").run(net, RTNConfig(scheme), None, RunOptions(progress=False))
    assert mse.keys() == rtn.keys()
    assert all(mse[n] <= rtn[n] * (1 + 1e-6) for n in rtn)
    assert sum(mse.values()) < sum(rtn.values())


def test_scheme_override_reaches_rtn_mse(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A method added by one file honours --scheme-override like RTN (the weight-only runner
    hands each linear its own scheme)."""
    out = tmp_path / "ckpt"
    argv = ["quantize", "--model", str(tiny_model_dir), "--method", "rtn-mse", "--group-size",
            "32", "--device", "cpu", "--mse-grid", "10", "--scheme-override",
            r".*down_proj=bits:8,group:32", "-o", str(out)]
    assert main(argv) == 0
    layers = quant_modules(load_checkpoint(out))
    bits = {name: layer.bits for name, layer in layers.items()}
    assert bits and all((b == 8) == name.endswith("down_proj") for name, b in bits.items()), bits
