"""Statistics that turn a comparison into evidence: confidence intervals across seeds and
paired tests between two settings scored on the same evaluation units.

- `mean_ci`: mean and a Student-t 95% interval over independent runs (calibration seeds).
- `paired_ppl_test`: two models' summed NLL on the same evaluation windows; a paired
  bootstrap over windows gives the perplexity difference, its 95% interval and a
  two-sided p-value; Cohen's d_z of the per-window mean-NLL differences is the effect size.
- `seeded_ppl_test`: two calibration settings, each quantized from several independent
  draws (seeds): a bootstrap over windows (paired) and over each side's seeds.
- `paired_mean_test`: the same for per-item values (accuracy as 0/1, gold-answer
  confidence), plus the paired t-test.
- `two_sample_mean_test`: mean(a) - mean(b) for two disjoint groups of items (Welch's
  t-test, independent bootstrap), e.g. one quartile of items against the others.
- `rank_shift_test`: the same two groups on ranks (Mann-Whitney U, Hodges-Lehmann shift,
  rank-biserial r): a check that a few extreme items do not make the mean's verdict.
- `holm_adjust` / `with_holm`: a report runs many tests, and some of them come out
  "significant" by chance; Holm's step-down adjustment controls the chance of any false
  positive over a report's family of tests (no assumption on how they depend on each other).

A paired test knows its sample: with fewer than `MIN_UNITS` paired units (windows,
items), or when its bootstrap resamples cannot vary (every unit's difference equal), it
reports the effect and says why there is no p-value or interval (`no_test`), and it is
never significant. Every test carries its unit count (`units`, `unit`) beside its p.

Pure functions of numbers: no model, no files.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

DEFAULT_BOOTSTRAP = 10_000
LEVEL = 0.95
# Below this many paired units a bootstrap has too few distinct resamples for its tails to
# mean anything (2 windows: 3 distinct resamples) and a t-test's normality has no support.
MIN_UNITS = 10


def no_test_reason(units: int, unit: str, boot: np.ndarray | None = None) -> str | None:
    """Why a paired comparison of `units` cannot be tested (None when it can)."""
    if units < MIN_UNITS:
        return (f"only {units} paired {unit}; a test needs at least {MIN_UNITS}: report the "
                "effect alone, or evaluate more")
    if boot is not None and float(np.ptp(boot)) <= 1e-12 * max(1.0, float(np.abs(boot).max())):
        return (f"the bootstrap resamples of the {units} {unit} cannot vary (every paired "
                "difference is the same), so there is nothing to test")
    return None


def _untested(result: dict[str, Any], reason: str, *p_keys: str) -> dict[str, Any]:
    """`result` with its p-values and interval withdrawn and the reason said."""
    return {**result, **{k: None for k in p_keys}, "ci_low": None, "ci_high": None,
            "significant": False, "no_test": reason}


def mean_ci(values: Sequence[float], level: float = LEVEL) -> dict[str, Any]:
    """Mean, sample sd and the t-interval half-width of independent runs (n >= 2)."""
    from scipy import stats

    x = np.asarray(values, dtype=np.float64)
    n = int(x.size)
    if n == 0:
        raise ValueError("mean_ci needs at least one value")
    mean = float(x.mean())
    if n == 1:
        return {"mean": mean, "sd": None, "half_width": None, "low": None, "high": None, "n": 1}
    sd = float(x.std(ddof=1))
    half = float(stats.t.ppf(0.5 + level / 2, n - 1) * sd / math.sqrt(n))
    return {"mean": mean, "sd": sd, "half_width": half, "low": mean - half, "high": mean + half,
            "n": n}


def mean_ci_text(values: Sequence[float], digits: int = 2) -> str:
    """'mean ± half-width' of `mean_ci` for a table cell ('mean (1 seed)' for one run)."""
    ci = mean_ci(values)
    if ci["half_width"] is None:
        return f"{ci['mean']:.{digits}f} (1 seed)"
    return f"{ci['mean']:.{digits}f} ± {ci['half_width']:.{digits}f}"


def _bootstrap_p(deltas: np.ndarray, observed: float) -> float:
    """Two-sided p-value of 'no difference' from bootstrap deltas (percentile method)."""
    if observed == 0:
        return 1.0
    crossing = np.mean(deltas <= 0) if observed > 0 else np.mean(deltas >= 0)
    return float(min(1.0, 2 * crossing + 1 / (deltas.size + 1)))


def cohens_dz(diff: np.ndarray) -> float | None:
    sd = float(diff.std(ddof=1)) if diff.size > 1 else 0.0
    return float(diff.mean() / sd) if sd > 0 else None


def paired_ppl_test(nll_a: Sequence[float], tokens_a: Sequence[int], nll_b: Sequence[float],
                    tokens_b: Sequence[int], n_boot: int = DEFAULT_BOOTSTRAP, seed: int = 0,
                    level: float = LEVEL) -> dict[str, Any]:
    """Is model A's perplexity different from B's on the same windows?

    `nll_*` are per-window summed NLLs, `tokens_*` the scored tokens per window (equal for
    A and B: the same windows). delta = ppl_A - ppl_B; negative means A is better.
    """
    a, b = np.asarray(nll_a, dtype=np.float64), np.asarray(nll_b, dtype=np.float64)
    ta, tb = np.asarray(tokens_a, dtype=np.float64), np.asarray(tokens_b, dtype=np.float64)
    if a.shape != b.shape or not np.array_equal(ta, tb) or a.size == 0:
        raise ValueError("a paired test needs both models scored on the same windows")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, a.size, size=(n_boot, a.size))
    tok = ta[idx].sum(1)
    boot = np.exp(a[idx].sum(1) / tok) - np.exp(b[idx].sum(1) / tok)
    ppl_a, ppl_b = math.exp(a.sum() / ta.sum()), math.exp(b.sum() / ta.sum())
    delta = ppl_a - ppl_b
    lo, hi = np.quantile(boot, [(1 - level) / 2, (1 + level) / 2])
    out = {"ppl_a": ppl_a, "ppl_b": ppl_b, "delta": delta, "relative": delta / ppl_b,
           "ci_low": float(lo), "ci_high": float(hi), "p": _bootstrap_p(boot, delta),
           "effect_dz": cohens_dz(a / ta - b / tb), "units": int(a.size), "unit": "windows",
           "significant": bool(lo > 0 or hi < 0)}
    reason = no_test_reason(int(a.size), "windows", boot)
    return out if reason is None else _untested(out, reason, "p")


def seeded_ppl_test(nll_a: Sequence[Sequence[float]], nll_b: Sequence[Sequence[float]],
                    tokens: Sequence[int], n_boot: int = DEFAULT_BOOTSTRAP, seed: int = 0,
                    level: float = LEVEL) -> dict[str, Any]:
    """Is setting A's perplexity different from B's, over calibration draws *and* windows?

    `nll_a` [seeds_a][windows] and `nll_b` [seeds_b][windows] are per-window summed NLLs of
    the models quantized from each seed's calibration draw, all scored on the same windows
    (`tokens` per window). A setting's perplexity is the mean over its seeds; delta =
    ppl_A - ppl_B (negative: A better). Seeds of A and B are independent draws (seed 0 of
    one set has nothing to do with seed 0 of another), so each bootstrap replicate resamples
    the windows once for both (they are paired) and the seeds of each side on their own:
    the interval carries the calibration-draw variance that a window-only test ignores.
    """
    a, b = np.asarray(nll_a, dtype=np.float64), np.asarray(nll_b, dtype=np.float64)
    tok = np.asarray(tokens, dtype=np.float64)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1] or a.shape[1] != tok.size \
            or tok.size == 0 or 0 in (a.shape[0], b.shape[0]):
        raise ValueError("a seeded test needs [seeds][windows] NLLs of both settings on the "
                         "same windows")
    rng = np.random.default_rng(seed)
    windows = rng.integers(0, tok.size, size=(n_boot, tok.size))
    boot_tokens = tok[windows].sum(1)

    def boot_ppl(x: np.ndarray) -> np.ndarray:
        per_seed = np.exp(x[:, windows].sum(2) / boot_tokens)  # [seeds, n_boot]
        draws = rng.integers(0, x.shape[0], size=(x.shape[0], n_boot))
        return np.take_along_axis(per_seed, draws, axis=0).mean(0)

    boot = boot_ppl(a) - boot_ppl(b)
    seeds_a = np.exp(a.sum(1) / tok.sum())
    seeds_b = np.exp(b.sum(1) / tok.sum())
    delta = float(seeds_a.mean() - seeds_b.mean())
    lo, hi = np.quantile(boot, [(1 - level) / 2, (1 + level) / 2])
    out = {"ppl_a": float(seeds_a.mean()), "ppl_b": float(seeds_b.mean()), "delta": delta,
           "relative": delta / float(seeds_b.mean()), "ci_low": float(lo), "ci_high": float(hi),
           "p": _bootstrap_p(boot, delta),
           "effect_dz": cohens_dz(a.mean(0) / tok - b.mean(0) / tok),
           "seeds_a": [float(v) for v in seeds_a], "seeds_b": [float(v) for v in seeds_b],
           "units": int(tok.size), "unit": "windows", "significant": bool(lo > 0 or hi < 0)}
    reason = no_test_reason(int(tok.size), "windows", boot)
    return out if reason is None else _untested(out, reason, "p")


def paired_mean_test(a: Sequence[float], b: Sequence[float], n_boot: int = DEFAULT_BOOTSTRAP,
                     seed: int = 0, level: float = LEVEL) -> dict[str, Any]:
    """Paired bootstrap and t-test of mean(a) - mean(b) over the same items."""
    from scipy import stats

    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.shape != y.shape or x.size == 0:
        raise ValueError("a paired test needs the same items on both sides")
    diff = x - y
    rng = np.random.default_rng(seed)
    boot = diff[rng.integers(0, diff.size, size=(n_boot, diff.size))].mean(1)
    lo, hi = np.quantile(boot, [(1 - level) / 2, (1 + level) / 2])
    delta = float(diff.mean())
    # Differences that are constant up to rounding have no variance to test (scipy would
    # warn of catastrophic cancellation and return noise).
    varies = diff.size > 1 and not np.allclose(diff, diff[0], rtol=0.0, atol=1e-12)
    t = stats.ttest_rel(x, y) if varies else None
    out = {"mean_a": float(x.mean()), "mean_b": float(y.mean()), "delta": delta,
           "ci_low": float(lo), "ci_high": float(hi), "p_bootstrap": _bootstrap_p(boot, delta),
           "p_ttest": float(t.pvalue) if t is not None else None,
           "effect_dz": cohens_dz(diff), "units": int(diff.size), "unit": "items",
           "significant": bool(lo > 0 or hi < 0)}
    reason = no_test_reason(int(diff.size), "items", boot)
    return out if reason is None else _untested(out, reason, "p_bootstrap", "p_ttest")


def two_sample_mean_test(a: Sequence[float], b: Sequence[float], n_boot: int = DEFAULT_BOOTSTRAP,
                         seed: int = 0, level: float = LEVEL) -> dict[str, Any]:
    """Difference of the means of two disjoint groups: Welch's t-test (unequal variances,
    unequal sizes) and a bootstrap interval that resamples each group on its own; the
    effect size is Cohen's d with the pooled standard deviation."""
    from scipy import stats

    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.ndim != 1 or y.ndim != 1 or x.size < 2 or y.size < 2:
        raise ValueError("a two-sample test needs at least two values in each group")
    rng = np.random.default_rng(seed)
    boot = (x[rng.integers(0, x.size, size=(n_boot, x.size))].mean(1)
            - y[rng.integers(0, y.size, size=(n_boot, y.size))].mean(1))
    lo, hi = np.quantile(boot, [(1 - level) / 2, (1 + level) / 2])
    delta = float(x.mean() - y.mean())
    pooled = math.sqrt(((x.size - 1) * x.var(ddof=1) + (y.size - 1) * y.var(ddof=1))
                       / (x.size + y.size - 2))
    varies = pooled > 1e-12
    t = stats.ttest_ind(x, y, equal_var=False) if varies else None
    return {"mean_a": float(x.mean()), "mean_b": float(y.mean()), "delta": delta,
            "ci_low": float(lo), "ci_high": float(hi), "p_bootstrap": _bootstrap_p(boot, delta),
            "p_ttest": float(t.pvalue) if t is not None else None,
            "effect_d": delta / pooled if varies else None, "units": [int(x.size), int(y.size)],
            "significant": bool(lo > 0 or hi < 0)}


