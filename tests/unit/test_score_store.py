"""The score store keeps scores across runs of one model, and only of that model."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from qcal.errors import ConfigError
from qcal.eval.score_store import ScoreStore, model_identity, request_key

pytestmark = pytest.mark.unit
MODEL = {"model": "abc", "device": "cpu", "dtype": "torch.float32"}


def test_scores_survive_a_new_store_on_the_same_file(tmp_path: Path) -> None:
    path = tmp_path / "scores" / "cell.jsonl"
    store = ScoreStore(path, MODEL)
    key = request_key([1, 2, 3], [4])
    store.add(key, (-1.2345678901234567, True))
    store.add(request_key([1, 2, 3], [5, 6]), (-7.5, False))
    assert ScoreStore(path, MODEL).get(key) is None  # added, not flushed: not on disk yet
    store.flush()
    again = ScoreStore(path, MODEL)
    assert again.get(key) == (-1.2345678901234567, True)  # floats round-trip exactly
    assert again.get(request_key([1, 2, 3], [5, 6])) == (-7.5, False)
    assert again.get(request_key([1, 2], [3, 4])) is None  # keys tell context from continuation


def test_another_model_starts_the_store_over(tmp_path: Path) -> None:
    path = tmp_path / "cell.jsonl"
    store = ScoreStore(path, MODEL)
    store.add("k", (-1.0, False))
    store.flush()
    other = ScoreStore(path, {**MODEL, "model": "rebuilt"})
    assert other.get("k") is None
    assert ScoreStore(path, MODEL).get("k") is None  # the old scores are gone for good


def test_a_line_cut_short_by_a_kill_is_ignored_and_appending_goes_on(tmp_path: Path) -> None:
    path = tmp_path / "cell.jsonl"
    store = ScoreStore(path, MODEL)
    store.add("a", (-1.0, True))
    store.flush()
    with path.open("a") as f:
        f.write('["b", -2.0, fa')  # killed mid-write
    resumed = ScoreStore(path, MODEL)
    assert resumed.get("a") == (-1.0, True) and resumed.get("b") is None
    resumed.add("c", (-3.0, False))
    resumed.flush()
    assert ScoreStore(path, MODEL).get("c") == (-3.0, False)


def test_a_file_qcal_did_not_write_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "notes.jsonl"
    path.write_text("my own notes\n")
    with pytest.raises(ConfigError, match="not a qcal score store"):
        ScoreStore(path, MODEL)
    assert path.read_text() == "my own notes\n"


def test_model_identity_changes_when_a_file_is_rewritten(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"x" * 10)
    (tmp_path / "config.json").write_text("{}")
    first = model_identity(tmp_path)
    assert model_identity(tmp_path) == first
    (tmp_path / "model.safetensors").write_bytes(b"y" * 11)
    assert model_identity(tmp_path) != first


def test_model_identity_is_the_content_not_the_build_notes(tmp_path: Path) -> None:
    """The same weights rebuilt elsewhere (new mtimes, other timings in quant_log.json)
    keep their identity, so a committed score store resumes on a fresh machine; a changed
    byte of the weights or the tokenizer does not."""
    (tmp_path / "model.safetensors").write_bytes(b"x" * 10)
    (tmp_path / "tokenizer.json").write_text("{}")
    (tmp_path / "quant_log.json").write_text('{"quantize_seconds": 1.0}')
    first = model_identity(tmp_path)
    os.utime(tmp_path / "model.safetensors", (1, 1))
    (tmp_path / "quant_log.json").write_text('{"quantize_seconds": 2.5}')
    (tmp_path / "README.md").write_text("card")
    assert model_identity(tmp_path) == first
    (tmp_path / "model.safetensors").write_bytes(b"x" * 9 + b"z")
    assert model_identity(tmp_path) != first
    (tmp_path / "model.safetensors").write_bytes(b"x" * 10)
    (tmp_path / "tokenizer.json").write_text('{"a": 1}')
    assert model_identity(tmp_path) != first
