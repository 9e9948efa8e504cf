"""Confidence metrics and drift against hand-computed values on synthetic data."""

from __future__ import annotations

import math

import numpy as np
import pytest

from qcal.errors import ConfigError
from qcal.eval import confidence as cm
from qcal.eval.drift import LOG_ODDS_FLOOR, gold_log_odds, item_drift, metric_deltas

pytestmark = pytest.mark.unit


def test_ece_mce_two_bins_by_hand() -> None:
    conf = np.array([0.9, 0.8, 0.3, 0.2])
    correct = np.array([1, 0, 0, 1])
    # bin [0.5, 1]: conf 0.85, acc 0.5 -> gap 0.35; bin [0, 0.5): conf 0.25, acc 0.5 -> 0.25
    assert cm.ece(conf, correct, n_bins=2) == pytest.approx(0.5 * 0.35 + 0.5 * 0.25)
    assert cm.mce(conf, correct, n_bins=2) == pytest.approx(0.35)
    assert cm.adaptive_ece(conf, correct, n_bins=2) == pytest.approx(0.3)


def test_ece_fifteen_bins_by_hand() -> None:
    conf = np.array([0.95, 0.95, 0.95, 0.95, 0.5])
    correct = np.array([1, 1, 1, 0, 1])
    # bin of 0.95: acc 0.75, gap 0.2, weight 4/5; bin of 0.5: gap 0.5, weight 1/5
    assert cm.ece(conf, correct) == pytest.approx(0.8 * 0.2 + 0.2 * 0.5)
    assert cm.mce(conf, correct) == pytest.approx(0.5)
    bins = cm.equal_width_bins(conf, correct)
    assert len(bins) == 15 and sum(b.count for b in bins) == 5
    # confidence 1.0 falls in the last (closed) bin, not past it
    assert cm.equal_width_bins(np.array([1.0]), np.array([1]))[-1].count == 1


def test_perfectly_calibrated_predictor_has_ece_near_zero() -> None:
    rng = np.random.default_rng(0)
    conf = rng.uniform(0.25, 1.0, 200_000)
    calibrated = rng.uniform(size=conf.size) < conf
    assert cm.ece(conf, calibrated) < 0.01
    assert cm.adaptive_ece(conf, calibrated) < 0.01
    overconfident = rng.uniform(size=conf.size) < conf**2
    assert cm.ece(conf, overconfident) > 0.1


def test_brier_nll_entropy_by_hand() -> None:
    probs = np.array([[0.7, 0.2, 0.1], [0.3, 0.3, 0.4]])
    gold = np.array([0, 1])
    assert cm.brier(probs, gold) == pytest.approx((0.09 + 0.04 + 0.01 + 0.09 + 0.49 + 0.16) / 2)
    assert cm.nll(probs, gold) == pytest.approx(-(math.log(0.7) + math.log(0.3)) / 2)
    ent = cm.entropy_bits(np.array([[0.5, 0.5, 0, 0], [1, 0, 0, 0], [0.25] * 4]))
    assert ent == pytest.approx([1.0, 0.0, 2.0])


def test_brier_matches_lm_eval() -> None:
    from lm_eval.api.metrics import brier_score

    rng = np.random.default_rng(1)
    probs = rng.dirichlet(np.ones(4), size=50)
    gold = rng.integers(0, 4, 50)
    assert cm.brier(probs, gold) == pytest.approx(brier_score(list(zip(gold, probs, strict=True))))


def test_softmax_raw_and_length_normalised() -> None:
    raw = cm.softmax_choices([-10.0, -12.0])
    assert raw == pytest.approx([1 / (1 + math.exp(-2)), math.exp(-2) / (1 + math.exp(-2))])
    norm = cm.softmax_choices([-10.0, -12.0], [10, 4])  # per char: -1 vs -3
    assert norm == pytest.approx([1 / (1 + math.exp(-2)), math.exp(-2) / (1 + math.exp(-2))])
    flipped = cm.softmax_choices([-12.0, -10.0], [4, 10])
    assert flipped == pytest.approx(norm[::-1])


def test_confidence_metrics_summary() -> None:
    probs = np.array([[0.6, 0.4], [0.2, 0.8], [0.9, 0.1], [0.5, 0.5]])
    gold = np.array([0, 0, 1, 0])
    m = cm.confidence_metrics(probs, gold)
    assert m["acc"] == pytest.approx(0.5)  # items 0 and 3 (tie -> first choice, as np.argmax)
    assert m["conf"] == pytest.approx((0.6 + 0.8 + 0.9 + 0.5) / 4)
    assert m["conf_true"] == pytest.approx((0.6 + 0.2 + 0.1 + 0.5) / 4)
    assert m["conf_correct"] == pytest.approx(0.55)
    assert m["conf_incorrect"] == pytest.approx(0.85)
    assert m["n"] == 4 and m["choices"] == 2


