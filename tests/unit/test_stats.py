"""Confidence intervals and paired tests on data with known answers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from qcal.eval.stats import (
    holm_adjust,
    mean_ci,
    paired_mean_test,
    paired_ppl_test,
    rank_shift_test,
    seeded_ppl_test,
    two_sample_mean_test,
    verdict,
    with_holm,
)

pytestmark = pytest.mark.unit


def test_mean_ci_matches_the_t_interval() -> None:
    ci = mean_ci([10.0, 12.0, 14.0])
    # mean 12, sd 2, t(0.975, 2) = 4.3027: half-width 4.3027 * 2 / sqrt(3)
    assert ci["mean"] == 12.0 and ci["sd"] == pytest.approx(2.0)
    assert ci["half_width"] == pytest.approx(4.302653 * 2 / math.sqrt(3), rel=1e-5)
    assert mean_ci([5.0])["half_width"] is None


def test_identical_models_are_not_different() -> None:
    nll = list(np.random.default_rng(0).uniform(300, 400, size=40))
    test = paired_ppl_test(nll, [100] * 40, nll, [100] * 40)
    # Every paired difference is 0: the bootstrap cannot vary, so there is no test at all.
    assert test["delta"] == 0 and not test["significant"] and test["p"] is None
    assert "cannot vary" in test["no_test"] and test["units"] == 40


def test_a_consistently_better_model_is_significant() -> None:
    rng = np.random.default_rng(1)
    b = rng.uniform(300, 400, size=40)
    a = b - 5 - rng.uniform(0, 1, size=40)  # every window 5-6 nats lower in total
    test = paired_ppl_test(list(a), [100] * 40, list(b), [100] * 40)
    assert test["delta"] < 0 and test["significant"] and test["p"] < 0.01
    assert test["ci_high"] < 0 and test["effect_dz"] < -2
    assert test["ppl_a"] == pytest.approx(math.exp(a.sum() / 4000))
    assert verdict(test).startswith("A better")


def test_noise_without_a_shift_is_not_significant() -> None:
    rng = np.random.default_rng(2)
    b = rng.uniform(300, 400, size=30)
    a = b + rng.normal(0, 5, size=30)
    a = a - (a - b).mean()  # zero mean difference by construction
    test = paired_ppl_test(list(a), [100] * 30, list(b), [100] * 30)
    assert not test["significant"] and test["p"] > 0.2


def test_paired_mean_test_on_items() -> None:
    a = [1, 1, 1, 0, 1, 1, 1, 1, 0, 1] * 5
    b = [0, 1, 0, 0, 1, 0, 1, 0, 0, 1] * 5
    test = paired_mean_test(a, b)
    assert test["delta"] == pytest.approx(0.4) and test["significant"]
    assert test["p_ttest"] < 1e-4
    with pytest.raises(ValueError, match="same items"):
        paired_mean_test([1, 0], [1])


def test_two_sample_test_matches_welch_and_sees_a_shift() -> None:
    from scipy import stats

    rng = np.random.default_rng(4)
    low, rest = rng.normal(-0.3, 1.0, 120), rng.normal(0.0, 0.5, 360)
    test = two_sample_mean_test(low, rest)
    assert test["delta"] == pytest.approx(low.mean() - rest.mean())
    assert test["p_ttest"] == pytest.approx(stats.ttest_ind(low, rest, equal_var=False).pvalue)
    assert test["significant"] and test["ci_low"] < test["delta"] < test["ci_high"] < 0
    assert test["units"] == [120, 360] and test["effect_d"] < 0
    same = two_sample_mean_test(rng.normal(0, 1, 200), rng.normal(0, 1, 300))
    assert not same["significant"] and same["p_ttest"] > 0.05
    flat = two_sample_mean_test([1.0, 1.0], [1.0, 1.0, 1.0])
    assert flat["p_ttest"] is None and flat["effect_d"] is None and not flat["significant"]
    with pytest.raises(ValueError, match="two values"):
        two_sample_mean_test([1.0], [1.0, 2.0])


def test_rank_test_matches_mann_whitney_and_resists_one_extreme_value() -> None:
    from scipy import stats

    rng = np.random.default_rng(6)
    low, rest = rng.normal(-0.5, 1.0, 100), rng.normal(0.0, 1.0, 300)
    test = rank_shift_test(low, rest)
    u = stats.mannwhitneyu(low, rest, alternative="two-sided", method="asymptotic")
    assert test["p"] == pytest.approx(u.pvalue) and test["significant"]
    assert test["effect_r"] == pytest.approx(2 * u.statistic / (100 * 300) - 1)
    assert test["effect_r"] < 0
    assert test["delta"] == pytest.approx(np.median(low[:, None] - rest[None, :]))
    assert -0.8 < test["delta"] < -0.2 and test["units"] == [100, 300]
    # One huge value moves the mean test's verdict, not the rank test's.
    same_a, same_b = rng.normal(0, 1, 100), rng.normal(0, 1, 300)
    same_a[0] = -1e4
    assert two_sample_mean_test(same_a, same_b)["delta"] < -50
    assert not rank_shift_test(same_a, same_b)["significant"]
    tied = rank_shift_test([2.0, 2.0], [2.0, 2.0, 2.0])
    assert tied["p"] == 1.0 and tied["effect_r"] == 0.0 and tied["delta"] == 0.0
    with pytest.raises(ValueError, match="two values"):
        rank_shift_test([1.0, 2.0], [1.0])


def test_rank_shift_is_sampled_for_large_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    import qcal.eval.stats as stats_module

    monkeypatch.setattr(stats_module, "MAX_SHIFT_PAIRS", 5_000)
    rng = np.random.default_rng(7)
    a, b = rng.normal(1.0, 0.1, 200), rng.normal(0.0, 0.1, 200)
    test = stats_module.rank_shift_test(a, b)
    assert test["delta"] == pytest.approx(1.0, abs=0.05) and test["effect_r"] == 1.0


def test_paired_test_refuses_different_windows() -> None:
    with pytest.raises(ValueError, match="same windows"):
        paired_ppl_test([1.0, 2.0], [10, 10], [1.0, 2.0], [10, 11])


def _seeded(shifts: list[float], base: np.ndarray) -> list[list[float]]:
    """Per-seed window NLLs: the same windows, each seed's model shifted as a whole."""
    return [list(base + s) for s in shifts]


