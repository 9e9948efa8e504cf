"""zipf, multilingual and perplexity selectors: objectives, quotas, ordering, selector strings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from qcal.calib import NotEnoughDataError, build_calib, build_windows, parse_selector
from qcal.calib.build import selector_spec
from qcal.calib.multilingual import STUDY_SETTINGS, MultilingualSelector, quota_counts
from qcal.calib.perplexity import PerplexitySelector, rank_by_score, sequence_perplexity
from qcal.calib.windows import WindowPool
from qcal.calib.zipf import concept_strings, greedy_coverage, inverse_frequency_top
from qcal.data.corpus import Document
from qcal.errors import ConfigError
from qcal.model.tiny import stdlib_text

pytestmark = pytest.mark.unit

DE = ("Der Paketmanager lädt die Dateien aus dem Depot herunter und installiert sie auf dem "
      "System, wenn der Benutzer es wünscht und die Abhängigkeiten erfüllt sind.")
FR = ("Le gestionnaire de paquets télécharge les fichiers depuis le dépôt et les installe sur "
      "le système quand l'utilisateur le demande et que les dépendances sont satisfaites.")


@pytest.fixture(scope="module")
def tok(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


def _distinct_types(ids: torch.Tensor) -> int:
    return int(torch.unique(ids).numel())


# ---- zipf -----------------------------------------------------------------------------------

def test_greedy_coverage_known_answer() -> None:
    m = np.array([[0, 1, 2, 3], [0, 1, 2, -1], [4, 5, -1, -1], [4, 4, 4, 6], [0, 0, 0, 0]])
    # Step 1: row 0 (4 new). Step 2: rows 2 and 3 both add 2 new; row 2 has 2 total,
    # row 3 has 2 total (duplicates count once) -> tie kept by the earlier draw.
    idx, info = greedy_coverage(m, 2, seed=0, pool_size=10)
    assert idx == [0, 2]
    assert info["covered_concepts"] == 6 and info["pool_concepts"] == 7
    # Ties on new concepts go to more concepts in total: after row 2, rows 0 and 1 both add
    # 2 new concepts, row 1 has 4 in total and wins although drawn later.
    m2 = np.array([[6, 7, -1, -1, -1, -1], [6, 8, 0, 1, -1, -1], [0, 1, 2, 3, 4, 5]])
    assert greedy_coverage(m2, 2, seed=0, pool_size=10)[0] == [2, 1]


def test_greedy_coverage_samples_pool_under_seed() -> None:
    rng = np.random.default_rng(0)
    m = rng.integers(0, 300, size=(500, 16))
    a, _ = greedy_coverage(m, 20, seed=1, pool_size=30)
    assert a == greedy_coverage(m, 20, seed=1, pool_size=30)[0]
    assert a != greedy_coverage(m, 20, seed=2, pool_size=30)[0]
    assert len(set(a)) == 20


def test_inverse_frequency_prefers_rare_concepts() -> None:
    m = np.array([[0, 0, 0, 0], [0, 1, 0, 1], [2, 3, 4, 5], [0, 0, 1, 1]])
    idx, _ = inverse_frequency_top(m, 2)
    assert idx == [2, 1]


def test_concepts_normalise_case_space_and_markers(tok: Any) -> None:
    ids = [tok(w, add_special_tokens=False)["input_ids"] for w in (" the", " The", " and")]
    assert all(len(i) == 1 for i in ids)
    concepts = concept_strings(tok, [i[0] for i in ids] + [tok.eos_token_id])
    assert concepts == ["the", "the", "and", None]  # special tokens have no concept


def test_zipf_beats_random_on_distinct_types(tok: Any) -> None:
    docs = [Document(t, "en", "stdlib", str(i), "user") for i, t in enumerate(stdlib_text())]
    z = build_calib(docs, tok, n=16, seqlen=32, seed=0, selector="zipf")
    for seed in range(5):
        r = build_calib(docs, tok, n=16, seqlen=32, seed=seed, selector="random")
        assert z.input_ids.numel() == r.input_ids.numel()
        assert _distinct_types(z.input_ids) > _distinct_types(r.input_ids)
    assert z.manifest["statistics"]["types"] > r.manifest["statistics"]["types"]


def test_zipf_beats_random_on_real_corpus(default_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    from qcal.data import load_documents
    from qcal.data.corpus import CorpusNotFoundError

    try:
        docs = load_documents("debian-handbook", ["en"], split="calib")
    except CorpusNotFoundError as err:
        pytest.skip(f"debian-handbook corpus not provisioned ({err})")
    tok = AutoTokenizer.from_pretrained(str(default_model_dir))
    z = build_calib(docs, tok, n=32, seqlen=128, seed=0, selector="zipf")
    for seed in range(3):
        r = build_calib(docs, tok, n=32, seqlen=128, seed=seed, selector="random")
        assert _distinct_types(z.input_ids) > _distinct_types(r.input_ids)


# ---- multilingual ---------------------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 7, 10, 64, 128, 129])
def test_quota_counts_exact(n: int) -> None:
    for weights in ([1, 1, 1], [0.5, 0.25, 0.25], [0.7, 0.2, 0.1], [3, 0, 1]):
        q = quota_counts(["en", "de", "ja"], weights, n)
        assert sum(q.values()) == n
        ideal = [w / sum(weights) * n for w in weights]
        assert all(abs(q[k] - i) < 1 for k, i in zip(["en", "de", "ja"], ideal, strict=True))
    with pytest.raises(ConfigError, match="weights"):
        quota_counts(["en", "de"], [1, -1], 4)


@pytest.fixture(scope="module")
def ml_docs() -> list[Document]:
    en = [Document(t, "en", "s", f"en{i}", "user") for i, t in enumerate(stdlib_text()[:80])]
    de = [Document(f"{DE} ({i})", "de", "s", f"de{i}", "user") for i in range(60)]
    # Untagged French: language-ID must tag it.
    fr = [Document(f"{FR} ({i})", None, "s", f"fr{i}", "user") for i in range(60)]
    return en + de + fr


@pytest.mark.parametrize("spec, expected", [
    ("ml:de", {"de": 12}),
    ("mix:uniform", {"de": 4, "en": 4, "fr": 4}),
    ("mix:en=0.5,de=0.25,fr=0.25", {"en": 6, "de": 3, "fr": 3}),
    ("mix:en=0.6,fr=0.4", {"en": 7, "fr": 5}),
])
def test_multilingual_quotas_honoured(tok: Any, ml_docs: list[Document], spec: str,
                                      expected: dict[str, int]) -> None:
    calib = build_calib(ml_docs, tok, n=12, seqlen=24, seed=0, selector=spec)
    langs = [s["lang"] for s in calib.manifest["samples"]]
    assert {k: langs.count(k) for k in set(langs)} == expected
    assert calib.manifest["selection"]["quotas"] == expected
    assert calib.manifest["pool"]["language_id_documents"] == 60


def test_multilingual_missing_language_is_an_error(tok: Any, ml_docs: list[Document]) -> None:
    with pytest.raises(NotEnoughDataError, match="ja: 0 of 6"):
        build_calib(ml_docs, tok, n=12, seqlen=24, seed=0, selector="mix:en=0.5,ja=0.5")


def test_selector_strings() -> None:
    assert isinstance(parse_selector("ml:de"), MultilingualSelector)
    assert parse_selector("ml:de").langs == ("de",)
    assert parse_selector("mix:pt-BR=1,zh-CN=1,zh-TW=1").langs == ("pt", "zh", "zh-tw")
    assert parse_selector("perplexity:high").mode == "high"
    assert parse_selector("ppl:middle").mode == "middle"
    assert parse_selector("zipf:invfreq").objective == "invfreq"
    assert parse_selector("mix:study5").langs == ("en", "de", "ru", "zh", "ar")
    assert len(STUDY_SETTINGS) == 8
    for spec in STUDY_SETTINGS.values():
        parse_selector(spec)
    with pytest.raises(ConfigError, match="known: multilingual, perplexity, random, zipf"):
        parse_selector("nope")
    with pytest.raises(ConfigError, match="lang=weight"):
        parse_selector("mix:en0.5")
    with pytest.raises(ConfigError, match="takes no option"):
        parse_selector("random", mode="low")


def test_selector_strings_carry_options_and_round_trip() -> None:
    sel = parse_selector("perplexity:high,max_candidates=256,score_tokens=128")
    assert (sel.mode, sel.max_candidates, sel.score_tokens) == ("high", 256, 128)
    assert parse_selector("zipf:pool_size=64").pool_size == 64
    assert parse_selector("perplexity:score_tokens=none").score_tokens is None
    assert selector_spec("random") == "random" and selector_spec("zipf", {}) == "zipf"
    text = selector_spec("perplexity", {"score_tokens": 128, "max_candidates": 256})
    assert text == "perplexity:max_candidates=256,score_tokens=128"  # sorted: one cache key
    assert parse_selector(text) == PerplexitySelector(max_candidates=256, score_tokens=128)
    assert selector_spec("zipf:invfreq", {"pool_size": 8}) == "zipf:invfreq,pool_size=8"
    with pytest.raises(ConfigError, match="must be an integer"):
        parse_selector("zipf:pool_size=many")
    with pytest.raises(ConfigError, match="must be an integer"):
        selector_spec("perplexity", {"max_candidates": 2.5})
    with pytest.raises(ConfigError, match=r"takes no option\(s\) \['depth'\]"):
        selector_spec("zipf", {"depth": 3})
    with pytest.raises(ConfigError, match="takes no ':' argument"):
        parse_selector("random:fast")
    with pytest.raises(ConfigError, match="in its own string"):
        selector_spec("mix:study5", {"pool_size": 3})


# ---- perplexity -----------------------------------------------------------------------------

class _FavoursZero(nn.Module):
    """Predicts token 0 with high probability everywhere: PPL falls with the share of zeros."""

    def __init__(self, vocab: int = 8) -> None:
        super().__init__()
        self.vocab = vocab
        self.bias = nn.Parameter(torch.zeros(()))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                use_cache: bool = True) -> Any:  # as a causal LM takes them
        logits = torch.zeros(*input_ids.shape, self.vocab) + self.bias
        logits[..., 0] = 4.0
        return type("Out", (), {"logits": logits})()


def _hand_pool(tok: Any) -> WindowPool:
    # Window k has k zeros among its 9 predicted tokens: PPL strictly decreasing in k.
    rows = [[1] + [0] * k + [3] * (9 - k) for k in range(10)]
    order = [3, 7, 0, 9, 5, 1, 8, 2, 6, 4]
    ids = torch.tensor([rows[k] for k in order])
    return WindowPool(ids, ["en"] * 10, [(f"d{k}",) for k in order], 10, tok)


@pytest.mark.parametrize("mode, zeros", [("low", [9, 8, 7]), ("high", [0, 1, 2]),
                                         ("middle", [4, 5, 3])])
def test_perplexity_selects_by_mode(tok: Any, mode: str, zeros: list[int]) -> None:
    pool = _hand_pool(tok)
    sel = PerplexitySelector(mode=mode, model=_FavoursZero(), batch_size=3, progress=False)
    got = sel.select(pool, 3, seed=0)
    picked = [int((pool.ids[i, 1:] == 0).sum()) for i in got.indices]
    assert sorted(picked) == sorted(zeros)
    assert got.info["scored"] == 10
    assert got.info["reference_load_seconds"] is None  # given a model: nothing loaded


def test_sequence_perplexity_masks_padding() -> None:
    model = _FavoursZero()
    a = torch.tensor([[1, 0, 0, 3, 0]])
    b = torch.tensor([[2, 3, 0]])
    padded = torch.tensor([[1, 0, 0, 3, 0], [2, 3, 0, 7, 7]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    both = sequence_perplexity(model, padded, mask, batch_size=2)
    assert torch.allclose(both[0], sequence_perplexity(model, a)[0])
    assert torch.allclose(both[1], sequence_perplexity(model, b)[0])
    unmasked = sequence_perplexity(model, padded)
    assert not torch.allclose(unmasked[1], both[1])


def test_rank_by_score_ties_and_middle() -> None:
    s = torch.tensor([5.0, 1.0, 1.0, 9.0, 3.0])
    assert rank_by_score(s, 2, "low") == [1, 2]
    assert rank_by_score(s, 2, "high") == [3, 0]
    assert rank_by_score(s, 1, "middle") == [4]
    with pytest.raises(ConfigError, match="mode"):
        rank_by_score(s, 1, "median")


def test_perplexity_max_candidates_subsamples(tok: Any) -> None:
    pool = _hand_pool(tok)
    sel = PerplexitySelector(model=_FavoursZero(), max_candidates=5, progress=False)
    a = sel.select(pool, 2, seed=0)
    assert a.info["scored"] == 5 and a.indices == sel.select(pool, 2, seed=0).indices
    with pytest.raises(ConfigError, match="below n"):
        sel.select(pool, 6, seed=0)


def test_windows_pool_for_perplexity_on_tiny_model(tok: Any, tiny_model_dir: Path) -> None:
    docs = [Document(t, "en", "s", str(i), "user") for i, t in enumerate(stdlib_text()[:40])]
    pool = build_windows(docs, tok, 16)
    # No model given: the reference model is loaded from the tokenizer's directory.
    got = PerplexitySelector(mode="high", batch_size=16, progress=False).select(pool, 4, seed=0)
    assert len(set(got.indices)) == 4
    assert got.info["selected_ppl"]["min"] >= got.info["pool_ppl"]["median"]
    assert got.info["reference_load_seconds"] > 0  # the load is timed apart from scoring