# Pairs of values the Hodges-Lehmann shift takes its median over, at most; larger groups
# use a seeded random sample of this many pairs (the estimate, not the test, is sampled).
MAX_SHIFT_PAIRS = 4_000_000


def rank_shift_test(a: Sequence[float], b: Sequence[float], seed: int = 0,
                    level: float = LEVEL) -> dict[str, Any]:
    """Do the values of group a tend to lie above or below those of group b?

    Mann-Whitney U (two-sided, normal approximation with the tie correction), with the
    Hodges-Lehmann shift (median of every difference a_i - b_j) as `delta` and the
    rank-biserial correlation r = 2 U / (n_a n_b) - 1 (+1: every a above every b) as the
    effect size. Ranks bound each item's weight, so a handful of extreme values cannot
    decide the verdict as they can a mean's."""
    from scipy import stats

    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.ndim != 1 or y.ndim != 1 or x.size < 2 or y.size < 2:
        raise ValueError("a rank test needs at least two values in each group")
    if np.ptp(np.concatenate([x, y])) <= 1e-12:  # all tied: no order to test
        p, r = 1.0, 0.0
    else:
        u = stats.mannwhitneyu(x, y, alternative="two-sided", method="asymptotic")
        p, r = float(u.pvalue), float(2 * u.statistic / (x.size * y.size) - 1)
    if x.size * y.size <= MAX_SHIFT_PAIRS:
        diffs = (x[:, None] - y[None, :]).ravel()
    else:
        rng = np.random.default_rng(seed)
        diffs = (x[rng.integers(0, x.size, MAX_SHIFT_PAIRS)]
                 - y[rng.integers(0, y.size, MAX_SHIFT_PAIRS)])
    return {"median_a": float(np.median(x)), "median_b": float(np.median(y)),
            "delta": float(np.median(diffs)), "p": p, "effect_r": r,
            "units": [int(x.size), int(y.size)], "significant": bool(p < 1 - level)}


