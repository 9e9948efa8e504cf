"""`--selector self`: the model writes its own calibration windows: full windows starting
from its prompts, byte-identical for the same settings and seed, another set for another
seed, resumed from finished batches, the settings and the model's identity in the manifest;
usable from `qcal quantize` and `qcal calib build`; bad settings refused before any model
loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from qcal.calib.build import resolve_calib
from qcal.calib.self_gen import generate_calib_set, parse_self
from qcal.cli import main
from qcal.errors import ConfigError
from qcal.model.loading import load_model, load_tokenizer

pytestmark = pytest.mark.integration


def test_seeded_full_windows_with_their_manifest(tiny_model_dir: Path,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:
    monkeypatch.setenv("QCAL_RUNS_DIR", str(tmp_path / "runs"))
    tok = load_tokenizer(tiny_model_dir)
    a = resolve_calib("unused", tok, 5, 64, 3, selector="self:batch=2,temperature=0.9")
    b = resolve_calib("unused", tok, 5, 64, 3, selector="self:batch=2,temperature=0.9")
    c = resolve_calib("unused", tok, 5, 64, 4, selector="self:batch=2,temperature=0.9")
    assert a.input_ids.shape == (5, 64) and torch.equal(a.input_ids, b.input_ids)
    assert not torch.equal(a.input_ids, c.input_ids) and a.digest == b.digest != c.digest
    prompt = tok(a.manifest["samples"][0]["prompt"])["input_ids"]
    assert a.input_ids[0, :len(prompt)].tolist() == prompt  # each window starts at its prompt
    params = a.manifest["params"]
    assert params["temperature"] == 0.9 and params["batch"] == 2 and len(params["model"]) == 24
    assert a.manifest["selector"] == "self" and a.manifest["selection"]["generation_seconds"] >= 0
    assert not list((tmp_path / "runs").rglob("self-batch*"))  # batches go once the set is done


def test_an_interrupted_generation_resumes_to_the_same_set(tiny_model_dir: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import qcal.calib.self_gen as module

    net, tok, _ = load_model(tiny_model_dir)
    whole = generate_calib_set(net, tok, 6, 48, 0, "self:batch=2", "m", tmp_path / "w1")
    real, calls = module._batch, []

    def dying(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(module, "_batch", dying)
    with pytest.raises(KeyboardInterrupt):
        generate_calib_set(net, tok, 6, 48, 0, "self:batch=2", "m", tmp_path / "w2")
    assert len(list((tmp_path / "w2").glob("self-batch*"))) == 1
    monkeypatch.setattr(module, "_batch", real)
    resumed = generate_calib_set(net, tok, 6, 48, 0, "self:batch=2", "m", tmp_path / "w2")
    assert torch.equal(resumed.input_ids, whole.input_ids)


def test_cli_quantize_and_build(tiny_model_dir: Path, tmp_path: Path,
                                monkeypatch: pytest.MonkeyPatch,
                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("QCAL_RUNS_DIR", str(tmp_path / "runs"))
    out = tmp_path / "q"
    assert main(["quantize", "--model", str(tiny_model_dir), "--method", "gptq", "--group-size",
                 "32", "--selector", "self:batch=4", "--nsamples", "4", "--seqlen", "64",
                 "--device", "cpu", "-o", str(out)]) == 0
    log = json.loads((out / "quant_log.json").read_text())
    assert log["calibration"]["selector"] == "self"
    saved = tmp_path / "set"
    assert main(["calib", "build", "--model", str(tiny_model_dir), "--selector", "self",
                 "--n", "4", "--seqlen", "64", "-o", str(saved)]) == 0
    assert json.loads((saved / "manifest.json").read_text())["source"] == "self"
    capsys.readouterr()
    never = tmp_path / "never"
    assert main(["quantize", "--model", str(tiny_model_dir), "--method", "gptq", "--selector",
                 "self:temperature=0", "-o", str(never)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "temperature" in err[0] and not never.exists()


@pytest.mark.parametrize("spec", ["self:temperature=0", "self:top_p=2", "self:langs=xx",
                                  "self:colour=red", "self:batch=x", "self:prompts=/no/file"])
def test_bad_settings(spec: str) -> None:
    with pytest.raises(ConfigError):
        parse_self(spec)
