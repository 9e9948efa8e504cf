"""Confidence calibration of multiple-choice predictions (pure numpy, no model).

Conventions follow METHODS.md ("Metrics"):
- p = softmax over the per-choice log-likelihoods (raw), or over log-likelihoods
  divided by each choice's character length (the `acc_norm` convention of lm-eval);
- a prediction is argmax p; confidence is max p, and calibration compares confidence
  with *accuracy* (whether argmax p is the gold choice), never with a label index;
- ECE: equal-width bins over [0, 1] (default 15, torchmetrics' binning: [lo, hi),
  the last bin closed); adaptive ECE: 15 equal-count ranges of the sorted
  confidences; MCE: the largest per-bin gap; Brier: mean over items of
  sum_k (p_k - onehot_k)^2 (lm-eval's multi-class form); entropy in bits.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from qcal.errors import ConfigError

DEFAULT_BINS = 15


def softmax_choices(lls: Sequence[float], lengths: Sequence[float] | None = None) -> np.ndarray:
    """p over the choices of one item; with `lengths`, each log-likelihood is divided first."""
    x = np.asarray(lls, dtype=np.float64)
    if lengths is not None:
        x = x / np.maximum(np.asarray(lengths, dtype=np.float64), 1.0)
    x = x - x.max()
    e = np.exp(x)
    return e / e.sum()


def _check(conf: np.ndarray, correct: np.ndarray, n_bins: int) -> None:
    if conf.ndim != 1 or conf.shape != correct.shape:
        raise ConfigError(f"confidence {conf.shape} and correctness {correct.shape} must be "
                          "1-D arrays of the same length")
    if conf.size == 0:
        raise ConfigError("no items to score; check the task's item file or --limit")
    if n_bins < 1:
        raise ConfigError(f"--ece-bins={n_bins} must be at least 1; the usual value is 15")


@dataclasses.dataclass(frozen=True)
class BinStats:
    """One reliability-diagram bar: items in the bin, their mean confidence and accuracy."""

    lo: float
    hi: float
    count: int
    confidence: float
    accuracy: float


def equal_width_bins(conf: np.ndarray, correct: np.ndarray, n_bins: int = DEFAULT_BINS
                     ) -> list[BinStats]:
    conf, correct = np.asarray(conf, np.float64), np.asarray(correct, np.float64)
    _check(conf, correct, n_bins)
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    idx = np.clip(np.searchsorted(edges, conf, side="right") - 1, 0, n_bins - 1)
    out = []
    for b in range(n_bins):
        mask = idx == b
        n = int(mask.sum())
        out.append(BinStats(float(edges[b]), float(edges[b + 1]), n,
                            float(conf[mask].mean()) if n else math.nan,
                            float(correct[mask].mean()) if n else math.nan))
    return out


def equal_count_bins(conf: np.ndarray, correct: np.ndarray, n_bins: int = DEFAULT_BINS
                     ) -> list[BinStats]:
    """Adaptive binning: sorted confidences cut into `n_bins` ranges of (nearly) equal size."""
    conf, correct = np.asarray(conf, np.float64), np.asarray(correct, np.float64)
    _check(conf, correct, n_bins)
    order = np.argsort(conf, kind="stable")
    out = []
    for part in np.array_split(order, min(n_bins, conf.size)):
        c, a = conf[part], correct[part]
        out.append(BinStats(float(c.min()), float(c.max()), int(part.size),
                            float(c.mean()), float(a.mean())))
    return out


def _weighted_gap(bins: list[BinStats], n: int) -> float:
    return float(sum(b.count / n * abs(b.accuracy - b.confidence) for b in bins if b.count))


def ece(conf: np.ndarray, correct: np.ndarray, n_bins: int = DEFAULT_BINS) -> float:
    """Expected calibration error with equal-width bins."""
    return _weighted_gap(equal_width_bins(conf, correct, n_bins), len(conf))


def adaptive_ece(conf: np.ndarray, correct: np.ndarray, n_bins: int = DEFAULT_BINS) -> float:
    return _weighted_gap(equal_count_bins(conf, correct, n_bins), len(conf))


def mce(conf: np.ndarray, correct: np.ndarray, n_bins: int = DEFAULT_BINS) -> float:
    """Maximum calibration error: the worst non-empty equal-width bin."""
    return max(abs(b.accuracy - b.confidence)
               for b in equal_width_bins(conf, correct, n_bins) if b.count)


def brier(probs: np.ndarray, gold: np.ndarray) -> float:
    """Mean over items of sum_k (p_k - onehot_k)^2."""
    onehot = np.zeros_like(probs)
    onehot[np.arange(len(gold)), gold] = 1.0
    return float(((probs - onehot) ** 2).sum(axis=1).mean())


def nll(probs: np.ndarray, gold: np.ndarray) -> float:
    """Mean negative log-probability (nats) of the gold choice."""
    p = probs[np.arange(len(gold)), gold]
    return float(-np.log(np.maximum(p, 1e-300)).mean())


def entropy_bits(probs: np.ndarray) -> np.ndarray:
    """Per-item entropy of p, base 2."""
    safe = np.where(probs > 0, probs, 1.0)
    return -(probs * np.log2(safe)).sum(axis=1)


def stack_probs(lls: Sequence[Sequence[float]], lengths: Sequence[Sequence[float]] | None = None
                ) -> np.ndarray:
    """[items, most choices] p, each item's softmax over its own choices.

    Items with fewer choices (ARC has 3-, 4- and 5-choice questions) are padded with p = 0
    after their softmax: a choice that does not exist has no probability, so every metric
    here (argmax, max p, gold p, entropy, Brier's sum over choices) is exactly that of the
    item's own choices."""
    if not lls:
        return np.zeros((0, 0))
    if min(len(x) for x in lls) < 1:
        raise ConfigError("an item has no choices; fix the task's item file")
    if lengths is None:
        rows = [softmax_choices(x) for x in lls]
    else:
        rows = [softmax_choices(x, n) for x, n in zip(lls, lengths, strict=True)]
    out = np.zeros((len(rows), max(len(r) for r in rows)))
    for i, row in enumerate(rows):
        out[i, :len(row)] = row
    return out


def confidence_metrics(probs: np.ndarray, gold: np.ndarray, n_bins: int = DEFAULT_BINS
                       ) -> dict[str, Any]:
    """All item-level calibration numbers for one model on one task (one normalisation)."""
    probs, gold = np.asarray(probs, np.float64), np.asarray(gold, np.int64)
    if probs.ndim != 2 or probs.shape[0] != gold.shape[0]:
        raise ConfigError(f"probabilities {probs.shape} and gold {gold.shape} do not match")
    if probs.shape[0] == 0:
        raise ConfigError("no items to score; check the task's item file or --limit")
    if gold.min() < 0 or gold.max() >= probs.shape[1]:
        raise ConfigError(f"a gold index lies outside 0..{probs.shape[1] - 1}; fix the item file")
    conf = probs.max(axis=1)
    correct = (probs.argmax(axis=1) == gold).astype(np.float64)
    conf_true = probs[np.arange(len(gold)), gold]
    return {
        "n": int(len(gold)),
        "choices": int(probs.shape[1]),  # the most of any item (fewer are zero-padded)
        "acc": float(correct.mean()),
        "conf": float(conf.mean()),
        "conf_true": float(conf_true.mean()),
        "conf_correct": float(conf[correct == 1].mean()) if correct.any() else math.nan,
        "conf_incorrect": float(conf[correct == 0].mean()) if (correct == 0).any() else math.nan,
        "entropy": float(entropy_bits(probs).mean()),
        "ece": ece(conf, correct, n_bins),
        "adaptive_ece": adaptive_ece(conf, correct, n_bins),
        "mce": mce(conf, correct, n_bins),
        "brier": brier(probs, gold),
        "nll": nll(probs, gold),
        "bins": n_bins,
    }


def paired_ttest(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    """Paired t-test of b - a (e.g. conf_true quantized minus float), two-sided."""
    from scipy import stats

    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape or a.size < 2:
        raise ConfigError("a paired t-test needs two equal-length samples of at least 2 items")
    d = b - a
    if np.allclose(d, d[0]):
        # Constant differences have zero variance: the t statistic is undefined.
        return {"mean_diff": float(d.mean()), "t": math.nan, "p": math.nan, "n": int(d.size)}
    res = stats.ttest_rel(b, a)
    return {"mean_diff": float(d.mean()), "t": float(res.statistic), "p": float(res.pvalue),
            "n": int(d.size)}
