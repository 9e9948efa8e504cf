"""Calibration diagnostics on cases with known answers: 13-gram leakage shares, MinHash
near-duplicates, input-statistics mismatch and the predicted damage of a set (1 when the
set's Hessian is the target's)."""

from __future__ import annotations

import pytest
import torch

from qcal.calib.diagnose import compare_inputs, near_duplicates, predicted_damage
from qcal.calib.leakage import FLAG_SHARE, ngram_hashes, overlap, words
from qcal.config import GPTQConfig, QuantScheme

pytestmark = pytest.mark.unit

TEXT = ("Debian provides more than a pure OS: it comes with over fifty thousand packages, "
        "precompiled software bundled up in a nice format for easy installation on your "
        "machine, a package manager, and utilities that make it possible to manage them.")


def test_words_and_ngrams() -> None:
    assert words("Hello, World! 42x") == ["hello", "world", "42x"]
    assert words("日本語") == ["日", "本", "語"]  # one word per CJK character
    assert len(ngram_hashes(TEXT)) == len(words(TEXT)) - 12
    assert ngram_hashes("too short to hold one") == set()


def test_overlap_known_shares() -> None:
    other = "An entirely different sentence that shares nothing with the handbook at all, " * 3
    half = " ".join(words(TEXT)[: len(words(TEXT)) // 2])
    report = overlap([TEXT], {"same": [TEXT], "other": [other], "half": [half + " " + other]})
    assert report["same"]["share"] == 1.0 and report["same"]["flagged"]
    assert report["other"]["shared"] == 0 and not report["other"]["flagged"]
    half_grams = len(words(half)) - 12
    assert report["half"]["shared"] == half_grams
    assert report["half"]["share"] == pytest.approx(half_grams / report["half"]["ngrams"])
    assert FLAG_SHARE == 0.01


def test_near_duplicates() -> None:
    long = " ".join(f"word{i}" for i in range(300))
    edited = long.replace("word150", "changed")  # one word of 300: Jaccard ~0.97
    pairs = near_duplicates([long, " ".join(f"other{i}" for i in range(300)), edited, long])
    assert [0, 3] in pairs and [0, 2] in pairs and [2, 3] in pairs
    assert not any(1 in p for p in pairs)


def _hessian(seed: int, scale: torch.Tensor | None = None) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(2000, 64, generator=gen)
    if scale is not None:
        x = x * scale
    return 2 * x.T @ x / x.shape[0]


def test_identical_statistics_are_no_mismatch_and_no_damage() -> None:
    h = _hessian(0)
    assert compare_inputs(h, h) == {"under_excited_top_channels": 0.0,
                                    "eigenspace_overlap": pytest.approx(1.0)}
    w = torch.randn(32, 64, generator=torch.Generator().manual_seed(1))
    cfg = GPTQConfig(QuantScheme(3, 32))
    assert predicted_damage(w, h, h, cfg) == pytest.approx(1.0)


def _mixed(seed: int, mix_seed: int) -> torch.Tensor:
    """The Hessian of inputs with correlated channels (a mixing matrix per `mix_seed`)."""
    mix = torch.randn(64, 64, generator=torch.Generator().manual_seed(mix_seed)) / 8 + torch.eye(64)
    x = torch.randn(2000, 64, generator=torch.Generator().manual_seed(seed)) @ mix
    return 2 * x.T @ x / x.shape[0]


def test_a_set_missing_the_targets_loud_channels_is_flagged() -> None:
    loud = torch.ones(64)
    loud[:4] = 8.0  # the target's high-energy channels
    quiet = torch.ones(64)
    quiet[:4] = 0.5  # the set barely excites them
    target = _hessian(2, loud)
    assert compare_inputs(_hessian(3, quiet), target)["under_excited_top_channels"] == 1.0
    assert compare_inputs(_hessian(4, loud), target)["under_excited_top_channels"] == 0.0


def test_a_set_of_other_correlations_predicts_more_damage() -> None:
    """GPTQ's error feedback follows the Hessian's correlations: a set whose inputs
    correlate differently from the target's pushes errors where the target is sensitive."""
    target = _mixed(2, mix_seed=100)
    w = torch.randn(32, 64, generator=torch.Generator().manual_seed(5))
    cfg = GPTQConfig(QuantScheme(3, 32))
    same, other = (predicted_damage(w, _mixed(3, m), target, cfg) for m in (100, 200))
    assert 1.0 <= same < 1.3 < 2.0 < other
    assert compare_inputs(_mixed(3, 100), target)["eigenspace_overlap"] > \
        compare_inputs(_mixed(3, 200), target)["eigenspace_overlap"]


def test_rank_correlation_known_answers() -> None:
    from qcal.eval.stats import rank_correlation

    same = rank_correlation([1, 2, 3, 4, 5, 6], [10, 20, 30, 40, 50, 60], n_boot=200)
    assert same["rho"] == pytest.approx(1.0) and same["ci"][0] == pytest.approx(1.0)
    flipped = rank_correlation([1, 2, 3, 4, 5, 6], [6, 5, 4, 3, 2, 1], n_boot=200)
    assert flipped["rho"] == pytest.approx(-1.0) and flipped["n"] == 6
    noisy = rank_correlation([1, 2, 3, 4, 5, 6, 7, 8], [2, 1, 4, 3, 6, 5, 8, 7], n_boot=500)
    assert 0.8 < noisy["rho"] < 1 and noisy["ci"][0] < noisy["rho"] <= noisy["ci"][1]
