"""Drift beyond perplexity on cases with known answers: KL in both directions, top-1
agreement, where the divergence sits (worst 1% of positions, top tokens, position deciles)
and the exact McNemar test of answer flips."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from qcal.eval.divergence import localization, reverse_kl, token_divergence
from qcal.eval.drift import item_drift, mcnemar_exact

pytestmark = pytest.mark.unit


def test_both_kl_directions_match_the_closed_form() -> None:
    p = torch.tensor([[0.5, 0.5], [0.9, 0.1]]).log()
    q = torch.tensor([[0.9, 0.1], [0.9, 0.1]]).log()
    forward, _ = token_divergence(p, q)
    backward = reverse_kl(p, q)
    kl_pq = 0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1)
    kl_qp = 0.9 * math.log(0.9 / 0.5) + 0.1 * math.log(0.1 / 0.5)
    torch.testing.assert_close(forward, torch.tensor([kl_pq, 0.0]), atol=1e-6, rtol=0)
    torch.testing.assert_close(backward, torch.tensor([kl_qp, 0.0]), atol=1e-6, rtol=0)
    assert kl_pq != pytest.approx(kl_qp)  # the two directions differ: both are reported


def test_localization_known_answers() -> None:
    kl = torch.zeros(200)
    kl[7], kl[150] = 10.0, 6.0  # two positions carry most of it
    kl[:100] += 0.04  # the rest spread over the first half
    targets = torch.full((200,), 3)
    targets[7], targets[150] = 42, 42
    positions = torch.arange(200, dtype=torch.float32) / 200
    loc = localization(kl, targets, positions)
    total = 16.0 + 4.0
    assert loc["worst_1pct_share"] == pytest.approx(16.04 / total)  # 2 of 200 positions
    top = loc["top_tokens"][0]
    assert (top["token_id"], top["count"]) == (42, 2)
    assert top["kl_sum"] == pytest.approx(16.04) and top["kl_share"] == pytest.approx(16.04 / total)
    deciles = loc["kl_share_by_position_decile"]
    assert deciles[0] == pytest.approx((10.0 + 0.04 * 20) / total)
    assert deciles[7] == pytest.approx(6.0 / total) and sum(deciles) == pytest.approx(1.0)


def test_mcnemar_exact() -> None:
    assert mcnemar_exact(0, 0) == 1.0 and mcnemar_exact(5, 5) == pytest.approx(1.0)
    assert mcnemar_exact(0, 6) == pytest.approx(2 * 0.5**6)
    assert mcnemar_exact(1, 9) == pytest.approx(2 * (1 + 10) / 2**10)


def test_item_drift_counts_flips_and_tests_them() -> None:
    gold = np.zeros(10, dtype=np.int64)
    base = np.tile([0.8, 0.2], (10, 1))
    model = base.copy()
    model[:6] = [0.3, 0.7]  # six correct answers turn wrong, none the other way
    drift = item_drift(base, model, gold)
    assert (drift["flips_to_wrong"], drift["flips_to_correct"]) == (6, 0)
    assert drift["mcnemar_p"] == pytest.approx(2 * 0.5**6)
