"""The model card: Hub base_model and licence from the model folder, model-index in the
Hub's format, the format's own tag and loading recipe."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from qcal.packing.card import base_model_info, model_card

pytestmark = pytest.mark.unit
META = {"method": "gptq", "config": {"scheme": {"bits": 4, "group_size": 64, "sym": False},
                                     "desc_act": True}, "quantize_seconds": 1.0}


def _front(card: str) -> dict:
    return yaml.safe_load(card.split("---")[1])


def _model_dir(tmp_path: Path, provenance: dict) -> Path:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "PROVENANCE.json").write_text(json.dumps(provenance))
    return tmp_path / "m"


def test_provenance_gives_the_hub_id_and_licence(tmp_path: Path) -> None:
    smol = _model_dir(tmp_path, {"original": "HuggingFaceTB/SmolLM2-135M-Instruct (Apache-2.0)"})
    assert base_model_info(smol) == {"hub_id": "HuggingFaceTB/SmolLM2-135M-Instruct",
                                     "license": "apache-2.0"}
    front = _front(model_card(META, "compressed-tensors", str(smol)))
    assert front["base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert front["license"] == "apache-2.0" and front["base_model_relation"] == "quantized"
    assert "compressed-tensors" in front["tags"] and "model-index" not in front


def test_gemma_terms_and_hub_cache_paths(tmp_path: Path) -> None:
    gemma = tmp_path / "g"
    gemma.mkdir()
    (gemma / "PROVENANCE.json").write_text(json.dumps({
        "original": "google/gemma-3-270m: the pretrained base model",
        "licence": "Gemma Terms of Use (ai.google.dev/gemma/terms)"}))
    assert base_model_info(gemma) == {"hub_id": "google/gemma-3-270m", "license": "gemma"}
    snap = tmp_path / "hub" / "models--org--tiny-lm" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "README.md").write_text("---\nlicense: mit\ntags: [x]\n---\n# tiny\n")
    assert base_model_info(snap) == {"hub_id": "org/tiny-lm", "license": "mit"}
    # A plain local folder with nothing to say: the path, and no invented licence.
    bare = tmp_path / "bare"
    bare.mkdir()
    assert base_model_info(bare) == {"hub_id": None, "license": None}
    assert "license" not in _front(model_card(META, "gptq", str(bare)))


def test_model_index_and_an_exports_own_command(tmp_path: Path) -> None:
    evaluation = {"perplexity": {"en": {"quantized": 21.5, "float": 20.1, "tokens": 4096,
                                        "windows": 8}}}
    meta = {**META, "exported_from": "/x/ckpt", "command": "qcal quantize ..."}
    card = model_card(meta, "awq", "org/name", "qcal export --model /x/ckpt --format awq -o y",
                      evaluation)
    front = _front(card)
    (entry,) = front["model-index"]
    (result,) = entry["results"]
    assert result["task"]["type"] == "text-generation"
    assert result["metrics"][0] == {"type": "perplexity", "value": 21.5,
                                    "name": "Perplexity (en, 8 windows)"}
    assert front["base_model"] == "org/name" and "awq" in front["tags"]
    assert "`qcal export --model /x/ckpt --format awq -o y`" in card
    assert "qcal quantize ..." not in card and "Exported to awq from `/x/ckpt`" in card
    assert "qcal export --model <this folder> --format compressed-tensors" in card
