"""Offline text corpora: language identification, file loading, handbook extraction,
and (when provisioned) the real corpora: split disjointness and volumes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from qcal.data import (
    CorpusFormatError,
    CorpusNotFoundError,
    Document,
    EmptyCorpusError,
    available_languages,
    default_data_dir,
    detect_language,
    eval_text,
    is_language,
    load_documents,
    load_text_file,
    resolve_source,
)
from qcal.data.corpus import corpus_dir, write_jsonl
from qcal.data.sources import wiki_split
from qcal.provision import handbook as hb

pytestmark = pytest.mark.unit

SENTENCES = {
    "en": "The package manager downloads the files from the repository and installs them.",
    "de": "Der Paketmanager lädt die Dateien aus dem Depot herunter und installiert sie.",
    "fr": "Le gestionnaire de paquets télécharge les fichiers depuis le dépôt et les installe.",
    "es": "El gestor de paquetes descarga los archivos del repositorio y los instala.",
    "it": "Il gestore dei pacchetti scarica i file dal repository e li installa sul sistema.",
    "pt": "O gerenciador de pacotes baixa os arquivos do repositório e os instala no sistema.",
    "nl": "De pakketbeheerder downloadt de bestanden uit de repository en installeert ze op het "
    "systeem.",
    "sv": "Pakethanteraren hämtar filerna från förrådet och installerar dem på systemet.",
    "nb": "Pakkebehandleren laster ned filene fra arkivet og installerer dem på systemet.",
    "pl": "Menedżer pakietów pobiera pliki z repozytorium i instaluje je w systemie.",
    "ru": "Менеджер пакетов загружает файлы из репозитория и устанавливает их в систему.",
    "ar": "يقوم مدير الحزم بتنزيل الملفات من المستودع وتثبيتها على النظام.",
    "fa": "مدیر بسته پرونده‌ها را از مخزن بارگیری می‌کند و آنها را روی سیستم نصب می‌کند.",
    "ja": "パッケージマネージャはファイルをダウンロードし、システムにインストールします。",
    "zh": "软件包管理器从仓库下载文件并将它们安装到系统中。",
    "zh-tw": "軟體套件管理器從倉庫下載檔案並將它們安裝到系統中。",
    "ko": "패키지 관리자는 저장소에서 파일을 다운로드하여 시스템에 설치합니다.",
    "el": "Ο διαχειριστής πακέτων κατεβάζει τα αρχεία από το αποθετήριο.",
}


@pytest.mark.parametrize("lang", sorted(SENTENCES))
def test_detect_language_known_sentences(lang: str) -> None:
    assert detect_language(SENTENCES[lang]) == lang
    assert is_language(SENTENCES[lang], lang)


def test_detect_language_no_evidence() -> None:
    for text in ["", "   ", "12345 67890", "apt-get install foo", "x"]:
        assert detect_language(text) is None


def test_is_language_tags_and_script_mix() -> None:
    assert is_language(SENTENCES["pt"], "pt-BR")
    assert is_language(SENTENCES["zh"], "zh-CN")
    assert is_language(SENTENCES["zh-tw"], "zh-TW")
    assert not is_language(SENTENCES["zh"], "zh-TW")
    assert not is_language(SENTENCES["en"], "de")
    # A Chinese sentence around a command is still Chinese (a CJK character weighs 3x).
    assert detect_language("使用 apt-get install 命令可以安装软件包及其依赖。") == "zh"


# --- user files ----------------------------------------------------------------------


def test_load_text_file_txt(tmp_path: Path) -> None:
    path = tmp_path / "mine.txt"
    path.write_text(f"{SENTENCES['en']}\nSecond line.\n\n  \n{SENTENCES['de']}\n\n\n", "utf-8")
    docs = load_text_file(path)
    assert [d.lang for d in docs] == ["en", "de"]
    assert docs[0].text.endswith("Second line.")
    assert all(d.split == "user" for d in docs)
    assert len({d.doc_id for d in docs}) == 2
    assert {d.lang for d in load_text_file(path, lang="fr")} == {"fr"}  # explicit tag wins


def test_load_text_file_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "mine.jsonl"
    rows = [{"text": SENTENCES["fr"]}, {"text": "short", "lang": "it"}, {"text": "  "}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n", "utf-8")
    docs = load_text_file(path)
    assert [(d.lang, d.text) for d in docs] == [("fr", SENTENCES["fr"]), ("it", "short")]
    assert [d.lang for d in resolve_source(str(path), langs=["it"])] == ["it"]


@pytest.mark.parametrize("name,content", [("e.txt", ""), ("b.txt", "\n \n"), ("e.jsonl", "")])
def test_load_text_file_empty_is_clear_error(tmp_path: Path, name: str, content: str) -> None:
    path = tmp_path / name
    path.write_text(content, "utf-8")
    with pytest.raises(EmptyCorpusError, match=name):
        load_text_file(path)


def test_load_text_file_bad_inputs(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{not json\n', "utf-8")
    with pytest.raises(CorpusFormatError, match="bad.jsonl:2"):
        load_text_file(bad)
    nofield = tmp_path / "nofield.jsonl"
    nofield.write_text('{"content": "x"}\n', "utf-8")
    with pytest.raises(CorpusFormatError, match='"text"'):
        load_text_file(nofield)
    other = tmp_path / "x.csv"
    other.write_text("a,b\n", "utf-8")
    with pytest.raises(CorpusFormatError, match="unsupported"):
        load_text_file(other)
    with pytest.raises(CorpusNotFoundError, match="missing.txt"):
        load_text_file(tmp_path / "missing.txt")
    with pytest.raises(CorpusNotFoundError, match="unknown text source"):
        resolve_source("no-such-corpus-or-file")
    with pytest.raises(CorpusNotFoundError, match="did you mean 'debian-handbook'"):
        resolve_source("debian-handbok")


def test_hf_dataset_offline_error_is_clear() -> None:
    # A subprocess, so the offline switches are read when `datasets` is first imported.
    code = (
        "from qcal.data import load_hf_dataset, CorpusLoadError\n"
        "try:\n    load_hf_dataset('qcal-test/no-such-dataset', limit=2)\n"
        "except CorpusLoadError as e:\n    print('CLEAR:', e)\n"
    )
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert "CLEAR:" in out.stdout and "debian-handbook" in out.stdout, out.stderr[-2000:]


# --- packaged-corpus plumbing on a fake data dir ----------------------------------------


def test_default_data_dir_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("QCAL_DATA_DIR", raising=False)
    assert default_data_dir() == Path(hb.__file__).resolve().parents[2] / "data"
    monkeypatch.setenv("QCAL_DATA_DIR", str(tmp_path))
    assert default_data_dir() == tmp_path


def test_missing_corpus_names_path_and_fix(tmp_path: Path) -> None:
    with pytest.raises(CorpusNotFoundError, match="qcal provision") as err:
        load_documents("debian-handbook", ["en"], data_dir=tmp_path)
    assert str(tmp_path) in str(err.value)


def test_roundtrip_fake_corpus(tmp_path: Path) -> None:
    docs = [
        Document("calib text one", "xx", "fake", "fake/xx/calib/0", "calib"),
        Document("eval text one", "xx", "fake", "fake/xx/eval/0", "eval"),
        Document("eval text two", "xx", "fake", "fake/xx/eval/1", "eval"),
    ]
    write_jsonl(corpus_dir("fake", tmp_path) / "xx.jsonl", docs)
    assert available_languages("fake", data_dir=tmp_path) == ["xx"]
    assert load_documents("fake", data_dir=tmp_path) == docs[:1]
    assert load_documents("fake", "xx", split=None, data_dir=tmp_path) == docs
    assert eval_text("xx", "fake", data_dir=tmp_path) == "eval text one\n\neval text two"
    with pytest.raises(CorpusNotFoundError, match="available: xx"):
        load_documents("fake", ["yy"], data_dir=tmp_path)
    assert not list((tmp_path / "corpora" / "fake").glob("*.tmp"))  # atomic write cleaned up


# --- handbook extraction on a synthetic page ------------------------------------------

PAGE = """<?xml version="1.0" encoding="UTF-8"?>
<html xmlns="http://www.w3.org/1999/xhtml"><head><title>t</title>
<link rel="up" href="chap.html"/></head><body>
<div class="section"><div class="para">Use <code class="command">apt-get</code> to install
 packages, which is the usual way to add software to a Debian system.
 <div class="url">→ https://example.org/</div></div>
