"""Item-level drift of a quantized model from its float base on the same items (pure numpy).

The question behind it (METHODS.md): does quantization lower the confidence on the gold
answer, and mostly on items where the float model was already unsure? Items are split
into equal-count quantiles of the *base* model's gold-answer probability, and each
quantile reports the mean change, so "where it concentrates" is read off directly.
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
    delta = ct_m - ct_b
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
    return {
        "n": int(len(gold)),
        "flip_rate": float(flips.mean()),
        "flips_to_correct": int((~corr_b & corr_m).sum()),
        "flips_to_wrong": int((corr_b & ~corr_m).sum()),
        "delta_conf_true": float(delta.mean()),
        "frac_decreased": float((delta < 0).mean()),
        "ttest_conf_true": test,
        "by_base_conf_quantile": by_quantile,
        "by_base_correct": {"correct": group(corr_b), "incorrect": group(~corr_b)},
    }
