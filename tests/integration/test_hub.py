"""Hub model ids resolve through huggingface_hub's cache, offline, from a cache folder laid
out as huggingface_hub lays it out (models--org--name/snapshots/<sha>, refs/main)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from qcal.cli import main
from qcal.errors import ModelNotFoundError
from qcal.model.hub import parse_hub_id
from qcal.model.loading import resolve_model_dir

pytestmark = pytest.mark.integration
SHA = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture()
def hub_cache(tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    repo = tmp_path / "hub" / "models--testorg--tiny-lm"
    snap = repo / "snapshots" / SHA
    shutil.copytree(tiny_model_dir, snap)
    (snap / "README.md").write_text("---\nlicense: apache-2.0\n---\n# tiny\n")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(SHA)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    return snap


def test_hub_id_forms() -> None:
    assert parse_hub_id("HuggingFaceTB/SmolLM2-135M-Instruct") == (
        "HuggingFaceTB/SmolLM2-135M-Instruct", None)
    assert parse_hub_id("org/name@v1.0") == ("org/name", "v1.0")
    for not_an_id in ("./org/name", "/abs/path", "a/b/c", "name", "~/x"):
        assert parse_hub_id(not_an_id) is None, not_an_id


def test_offline_cache_resolves_main_and_a_commit(hub_cache: Path) -> None:
    assert resolve_model_dir("testorg/tiny-lm") == hub_cache
    assert resolve_model_dir(f"testorg/tiny-lm@{SHA}") == hub_cache


def test_quantize_a_hub_id_from_the_cache(hub_cache: Path, tmp_path: Path) -> None:
    out = tmp_path / "q"
    assert main(["quantize", "--model", "testorg/tiny-lm", "--group-size", "32", "-o",
                 str(out)]) == 0
    card = (out / "README.md").read_text()
    assert 'base_model: "testorg/tiny-lm"' in card and 'license: "apache-2.0"' in card
    assert json.loads((out / "quant_log.json").read_text())["source_model"] == str(hub_cache)


@pytest.mark.parametrize("spec", ["testorg/missing", "testorg/tiny-lm@no-such-branch"])
def test_a_model_not_in_the_cache_is_one_line(hub_cache: Path, tmp_path: Path, spec: str,
                                              capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(ModelNotFoundError, match="qcal runs offline"):
        resolve_model_dir(spec)
    assert main(["quantize", "--model", spec, "-o", str(tmp_path / "never")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "hf download" in err[0] and "HF_HUB_OFFLINE=0" in err[0]
    assert not (tmp_path / "never").exists()


def test_the_python_api_takes_a_hub_id(hub_cache: Path) -> None:
    from qcal.api import load

    model = load("testorg/tiny-lm")
    assert model.qcal_checkpoint == str(hub_cache) and model.qcal_tokenizer is not None