def holm_adjust(pvalues: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values, in the input order: the i-th smallest of m is multiplied by
    (m - i), made non-decreasing in that order and capped at 1."""
    p = np.asarray(pvalues, dtype=np.float64)
    if p.size == 0:
        return []
    if np.any(np.isnan(p)) or np.any((p < 0) | (p > 1)):
        raise ValueError("Holm adjustment needs p-values in [0, 1]")
    order = np.argsort(p, kind="stable")
    scaled = p[order] * (p.size - np.arange(p.size))
    adjusted = np.minimum(np.maximum.accumulate(scaled), 1.0)
    out = np.empty_like(adjusted)
    out[order] = adjusted
    return [float(v) for v in out]


def test_p(test: dict[str, Any]) -> float | None:
    """A test's two-sided p-value: `p` (perplexity and rank tests) or the bootstrap's; None
    for a comparison too small to test (`no_test`)."""
    p = test["p"] if "p" in test else test["p_bootstrap"]
    return None if p is None else float(p)


def with_holm(tests: Sequence[dict[str, Any]], alpha: float = 1 - LEVEL,
              p_of: Callable[[dict[str, Any]], float | None] = test_p) -> list[dict[str, Any]]:
    """Copies of `tests` (one family) with `p_holm` and `significant_holm` (p_holm < alpha);
    `p_of` picks the p-value each test is adjusted on (default: `test_p`). Comparisons with
    no test (no p) stay out of the family: p_holm None, never significant."""
    ps = [p_of(t) for t in tests]
    adjusted = iter(holm_adjust([p for p in ps if p is not None]))
    out = []
    for t, p in zip(tests, ps, strict=True):
        q = None if p is None else next(adjusted)
        out.append({**t, "p_holm": q, "significant_holm": bool(q is not None and q < alpha)})
    return out


def p_text(test: dict[str, Any], key: str | None = None) -> str:
    """'p=0.004, 64 windows': a p-value with its unit count; for a comparison with no test,
    'no p-value: <why>'."""
    if test.get("no_test"):
        return f"no p-value: {test['no_test']}"
    p = test_p(test) if key is None else test[key]
    units = test.get("units")
    if units is None:
        return f"p={p:.3g}"
    count = "+".join(str(u) for u in units) if isinstance(units, list) else str(units)
    return f"p={p:.3g}, {count} {test.get('unit', 'units')}"


def significant(test: dict[str, Any]) -> bool:
    """Whether a test counts as significant: after Holm for one that went through
    `with_holm`, else its own interval."""
    return bool(test.get("significant_holm", test["significant"]))


def verdict(test: dict[str, Any], better_when_lower: bool = True) -> str:
    """'A better (p=...)', 'B better (p=...)' or 'no significant difference (p=...)'; a test
    that went through `with_holm` and does not survive the adjustment says so."""
    if test.get("no_test"):
        return f"effect {test['delta']:+.3g}, untested ({p_text(test)})"
    if not test["significant"]:
        return f"no significant difference ({p_text(test)})"
    a_better = (test["delta"] < 0) == better_when_lower
    holm = " (not after Holm)" if test.get("significant_holm") is False else ""
    return f"{'A' if a_better else 'B'} better ({p_text(test)}){holm}"


def rank_correlation(x: Sequence[float], y: Sequence[float], n_boot: int = DEFAULT_BOOTSTRAP,
                     seed: int = 0, level: float = LEVEL) -> dict[str, Any]:
    """Spearman's rho of paired values with a percentile bootstrap CI over the pairs
    (scipy.stats.spearmanr on each resample; resamples without two distinct values of
    either side are dropped), and scipy's p-value."""
    from scipy import stats

    a, b = np.asarray(x, np.float64), np.asarray(y, np.float64)
    rho, p = stats.spearmanr(a, b)
    rng = np.random.default_rng(seed)
    boots = []
    for _ in range(n_boot):
        idx = rng.integers(0, len(a), len(a))
        if len(set(a[idx])) > 1 and len(set(b[idx])) > 1:
            boots.append(stats.spearmanr(a[idx], b[idx])[0])
    lo, hi = (np.quantile(boots, [(1 - level) / 2, (1 + level) / 2]) if boots
              else (math.nan, math.nan))
    return {"rho": float(rho), "p": float(p), "ci": [float(lo), float(hi)], "n": len(a)}
