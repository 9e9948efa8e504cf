"""Item-level drift of a quantized model from its float base on the same items (pure numpy).

The question behind it (METHODS.md): does quantization lower the confidence on the gold
answer, and mostly on items where the float model was already unsure? Items are split
into equal-count quantiles of the *base* model's gold-answer probability, and each
quantile reports the mean change, so "where it concentrates" is read off directly.

Probabilities are bounded: an item the base model gives p = 0.01 can hardly lose, one at
p = 0.99 can hardly gain, so even a perturbation that is symmetric in the model's scores
moves the unsure quantiles up and the sure ones down. Each group therefore also reports the
change in the gold answer's log-odds, log p / (1 - p), which has no floor or ceiling: the
scale on which "mostly where it was unsure" can be told apart from that artefact.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from qcal.errors import ConfigError
from qcal.eval.confidence import paired_ttest


def metric_deltas(base: dict[str, Any], model: dict[str, Any]) -> dict[str, float]:
    """model - base for every numeric metric the two share."""
    out = {}
    for key, b in base.items():
        m = model.get(key)
        if isinstance(b, (int, float)) and isinstance(m, (int, float)) and not isinstance(b, bool) \
                and key not in ("n", "choices", "bins"):
            out[key] = float(m) - float(b)
    return out


LOG_ODDS_FLOOR = 1e-12  # keeps an item whose other choices underflowed to p = 0 finite


def gold_log_odds(probs: np.ndarray, gold: np.ndarray) -> np.ndarray:
    """Per item log(p_gold / p_other choices), the other choices summed as they are (not as
    1 - p_gold, which loses every digit once p_gold is near 1)."""
    probs, gold = np.asarray(probs, np.float64), np.asarray(gold, np.int64)
    rows = np.arange(len(gold))
    others = probs.copy()
    others[rows, gold] = 0.0
    return (np.log(np.maximum(probs[rows, gold], LOG_ODDS_FLOOR))
            - np.log(np.maximum(others.sum(1), LOG_ODDS_FLOOR)))


def gold_changes(base_probs: np.ndarray, model_probs: np.ndarray, gold: np.ndarray
                 ) -> dict[str, np.ndarray]:
    """Per item model - base of the gold answer's probability ("p") and log-odds
    ("log_odds")."""
    rows = np.arange(len(gold))
    return {"p": model_probs[rows, gold] - base_probs[rows, gold],
            "log_odds": gold_log_odds(model_probs, gold) - gold_log_odds(base_probs, gold)}


def mcnemar_exact(wrong_to_correct: int, correct_to_wrong: int) -> float:
    """Two-sided exact McNemar p-value: under "quantization changes no item's correctness
    in either direction more often", each discordant item is a fair coin."""
    from scipy.stats import binomtest

    n = wrong_to_correct + correct_to_wrong
    return 1.0 if n == 0 else float(binomtest(wrong_to_correct, n, 0.5).pvalue)


def item_drift(base_probs: np.ndarray, model_probs: np.ndarray, gold: np.ndarray,
               quantiles: int = 4) -> dict[str, Any]:
    """Per-item conf_true change, answer flips, and their concentration by base confidence."""
    bp, mp = np.asarray(base_probs, np.float64), np.asarray(model_probs, np.float64)
    gold = np.asarray(gold, np.int64)
    if bp.shape != mp.shape or bp.ndim != 2 or bp.shape[0] != gold.shape[0]:
        raise ConfigError(f"base {bp.shape} and model {mp.shape} item probabilities differ; "
                          "both must score the same items (same tasks and --limit)")
    if bp.shape[0] == 0:
        raise ConfigError("no items to compare; check the task's item file or --limit")
    rows = np.arange(len(gold))
    ct_b, ct_m = bp[rows, gold], mp[rows, gold]
    changes = gold_changes(bp, mp, gold)
    delta, delta_log_odds = changes["p"], changes["log_odds"]
    pred_b, pred_m = bp.argmax(1), mp.argmax(1)
    flips = pred_b != pred_m
    corr_b, corr_m = pred_b == gold, pred_m == gold
    losses = np.minimum(delta, 0.0)
    total_loss = float(losses.sum())

    def group(mask: np.ndarray) -> dict[str, Any]:
        n = int(mask.sum())
        if n == 0:
            return {"n": 0}
        return {
            "n": n,
            "base_conf_true": float(ct_b[mask].mean()),
            "model_conf_true": float(ct_m[mask].mean()),
            "delta_conf_true": float(delta[mask].mean()),
            "delta_log_odds_true": float(delta_log_odds[mask].mean()),
            "mean_abs_delta": float(np.abs(delta[mask]).mean()),
            "frac_decreased": float((delta[mask] < 0).mean()),
            "flip_rate": float(flips[mask].mean()),
            "base_acc": float(corr_b[mask].mean()),
            "model_acc": float(corr_m[mask].mean()),
            # share of all gold-probability lost across items that falls in this group
            "share_of_loss": float(losses[mask].sum() / total_loss) if total_loss < 0 else math.nan,
        }

    order = np.argsort(ct_b, kind="stable")
    parts = np.array_split(order, min(quantiles, len(order)))
    by_quantile = []
    for q, idx in enumerate(parts, 1):
        mask = np.zeros(len(gold), bool)
        mask[idx] = True
        by_quantile.append({"quantile": q, "base_conf_true_range": [float(ct_b[idx].min()),
                                                                     float(ct_b[idx].max())],
                            **group(mask)})
    test = paired_ttest(ct_b, ct_m) if len(gold) >= 2 else {"n": len(gold)}
    to_correct, to_wrong = int((~corr_b & corr_m).sum()), int((corr_b & ~corr_m).sum())
    return {
        "n": int(len(gold)),
        "flip_rate": float(flips.mean()),
        "flips_to_correct": to_correct,
        "flips_to_wrong": to_wrong,
        "mcnemar_p": mcnemar_exact(to_correct, to_wrong),
        "delta_conf_true": float(delta.mean()),
        "delta_log_odds_true": float(delta_log_odds.mean()),
        "frac_decreased": float((delta < 0).mean()),
        "ttest_conf_true": test,
        "by_base_conf_quantile": by_quantile,
        "by_base_correct": {"correct": group(corr_b), "incorrect": group(~corr_b)},
    }
