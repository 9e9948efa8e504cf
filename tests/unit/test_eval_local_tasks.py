"""Local next-sentence tasks: sentence splitting, item construction, item files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qcal.eval.local_tasks import (
    LocalTaskError,
    build_nextsent_items,
    load_dataset,
    local_task_names,
    read_items,
    split_sentences,
    tasks_dir,
    write_task,
)

pytestmark = pytest.mark.unit
SHIPPED_LANGS = ("en", "de", "fr", "es", "ru", "ja", "zh")


def _docs(n_sections: int = 6, per_doc: int = 6) -> list[tuple[str, str]]:
    docs = []
    for s in range(n_sections):
        sents = [f"Section {s} tells sentence number {k} about the packaging system here."
                 for k in range(per_doc)]
        docs.append((f"src/en/eval/sect{s}/00000", " ".join(sents)))
    return docs


def test_split_sentences_latin_and_cjk() -> None:
    assert split_sentences("One here. Two there! Three? «Four.» e.g. five. Six", "fr") == [
        "One here.", "Two there!", "Three?", "«Four.» e.g. five.", "Six"]
    assert split_sentences("Первое. Второе.\nТретье", "ru") == ["Первое.", "Второе.", "Третье"]
    assert split_sentences("これは文です。次の文！「引用。」最後", "ja") == [
        "これは文です。", "次の文！", "「引用。」", "最後"]


def test_items_are_true_next_sentences_with_foreign_distractors() -> None:
    docs = _docs()
    items = build_nextsent_items(docs, "en", n_items=12, context_sentences=3, seed=1)
    assert len(items) == 12
    texts = dict(docs)
    for it in items:
        assert len(it["choices"]) == 4 and 0 <= it["gold"] < 4
        gold = it["choices"][it["gold"]]
        # context followed by the gold sentence is a contiguous span of the source document
        assert f"{it['context']} {gold}" in texts[it["doc_id"]]
        section = it["doc_id"].split("/")[3]
        for k, c in enumerate(it["choices"]):
            if k != it["gold"]:
                assert f"Section {section} " not in c  # distractors come from other sections
                assert 1 / 1.35 <= len(c) / len(gold) <= 1.35
    assert {it["gold"] for it in items} != {items[0]["gold"]}  # gold position varies
    assert items == build_nextsent_items(docs, "en", n_items=12, context_sentences=3, seed=1)
    assert items != build_nextsent_items(docs, "en", n_items=12, context_sentences=3, seed=2)


def test_one_section_cannot_supply_distractors() -> None:
    with pytest.raises(LocalTaskError, match="two"):
        build_nextsent_items(_docs(n_sections=1), "en", n_items=3)


def test_write_and_read_task_files(tmp_path: Path) -> None:
    items = build_nextsent_items(_docs(), "en", n_items=5)
    yaml_path = write_task(tmp_path, "t_en", items, "en")
    assert (tmp_path / "loader.py").is_file()
    assert "custom_dataset: !function loader.load" in yaml_path.read_text()
    assert read_items(tmp_path / "t_en.jsonl") == items
    ds = load_dataset("t_en.jsonl", config_source=str(yaml_path))
    assert ds["test"].num_rows == 5 and ds["test"][0]["choices"] == items[0]["choices"]
    assert local_task_names(tmp_path) == ["t_en"]


def test_bad_item_files_fail_clearly(tmp_path: Path) -> None:
    with pytest.raises(LocalTaskError, match="does not exist"):
        read_items(tmp_path / "nope.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(LocalTaskError, match="has no items"):
        read_items(tmp_path / "empty.jsonl")
    (tmp_path / "bad.jsonl").write_text(json.dumps({"context": "x", "choices": ["a"], "gold": 0}))
    with pytest.raises(LocalTaskError, match="item 0"):
        read_items(tmp_path / "bad.jsonl")
    (tmp_path / "broken.jsonl").write_text("{not json\n")
    with pytest.raises(LocalTaskError, match="broken.jsonl:1"):
        read_items(tmp_path / "broken.jsonl")
    with pytest.raises(LocalTaskError, match="has no items"):
        write_task(tmp_path, "none", [], "en")


def test_shipped_tasks_are_complete() -> None:
    names = local_task_names()
    for lang in SHIPPED_LANGS:
        assert f"qcal_nextsent_{lang}" in names
        items = read_items(tasks_dir() / f"qcal_nextsent_{lang}.jsonl")
        assert 150 <= len(items) <= 200
        assert all(len(it["choices"]) == 4 for it in items)
    assert "qcal_nextsent" in names  # the group over all languages
    manifest = json.loads((tasks_dir() / "manifest.json").read_text())
    assert manifest["split"] == "eval"


def test_shipped_items_come_from_held_out_text_only() -> None:
    """Rebuilding from the corpus reproduces the shipped file; no choice is calibration text."""
    from qcal.data import CorpusNotFoundError, load_documents

    try:
        evals = load_documents("debian-handbook", ["en"], split="eval")
        calib = load_documents("debian-handbook", ["en"], split="calib")
    except CorpusNotFoundError as err:
        pytest.skip(f"debian-handbook corpus not provisioned ({err})")
    rebuilt = build_nextsent_items([(d.doc_id, d.text) for d in evals], "en", 200)
    assert rebuilt == read_items(tasks_dir() / "qcal_nextsent_en.jsonl")
    calib_text = "\n".join(d.text for d in calib)
    leaked = [c for it in rebuilt for c in it["choices"] if c in calib_text]
    assert not leaked


def test_the_builder_command_rebuilds_the_shipped_task_directory(tmp_path: Path) -> None:
    """`python -m qcal.provision.local_tasks` (the command the shipped files cite) writes
    exactly the shipped files."""
    from qcal.data import CorpusNotFoundError, load_documents
    from qcal.provision.local_tasks import main

    try:
        load_documents("debian-handbook", ["en"], split="eval")
    except CorpusNotFoundError as err:
        pytest.skip(f"debian-handbook corpus not provisioned ({err})")
    assert main(["--out", str(tmp_path)]) == 0
    shipped = {p.name: p.read_bytes() for p in tasks_dir().iterdir() if p.is_file()}
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == shipped