<div class="para"><code class="command">apt-get install --reinstall foo bar baz</code></div>
<div class="sidebar"><div class="para">A sidebar explains one term in enough words.</div>
</div></div></body></html>"""


def test_extract_paragraphs_and_prose_filter(tmp_path: Path) -> None:
    path = tmp_path / "sect.x.html"
    path.write_text(PAGE, "utf-8")
    paras = hb.extract_paragraphs(path)
    assert len(paras) == 3
    assert paras[0].text.startswith("Use apt-get to install packages")
    assert "https" not in paras[0].text and "apt-get" not in paras[0].prose
    assert [hb.is_prose(p) for p in paras] == [True, False, True]
    assert paras[0].container != paras[2].container  # the sidebar is its own group


def test_lang_codes() -> None:
    pairs = {"en-US": "en", "de-DE": "de", "zh-CN": "zh", "zh-TW": "zh-tw", "pt-BR": "pt"}
    assert {d: hb.lang_code(d) for d in pairs} == pairs


def test_wiki_split_rule_is_fixed() -> None:
    assert {wiki_split("Albert Einstein"), wiki_split("Paris")} <= {"calib", "eval"}
    share = sum(wiki_split(f"title {i}") == "eval" for i in range(2000)) / 2000
    assert 0.12 < share < 0.18


# --- the provisioned corpora (skipped until `qcal provision`) -------

HANDBOOK = corpus_dir("debian-handbook")
WIKI = corpus_dir("wiki-summaries")
needs_handbook = pytest.mark.skipif(
    not (HANDBOOK / "stats.json").is_file(),
    reason=f"debian-handbook not provisioned at {HANDBOOK}: run `qcal provision`",
)


@needs_handbook
def test_handbook_languages_and_volume() -> None:
    langs = available_languages()
    assert len(langs) >= 8
    assert {"en", "de", "fr", "es", "it", "pt", "ru", "ja", "zh", "ar"} <= set(langs)
    stats = json.loads((HANDBOOK / "stats.json").read_text("utf-8"))
    assert set(stats["kept_languages"]) == set(langs)
    en = stats["languages"]["en"]
    assert en["calib"]["documents"] >= 1300
    share = en["eval"]["chars"] / (en["eval"]["chars"] + en["calib"]["chars"])
    assert 0.12 < share < 0.25
    de = eval_text("de")
    assert len(de) > 50_000 and is_language(de[:2000], "de")


@needs_handbook
def test_handbook_splits_are_disjoint() -> None:
    docs = load_documents(split=None)
    by_split: dict[str, set[str]] = defaultdict(set)
    paras: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for d in docs:
        assert d.split in ("calib", "eval")
        assert d.doc_id.startswith(f"debian-handbook/{d.lang}/{d.split}/")
        by_split[d.split].add(d.doc_id)
        paras[d.split].update((d.lang, p) for p in d.text.split("\n"))
    assert not by_split["calib"] & by_split["eval"]
    assert not paras["calib"] & paras["eval"]  # no paragraph text in both splits
    # A held-out chapter is held out in every language.
    held = {Path(f).stem for f in hb.HELD_OUT_CHAPTERS}
    assert not any(d.doc_id.split("/")[3] in held for d in docs if d.split == "calib")


@needs_handbook
def test_english_calibration_pool_size() -> None:
    n = len(load_documents("debian-handbook", "en"))
    if (WIKI / "en.jsonl").is_file():
        n += len(load_documents("wiki-summaries", "en"))
        wiki = load_documents("wiki-summaries", "en", split=None)
        splits = {d.split for d in wiki}
        ids = defaultdict(set)
        for d in wiki:
            ids[d.split].add(d.text)
        assert splits == {"calib", "eval"} and not ids["calib"] & ids["eval"]
    else:
        pytest.skip("wiki-summaries not provisioned; the handbook alone has ~1,350 docs")
    assert n >= 2000