def test_bad_inputs_raise_clear_errors() -> None:
    with pytest.raises(ConfigError, match="no items"):
        cm.confidence_metrics(np.zeros((0, 4)), np.zeros(0, int))
    with pytest.raises(ConfigError, match="gold index"):
        cm.confidence_metrics(np.full((2, 4), 0.25), np.array([0, 4]))
    with pytest.raises(ConfigError, match="no choices"):
        cm.stack_probs([[-1.0, -2.0], []])
    with pytest.raises(ConfigError, match="ece-bins"):
        cm.ece(np.array([0.5]), np.array([1]), n_bins=0)


def test_paired_ttest_detects_a_consistent_drop() -> None:
    rng = np.random.default_rng(2)
    a = rng.uniform(0.2, 0.9, 100)
    b = a - 0.05 + rng.normal(0, 0.01, 100)
    res = cm.paired_ttest(a, b)
    assert res["mean_diff"] == pytest.approx(-0.05, abs=0.005)
    assert res["t"] < 0 and res["p"] < 1e-6


def test_item_drift_concentration_and_flips() -> None:
    # 8 items, 2 choices, gold 0; the four least sure items lose 0.1 each, the rest keep p.
    base_p0 = np.array([0.3, 0.35, 0.4, 0.45, 0.7, 0.8, 0.9, 0.95])
    model_p0 = base_p0.copy()
    model_p0[:4] -= 0.1
    model_p0[3] = 0.6  # item 3 gains instead: 0.45 -> 0.6 flips from wrong to right
    base = np.stack([base_p0, 1 - base_p0], 1)
    model = np.stack([model_p0, 1 - model_p0], 1)
    gold = np.zeros(8, int)
    d = item_drift(base, model, gold)
    assert d["flip_rate"] == pytest.approx(1 / 8)
    assert d["flips_to_correct"] == 1 and d["flips_to_wrong"] == 0
    q = d["by_base_conf_quantile"]
    assert [x["n"] for x in q] == [2, 2, 2, 2]
    assert q[0]["delta_conf_true"] == pytest.approx(-0.1)
    assert q[0]["share_of_loss"] == pytest.approx(2 / 3)
    assert q[3]["delta_conf_true"] == pytest.approx(0.0)
    assert d["delta_conf_true"] == pytest.approx((-0.3 + 0.15) / 8)
    with pytest.raises(ConfigError, match="same items"):
        item_drift(base, model[:4], gold)


def test_metric_deltas_skip_counts() -> None:
    out = metric_deltas({"acc": 0.5, "n": 10, "ece": 0.1}, {"acc": 0.4, "n": 10, "ece": 0.15})
    assert out == pytest.approx({"acc": -0.1, "ece": 0.05})


def test_items_with_different_numbers_of_choices_score_as_their_own_choices() -> None:
    # ARC mixes 3-, 4- and 5-choice questions: each item is its own softmax, padded with 0.
    lls = [[-1.0, -2.0, -0.5], [-3.0, -1.0, -2.0, -2.5, -4.0], [-0.2, -0.1, -3.0, -1.0]]
    gold = np.array([2, 0, 1])
    probs = cm.stack_probs(lls)
    assert probs.shape == (3, 5) and np.allclose(probs.sum(axis=1), 1.0)
    assert probs[0, 3:].tolist() == [0.0, 0.0] and probs[2, 4] == 0.0
    m = cm.confidence_metrics(probs, gold)
    own = [cm.softmax_choices(x) for x in lls]
    assert m["conf_true"] == pytest.approx(np.mean([p[g] for p, g in zip(own, gold, strict=True)]))
    assert m["acc"] == pytest.approx(np.mean([p.argmax() == g for p, g in zip(own, gold,
                                                                              strict=True)]))
    want_brier = np.mean([((p - np.eye(len(p))[g]) ** 2).sum() for p, g in zip(own, gold,
                                                                               strict=True)])
    assert m["brier"] == pytest.approx(want_brier)
    want_entropy = np.mean([-(p * np.log2(p)).sum() for p in own])
    assert m["entropy"] == pytest.approx(want_entropy)
    assert m["choices"] == 5
    normed = cm.stack_probs(lls, [[1, 2, 3], [1, 1, 1, 1, 1], [2, 2, 2, 2]])
    assert normed.shape == (3, 5) and normed[0, 3] == 0.0


def test_gold_log_odds_sums_the_other_choices_and_stays_finite() -> None:
    probs = np.array([[0.3, 0.5, 0.2], [1e-10, 1 - 1e-10, 0.0], [1.0, 0.0, 0.0]])
    got = gold_log_odds(probs, np.array([0, 1, 0]))
    assert got[0] == pytest.approx(math.log(0.3 / 0.7))
    assert got[1] == pytest.approx(math.log((1 - 1e-10) / 1e-10), rel=1e-9)
    assert got[2] == pytest.approx(-math.log(LOG_ODDS_FLOOR))  # others underflowed to 0