def test_seeded_test_of_identical_settings_finds_nothing() -> None:
    base = np.random.default_rng(2).uniform(300, 400, size=30)
    nll = _seeded([0.0, 1.0, -1.0], base)
    test = seeded_ppl_test(nll, nll, [100] * 30)
    assert test["delta"] == pytest.approx(0.0) and not test["significant"]


def test_seeded_test_sees_a_shift_that_every_seed_shares() -> None:
    base = np.random.default_rng(3).uniform(300, 400, size=30)
    a, b = _seeded([-20.0, -21.0, -19.0], base), _seeded([0.0, 1.0, -1.0], base)
    test = seeded_ppl_test(a, b, [100] * 30)
    assert test["significant"] and test["ci_high"] < 0 and test["p"] < 0.01
    # The setting's perplexity is the mean over its seeds' perplexities.
    expected = np.mean([math.exp((base + s).sum() / 3000) for s in (-20.0, -21.0, -19.0)])
    assert test["ppl_a"] == pytest.approx(expected) and len(test["seeds_a"]) == 3


def test_seed_to_seed_spread_widens_the_interval_a_window_test_would_give() -> None:
    # The seeds disagree by far more than the mean shift: averaging them first and testing
    # over windows alone would call the shift significant; over seeds too it is not.
    base = np.random.default_rng(4).uniform(300, 400, size=30)
    a = _seeded([-40.0, 0.0, 34.0], base)
    b = _seeded([-30.0, 0.0, 36.0], base)
    windows_only = paired_ppl_test(list(np.mean(a, 0)), [100] * 30, list(np.mean(b, 0)),
                                   [100] * 30)
    seeded = seeded_ppl_test(a, b, [100] * 30)
    assert windows_only["significant"] and not seeded["significant"]
    assert seeded["ci_high"] - seeded["ci_low"] > 5 * (windows_only["ci_high"]
                                                        - windows_only["ci_low"])


