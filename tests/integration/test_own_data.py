"""Your own calibration data: save_to_disk folders, script-free dataset folders, Parquet,
--text-field, --chat (the model's chat template), and default set names that carry a
content digest so two inputs never share one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qcal.cache import _canonical
from qcal.cli import main
from qcal.data import resolve_source
from qcal.data.sources import CorpusFormatError
from qcal.errors import ConfigError
from qcal.model.tiny import stdlib_text
from qcal.run_config import CalibConfig

pytestmark = pytest.mark.integration
TEXTS = stdlib_text()[:30]


def test_save_to_disk_folders_and_hf_prefix(tmp_path: Path) -> None:
    import datasets

    ds = datasets.Dataset.from_dict({"body": TEXTS, "n": list(range(len(TEXTS)))})
    ds.save_to_disk(str(tmp_path / "plain"))
    datasets.DatasetDict({"train": ds, "test": ds.select(range(2))}).save_to_disk(
        str(tmp_path / "dict"))
    for spec in (str(tmp_path / "plain"), f"hf:{tmp_path / 'plain'}", str(tmp_path / "dict")):
        docs = resolve_source(spec, text_field="body")
        assert [d.text for d in docs] == [t.strip() for t in TEXTS if t.strip()], spec
    with pytest.raises(CorpusFormatError, match='no string field "text".*--text-field'):
        resolve_source(str(tmp_path / "plain"))


def test_parquet_and_script_free_folders(tmp_path: Path) -> None:
    import datasets

    datasets.Dataset.from_dict({"text": TEXTS}).to_parquet(str(tmp_path / "c.parquet"))
    assert len(resolve_source(str(tmp_path / "c.parquet"))) == len(TEXTS)
    folder = tmp_path / "files"
    folder.mkdir()
    (folder / "part.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in TEXTS))
    assert [d.text for d in resolve_source(str(folder))][:2] == [t.strip() for t in TEXTS[:2]]
    (folder / "loader.py").write_text("raise SystemExit('never run')\n")
    with pytest.raises(ConfigError, match="loading script .loader.py.; qcal runs no dataset code"):
        resolve_source(str(folder))


def test_chat_records_render_with_the_chat_template(tiny_model_dir: Path, tmp_path: Path) -> None:
    from qcal.calib.chat import chat_renderer
    from qcal.model.loading import load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    tok.chat_template = None
    with pytest.raises(ConfigError, match="this tokenizer has none; drop --chat"):
        chat_renderer(tok)
    tok.chat_template = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n"
                         "{% endfor %}")
    chats = tmp_path / "chats.jsonl"
    chats.write_text("\n".join(json.dumps({"messages": [
        {"role": "user", "content": f"question {i}"},
        {"role": "assistant", "content": TEXTS[i]}]}) for i in range(3)))
    docs = resolve_source(str(chats), render_chat=chat_renderer(tok))
    assert docs[0].text == f"<|user|>question 0\n<|assistant|>{TEXTS[0]}".strip()
    with pytest.raises(CorpusFormatError, match="or --chat for chat records"):
        resolve_source(str(chats))


def test_default_set_names_never_collide(tiny_model_dir: Path, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setenv("QCAL_CALIB_DIR", str(tmp_path / "sets"))
    (tmp_path / "corpus.txt").write_text("\n\n".join(TEXTS))
    (tmp_path / "corpus.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in TEXTS))
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "corpus.txt").write_text("\n\n".join(reversed(TEXTS)))
    outputs = []
    for source in (tmp_path / "corpus.txt", tmp_path / "corpus.jsonl", tmp_path / "b" / "corpus.txt"):
        assert main(["calib", "build", "--model", str(tiny_model_dir), "--source", str(source),
                     "--n", "2", "--seqlen", "32"]) == 0
        outputs.append(json.loads(capsys.readouterr().out)["output"])
    assert len(set(outputs)) == 3 and all(Path(o).is_dir() for o in outputs)
    # The same input again names the same set (qcal's own output, so it may be rebuilt).
    assert main(["calib", "build", "--model", str(tiny_model_dir), "--source",
                 str(tmp_path / "corpus.txt"), "--n", "2", "--seqlen", "32"]) == 0
    assert json.loads(capsys.readouterr().out)["output"] == outputs[0]


def test_new_calib_fields_keep_old_cache_keys() -> None:
    assert set(_canonical(CalibConfig())) == {"__type__", "selector", "source", "nsamples",
                                             "seqlen", "seed"}
    assert _canonical(CalibConfig(text_field="body"))["text_field"] == "body"
    assert _canonical(CalibConfig(chat=True))["chat"] is True
