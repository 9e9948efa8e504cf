"""`qcal quantize --method hqq` end to end on the tiny model: in every checkpoint format the
saved codes and logits are those of the method run in memory, the Python API takes the
same route, and HQQ lowers RTN's weight error on every linear."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from qcal.cli import main
from qcal.config import QuantScheme, RTNConfig
from qcal.methods import METHODS, RunOptions
from qcal.methods.hqq import HQQConfig
from qcal.model.loading import load_model
from qcal.packing.checkpoint import quant_modules
from qcal.packing.checkpoint_load import load_checkpoint
from qcal.packing.formats import codes_of

pytestmark = pytest.mark.integration
PROMPTS = torch.tensor([[5, 17, 99, 240, 3, 77, 12, 8, 150, 42, 9, 300]])


def _in_memory(model_dir: Path, cfg) -> tuple[torch.nn.Module, dict]:
    net, _, _ = load_model(model_dir)
    method = "hqq" if isinstance(cfg, HQQConfig) else "rtn"
    return net, METHODS.get(method).run(net, cfg, None, RunOptions(progress=False))


def _same_codes(a: torch.nn.Module, b: torch.nn.Module) -> None:
    qa, qb = quant_modules(a), quant_modules(b)
    assert qa.keys() == qb.keys() and len(qa) > 0
    for name in qa:
        ca, cb = codes_of(qa[name]), codes_of(qb[name])
        assert torch.equal(ca.codes, cb.codes) and torch.equal(ca.zeros, cb.zeros), name
        torch.testing.assert_close(ca.scales.float(), cb.scales.float(), rtol=0, atol=0)


@pytest.mark.parametrize("fmt", ["compressed-tensors", "gptq", "gptq_v2", "awq"])
def test_cli_checkpoint_loads_back_with_equal_logits(tiny_model_dir: Path, tmp_path: Path,
                                                     fmt: str) -> None:
    out = tmp_path / fmt
    assert main(["quantize", "--model", str(tiny_model_dir), "--method", "hqq", "--group-size",
                 "32", "--device", "cpu", "--format", fmt, "--hqq-iters", "10", "-o",
                 str(out)]) == 0
    log = json.loads((out / "quant_log.json").read_text())
    assert log["recipe"]["method"]["type"] == "HQQConfig" and log["calibration"] is None
    ref, _ = _in_memory(tiny_model_dir, HQQConfig(QuantScheme(4, 32), iters=10))
    back = load_checkpoint(out)
    _same_codes(ref, back)
    with torch.no_grad():
        torch.testing.assert_close(back(PROMPTS).logits, ref(PROMPTS).logits, rtol=0, atol=0)


def test_python_api_takes_the_same_route(tiny_model_dir: Path, tmp_path: Path) -> None:
    import qcal

    out = tmp_path / "api"
    qcal.quantize(str(tiny_model_dir), method="hqq", scheme={"bits": 4, "group_size": 32},
                  output=out, iters=10)
    ref, _ = _in_memory(tiny_model_dir, HQQConfig(QuantScheme(4, 32), iters=10))
    _same_codes(ref, load_checkpoint(out))


def test_hqq_lowers_the_weight_error_of_rtn(tiny_model_dir: Path) -> None:
    scheme = QuantScheme(4, 32)
    _, hqq = _in_memory(tiny_model_dir, HQQConfig(scheme))
    _, rtn = _in_memory(tiny_model_dir, RTNConfig(scheme))
    assert hqq.keys() == rtn.keys()
    assert sum(hqq.values()) < sum(rtn.values())


def test_sym_is_refused_before_the_model_loads(tiny_model_dir: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "never"
    assert main(["quantize", "--model", str(tiny_model_dir), "--method", "hqq", "--sym",
                 "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "drop --sym" in err[0] and not out.exists()