def test_seeded_test_refuses_different_windows() -> None:
    with pytest.raises(ValueError, match="same windows"):
        seeded_ppl_test([[1.0, 2.0]], [[1.0, 2.0, 3.0]], [10, 10])


def test_holm_adjusts_step_down_in_input_order() -> None:
    # sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 = 0.02, 0.03, 0.06, 0.04; the last is
    # raised to 0.06 so the adjusted values never decrease along the sorted order.
    assert holm_adjust([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm_adjust([0.5, 0.6]) == [1.0, 1.0]   # capped at 1
    assert holm_adjust([0.03]) == [0.03]           # one test: unchanged
    assert holm_adjust([]) == []
    with pytest.raises(ValueError, match="p-values"):
        holm_adjust([0.2, 1.5])


def test_with_holm_marks_what_survives_and_verdict_says_so() -> None:
    tests = [{"p": 0.001, "significant": True, "delta": -1.0},
             {"p_bootstrap": 0.03, "significant": True, "delta": 2.0},
             {"p": 0.2, "significant": False, "delta": 0.5}]
    adjusted = with_holm(tests)
    assert [t["p_holm"] for t in adjusted] == pytest.approx([0.003, 0.06, 0.2])
    assert [t["significant_holm"] for t in adjusted] == [True, False, False]
    assert "p_holm" not in tests[0]                 # the input is left alone
    assert verdict(adjusted[0]) == "A better (p=0.001)"
    assert verdict(adjusted[1]) == "B better (p=0.03) (not after Holm)"
    assert verdict(tests[1]) == "B better (p=0.03)"


def test_multiple_comparisons_names_what_holm_removes() -> None:
    from qcal.grid.evidence import multiple_comparisons

    tests = with_holm([{"p": 0.001, "significant": True, "delta": -1.0, "n": "a"},
                       {"p": 0.03, "significant": True, "delta": 2.0, "n": "b"},
                       {"p": 0.2, "significant": False, "delta": 0.5, "n": "c"}])
    text = multiple_comparisons("x", tests, lambda t: t["n"])
    assert text == ("- **x, multiple comparisons**: 2 of 3 tests are significant at 95% "
                    "uncorrected (smallest p 0.001); after Holm's correction over all 3, 1 "
                    "remains (a (p_Holm=0.003)); no longer significant: b.")
    none_kept = multiple_comparisons("x", with_holm(tests[1:]), lambda t: t["n"])
    assert none_kept.endswith("0 remain; no longer significant: b; none of the differences "
                              "is established on its own.")
    assert multiple_comparisons("x", [], str) is None


def test_too_few_units_report_the_effect_without_a_p_value() -> None:
    from qcal.eval.stats import MIN_UNITS, p_text

    rng = np.random.default_rng(1)
    a = rng.uniform(300, 400, size=2)
    test = paired_ppl_test(list(a), [100, 100], list(a + 40), [100, 100])  # A clearly lower
    assert test["delta"] < 0 and test["units"] == 2 and test["unit"] == "windows"
    assert test["p"] is None and test["ci_low"] is None and not test["significant"]
    assert "only 2 paired windows" in test["no_test"] and str(MIN_UNITS) in test["no_test"]
    text = verdict(test)
    assert "better" not in text and "untested" in text and "p=" not in text
    items = paired_mean_test([1, 0, 1, 1], [0, 0, 0, 1])
    assert items["p_bootstrap"] is None and items["p_ttest"] is None and items["units"] == 4
    # At the threshold the test runs, and its p always travels with the unit count.
    enough = paired_ppl_test(list(rng.uniform(300, 400, MIN_UNITS)), [100] * MIN_UNITS,
                             list(rng.uniform(300, 400, MIN_UNITS)), [100] * MIN_UNITS)
    assert enough["p"] is not None and f"{MIN_UNITS} windows" in p_text(enough)
    assert f"{MIN_UNITS} windows" in verdict(enough)
    # An untested comparison stays out of the Holm family.
    family = with_holm([test, {**enough, "p": 0.01, "significant": True}])
    assert family[0]["p_holm"] is None and not family[0]["significant_holm"]
    assert family[1]["p_holm"] == pytest.approx(0.01)
