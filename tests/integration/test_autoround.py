"""AutoRound end to end on tiny models: every checkpoint format loads back with the
in-memory run's codes and logits; the CLI and the Python API take one route; an
interrupted run resumes to the uninterrupted result; training lowers every block's output
error below RTN's on a second family (Gemma3); --nproc is refused before anything loads."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from method_cases import PROMPTS, assert_same_codes, state, token_ids

from qcal.cli import main
from qcal.config import QuantScheme
from qcal.methods import METHODS, RunOptions
from qcal.methods import autoround as autoround_module
from qcal.methods.autoround import AutoRoundConfig, run_autoround
from qcal.model.loading import load_model
from qcal.model.tiny import build_tiny_family, stdlib_text
from qcal.packing.checkpoint_load import load_checkpoint

pytestmark = pytest.mark.integration

CFG = AutoRoundConfig(QuantScheme(4, 32), iters=6, batch_size=4)
QUIET = RunOptions(progress=False, log=lambda _: None)


def _ids(model_dir: Path, rows: int = 8, seqlen: int = 40) -> torch.Tensor:
    return token_ids(model_dir, rows, seqlen)


@pytest.fixture(scope="module")
def calib(tiny_model_dir: Path) -> torch.Tensor:
    return _ids(tiny_model_dir)


@pytest.mark.parametrize("fmt", ["compressed-tensors", "gptq", "gptq_v2", "awq"])
def test_every_format_loads_back_with_the_in_memory_logits(tiny_model_dir: Path, tmp_path: Path,
                                                           calib: torch.Tensor, fmt: str) -> None:
    from qcal.run import quantize_model_dir

    out = tmp_path / fmt
    quantize_model_dir(tiny_model_dir, "autoround", CFG, out, calib, opts=QUIET, fmt=fmt)
    ref, _, _ = load_model(tiny_model_dir)
    METHODS.get("autoround").run(ref, CFG, calib, QUIET)
    back = load_checkpoint(out)
    assert_same_codes(ref, back)
    with torch.no_grad():
        torch.testing.assert_close(back(PROMPTS).logits, ref(PROMPTS).logits)


def test_cli_and_api_take_the_one_route(tiny_model_dir: Path, tmp_path: Path) -> None:
    import qcal

    text = tmp_path / "calib.txt"
    text.write_text("\n\n".join(stdlib_text()))
    out, api = tmp_path / "cli", tmp_path / "api"
    assert main(["quantize", "--model", str(tiny_model_dir), "--method", "autoround",
                 "--iters", "4", "--autoround-batch", "2", "--group-size", "32", "--calib",
                 str(text), "--nsamples", "4", "--seqlen", "32", "--device", "cpu",
                 "-o", str(out)]) == 0
    log = json.loads((out / "quant_log.json").read_text())
    assert log["recipe"]["method"]["type"] == "AutoRoundConfig"
    assert log["recipe"]["method"]["iters"] == 4 and log["recipe"]["method"]["batch_size"] == 2
    qcal.quantize(str(tiny_model_dir), method="autoround", scheme={"bits": 4, "group_size": 32},
                  output=api, calib=str(text), nsamples=4, seqlen=32, iters=4, batch_size=2)
    assert_same_codes(load_checkpoint(out), load_checkpoint(api))


def test_nproc_is_refused_before_the_model_loads(tiny_model_dir: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "never"
    assert main(["quantize", "--model", str(tiny_model_dir), "--method", "autoround",
                 "--nproc", "2", "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "drop --nproc" in err[0] and not out.exists()


def test_resume_continues_after_interruption(tiny_model_dir: Path, calib: torch.Tensor,
                                             tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reference, _, _ = load_model(tiny_model_dir)
    ref_losses = run_autoround(reference, CFG, calib, QUIET)
    real, calls = autoround_module.train_block, []

    def interrupted(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt  # during layer 1
        return real(*args, **kwargs)

    monkeypatch.setattr(autoround_module, "train_block", interrupted)
    work = tmp_path / "work"
    opts = RunOptions(progress=False, log=lambda _: None, work_dir=work,
                      weights_dir=tiny_model_dir)
    first, _, _ = load_model(tiny_model_dir)
    with pytest.raises(KeyboardInterrupt):
        run_autoround(first, CFG, calib, opts)
    assert json.loads((work / "progress.json").read_text())["done"] == 0
    monkeypatch.setattr(autoround_module, "train_block", real)
    resumed, _, _ = load_model(tiny_model_dir)
    losses = run_autoround(resumed, CFG, calib, dataclasses.replace(opts, resume=True))
    assert losses == pytest.approx(ref_losses)
    a, b = state(resumed), state(reference)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_second_family_learns_below_rtn(tmp_path: Path) -> None:
    model_dir = build_tiny_family("gemma3", tmp_path / "gemma3")
    ids = _ids(model_dir, rows=4, seqlen=32)
    lines: list[str] = []
    net, _, _ = load_model(model_dir)
    cfg = AutoRoundConfig(QuantScheme(4, 32), iters=25, batch_size=4)  # all windows each step
    run_autoround(net, cfg, ids, RunOptions(progress=False, log=lines.append))
    assert len(lines) == 2  # one line per layer: "block mse <RTN> -> <best> (iteration k)"
    for line in lines:
        rtn, best = (float(x) for x in line.split("block mse ")[1].split(" (RTN) -> ")[0:1]
                     + [line.split(" -> ")[1].split(" ")[0]])
        assert best < rtn, line
