"""Calibration windows, CalibSet manifest/digest, save/load, resolve_calib, random selector."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from qcal.calib import (
    CalibSet,
    CalibSetError,
    NotEnoughDataError,
    build_calib,
    build_windows,
    list_calib_sets,
    resolve_calib,
)
from qcal.calib.manifest import token_statistics, zipf_fit
from qcal.data.corpus import Document
from qcal.model.tiny import stdlib_text

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def tok(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


@pytest.fixture(scope="module")
def docs() -> list[Document]:
    return [Document(t, "en", "stdlib", f"d{i}", "user") for i, t in enumerate(stdlib_text())]


def _doc(text: str, i: int, lang: str | None = "en") -> Document:
    return Document(text, lang, "t", f"x{i}", "user")


def test_long_documents_cut_into_exact_windows(tok: Any) -> None:
    text = " ".join(stdlib_text()[:3])
    ids = tok(text, add_special_tokens=False)["input_ids"]
    pool = build_windows([_doc(text, 0)], tok, 16)
    assert len(pool) == len(ids) // 16
    assert torch.equal(pool.ids[1], torch.tensor(ids[16:32]))
    assert pool.stats["tail_tokens_dropped"] == len(ids) % 16
    assert pool.doc_ids[0] == ("t:x0",)


def test_short_documents_packed_with_eos_per_language(tok: Any) -> None:
    words = ["alpha beta gamma", "delta epsilon", "zeta eta theta iota", "kappa lambda"]
    short = [_doc(w, i, "en" if i % 2 == 0 else "de") for i, w in enumerate(words * 6)]
    toks = [tok(d.text, add_special_tokens=False)["input_ids"] for d in short]
    assert max(len(t) for t in toks) < 24
    pool = build_windows(short, tok, 24)
    eos = tok.eos_token_id
    assert len(pool) > 0 and pool.ids.shape[1] == 24
    assert set(pool.langs) == {"en", "de"}
    # The English stream: documents in order, EOS between them, cut into windows.
    stream: list[int] = []
    for d, t in zip(short, toks, strict=True):
        if d.lang == "en":
            stream += ([eos] if stream else []) + t
    en_rows = [r for r, lang in zip(pool.ids.tolist(), pool.langs, strict=True) if lang == "en"]
    assert sum(en_rows, []) == stream[: 24 * len(en_rows)]
    assert all(len(docs) >= 1 for docs in pool.doc_ids)
    assert pool.stats["short_documents"] == len(short)


def test_too_short_pool_rejected_with_clear_message(tok: Any) -> None:
    short = [_doc("tiny text here", i) for i in range(4)]
    pool = build_windows(short, tok, 64, pack=False)
    assert len(pool) == 0
    with pytest.raises(NotEnoughDataError, match="enable packing"):
        pool.require(2)
    with pytest.raises(NotEnoughDataError, match=r"only 0 windows of 64 tokens.*never padded"):
        build_calib(short, tok, n=2, seqlen=64, seed=0)
    with pytest.raises(NotEnoughDataError, match="fewer samples .--nsamples.*lower --seqlen"):
        build_calib(short, tok, n=2, seqlen=64, seed=0, pack=False)


def test_windows_never_padded(tok: Any, docs: list[Document]) -> None:
    calib = build_calib(docs[:60], tok, n=8, seqlen=32, seed=0)
    pad = tok.pad_token_id
    eos = tok.eos_token_id
    assert calib.input_ids.shape == (8, 32)
    # pad == eos for this tokenizer: EOS appears only between packed documents, never as a run.
    if pad == eos:
        flat = calib.input_ids.reshape(-1)
        assert not bool(((flat[1:] == eos) & (flat[:-1] == eos)).any())


@pytest.mark.parametrize("selector", ["random", "zipf", "ml:en", "mix:uniform"])
def test_seed_determinism(tok: Any, docs: list[Document], selector: str) -> None:
    extra = {"pool_size": 20} if selector == "zipf" else {}
    a = build_calib(docs, tok, n=8, seqlen=32, seed=3, selector=selector, **extra)
    b = build_calib(docs, tok, n=8, seqlen=32, seed=3, selector=selector, **extra)
    c = build_calib(docs, tok, n=8, seqlen=32, seed=4, selector=selector, **extra)
    assert torch.equal(a.input_ids, b.input_ids) and a.digest == b.digest
    assert not torch.equal(a.input_ids, c.input_ids) and a.digest != c.digest


def test_manifest_contents(tok: Any, docs: list[Document]) -> None:
    calib = build_calib(docs, tok, n=6, seqlen=24, seed=0, selector="random", source="stdlib")
    m = json.loads(json.dumps(calib.manifest))  # JSON-serialisable as is
    assert m["selector"] == "random" and m["seed"] == 0 and m["source"] == "stdlib"
    assert m["nsamples"] == 6 and m["seqlen"] == 24 and len(m["samples"]) == 6
    assert all(s["documents"][0].startswith("stdlib:") for s in m["samples"])
    st = m["statistics"]
    assert st["per_language_tokens"] == {"en": 6 * 24}
    assert 0 < st["type_token_ratio"] <= 1 and st["types"] <= st["tokens"]
    assert set(st["zipf"]) == {"exponent", "intercept", "r2"}
    assert m["tokenizer"]["vocab_size"] == len(tok.get_vocab())
    assert len(calib.digest) == 64
    assert set(m["timing"]) == {"windowing_seconds", "selection_seconds", "load_average"}
    assert m["timing"]["windowing_seconds"] >= 0 and m["timing"]["selection_seconds"] >= 0
    assert len(m["timing"]["load_average"]) == 3


def test_zipf_fit_recovers_exponent() -> None:
    counts = [round(1e5 / r**1.2) for r in range(1, 400)]
    fit = zipf_fit(counts)
    assert abs(fit["exponent"] - 1.2) < 0.02 and fit["r2"] > 0.99
    assert np.isnan(zipf_fit([3, 1])["exponent"])


def test_token_statistics_excludes_special_ids() -> None:
    ids = torch.tensor([[5, 5, 0, 7], [7, 8, 0, 9]])
    st = token_statistics(ids, ["en", "de"], special_ids=[0])
    assert st["tokens"] == 6 and st["types"] == 4
    assert st["per_language_tokens"] == {"de": 4, "en": 4}


def test_save_load_round_trip_and_tamper_check(tok: Any, docs: list[Document], tmp_path: Path) -> None:
    calib = build_calib(docs, tok, n=4, seqlen=16, seed=1, selector="zipf")
    out = calib.save(tmp_path / "sets" / "z")
    assert sorted(p.name for p in out.iterdir()) == [".qcal-output.json", "input_ids.safetensors",
                                                     "manifest.json"]
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no temp leftovers
    back = CalibSet.load(out)
    assert torch.equal(back.input_ids, calib.input_ids) and back.manifest == calib.manifest
    rows = list_calib_sets(tmp_path / "sets")
    assert [r["name"] for r in rows] == ["z"] and rows[0]["selector"] == "zipf"
    m = json.loads((out / "manifest.json").read_text())
    m["seed"] = 99
    (out / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(CalibSetError, match="digest"):
        CalibSet.load(out)
    with pytest.raises(CalibSetError, match="no calibration set"):
        CalibSet.load(tmp_path / "missing")


def test_resolve_calib_loads_saved_set_and_checks_shape(tok: Any, docs: list[Document],
                                                         tmp_path: Path) -> None:
    calib = build_calib(docs, tok, n=4, seqlen=16, seed=1)
    out = calib.save(tmp_path / "s")
    got = resolve_calib(str(out), tok, nsamples=4, seqlen=16, seed=0)
    assert got.digest == calib.digest
    with pytest.raises(CalibSetError, match="--seqlen 16"):
        resolve_calib(str(out), tok, nsamples=4, seqlen=32, seed=0)
    with pytest.raises(CalibSetError, match="--nsamples 4"):
        resolve_calib(str(out), tok, nsamples=8, seqlen=16, seed=0)


def test_resolve_calib_refuses_other_tokenizer(tok: Any, docs: list[Document], tmp_path: Path,
                                               default_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    out = build_calib(docs, tok, n=4, seqlen=16, seed=1).save(tmp_path / "s")
    other = AutoTokenizer.from_pretrained(str(default_model_dir))
    with pytest.raises(CalibSetError, match="another tokenizer"):
        resolve_calib(str(out), other, nsamples=4, seqlen=16, seed=0)


def test_resolve_calib_builds_from_text_file(tok: Any, tmp_path: Path) -> None:
    from qcal import data

    if not hasattr(data, "resolve_source"):
        pytest.skip("qcal.data.resolve_source is not available yet")
    path = tmp_path / "corpus.txt"
    path.write_text("\n\n".join(stdlib_text()[:80]), encoding="utf-8")
    calib = resolve_calib(str(path), tok, nsamples=5, seqlen=16, seed=0, selector="zipf")
    assert calib.input_ids.shape == (5, 16) and calib.manifest["selector"] == "zipf"
    assert calib.manifest["source"] == str(path)


def test_random_selector_is_uniform_over_windows(tok: Any, docs: list[Document]) -> None:
    from qcal.calib.random_sel import RandomSelector

    pool = build_windows(docs, tok, 16).subset(range(50))
    picks = np.zeros(len(pool))
    for seed in range(200):
        idx = RandomSelector().select(pool, 10, seed).indices
        assert len(set(idx)) == 10
        picks[idx] += 1
    # 2,000 draws over 50 windows: about 40 each; a biased sampler would leave some far off.
    assert picks.min() > 15 and picks.max() < 70


def test_resolve_calib_by_name_under_calib_sets(tok: Any, docs: list[Document], tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QCAL_CALIB_DIR", str(tmp_path))
    calib = build_calib(docs, tok, n=3, seqlen=16, seed=2, selector="zipf")
    calib.save(tmp_path / "my-set")
    got = resolve_calib("my-set", tok, nsamples=3, seqlen=16, seed=0)
    assert got.digest == calib.digest and got.input_ids.dtype == torch.long
    assert [r["name"] for r in list_calib_sets()] == ["my-set"]
