"""The confidence study's drift numbers on synthetic items with known answers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from qcal.studies.confidence import findings, quartile_claim, study

pytestmark = pytest.mark.unit

N = 400


def _items(p_gold: np.ndarray) -> list[dict]:
    """Two-choice items, gold = choice 0, with the given gold probabilities."""
    return [{"lls": [math.log(p), math.log(1 - p)], "gold": 0} for p in p_gold]


def _cell(method: str | None, seed: int | None, p_gold: np.ndarray) -> dict:
    acc = float((p_gold > 0.5).mean())
    return {"method": method, "selector": None if method in (None, "rtn") else "random",
            "axes": {} if seed is None else {"seed": seed}, "float_cell": "float",
            "items": {"boolq": _items(p_gold)},
            "eval": {"lm_eval": {"results": {"model": {"boolq": {
                "sample_len": N, "acc,none": acc, "acc_stderr,none": 0.02}}}}}}


def _cells(drop_where_unsure: bool) -> dict[str, dict]:
    base = np.random.default_rng(0).uniform(0.05, 0.95, size=N)
    cells = {"float": _cell(None, None, base)}
    order = np.argsort(base)
    for seed in (0, 1, 2):
        p = base.copy()
        hit = order[: N // 4] if drop_where_unsure else order[-N // 4:]
        p[hit] = np.clip(p[hit] - 0.2 - 0.01 * seed, 0.01, 0.99)
        cells[f"random__gptq__s{seed}"] = _cell("gptq", seed, p)
    return cells


def test_drop_where_the_float_model_was_unsure_agrees_with_the_claim() -> None:
    out = study(_cells(drop_where_unsure=True), ["boolq"])["boolq"]
    assert out["float"]["lm_eval"]["n"] == N and out["gptq"]["seeds"] == 3
    drift = out["gptq"]["drift"]
    assert drift["conf_true_test"]["significant"] and drift["conf_true_test"]["delta"] < 0
    quartiles = drift["drift"]["by_base_conf_quantile"]
    assert quartiles[0]["delta_conf_true"] < -0.1 and abs(quartiles[3]["delta_conf_true"]) < 1e-9
    assert drift["quartile_tests"][0]["significant"]
    assert drift["claim"] == "agrees" and drift["claim_log_odds"] == "agrees"
    assert drift["claim_ranks"] == drift["claim_log_odds_ranks"] == "agrees"
    ranks = drift["unsure_vs_rest"]["log_odds_ranks"]
    assert ranks["delta"] < 0 and ranks["effect_r"] < -0.5 and ranks["significant_holm"]
    contrast = drift["unsure_vs_rest"]["p"]
    assert contrast["delta"] < -0.1 and contrast["significant_holm"]
    # Seeds differ by 0.01 in their drop: the interval over seeds has a width.
    assert out["gptq"]["metrics"]["conf_true"]["n"] == 3
    assert out["gptq"]["metrics"]["conf_true"]["half_width"] > 0


def test_drop_where_the_float_model_was_sure_disagrees() -> None:
    out = study(_cells(drop_where_unsure=False), ["boolq"])["boolq"]
    assert out["gptq"]["drift"]["claim"] == "disagrees"
    assert out["gptq"]["drift"]["claim_log_odds"] == "disagrees"
    assert out["gptq"]["drift"]["claim_log_odds_ranks"] == "disagrees"


def test_a_uniform_shift_in_log_odds_disagrees_on_probabilities_only() -> None:
    """The floor and ceiling of probabilities: lowering every item's log-odds by the same
    amount takes least from the items near p = 0, so on probabilities the least confident
    quartile 'loses less' (disagrees), while on log-odds nothing sets it apart."""
    rng = np.random.default_rng(5)
    base = rng.uniform(0.02, 0.98, size=N)
    logit = np.log(base / (1 - base))
    cells = {"float": _cell(None, None, base)}
    for seed in (0, 1, 2):
        shifted = logit - 0.6 + rng.normal(0, 0.2, size=N)
        cells[f"random__gptq__s{seed}"] = _cell("gptq", seed, 1 / (1 + np.exp(-shifted)))
    drift = study(cells, ["boolq"])["boolq"]["gptq"]["drift"]
    assert drift["conf_true_test"]["delta"] < 0 and drift["conf_true_test"]["significant_holm"]
    assert drift["claim"] == "disagrees"
    assert drift["claim_log_odds"] == "not shown"
    assert drift["claim_log_odds_ranks"] == "not shown"
    quartiles = drift["drift"]["by_base_conf_quantile"]
    assert all(abs(q["delta_log_odds_true"] + 0.6) < 0.1 for q in quartiles)


def test_no_change_is_no_drop() -> None:
    base = np.random.default_rng(1).uniform(0.05, 0.95, size=N)
    cells = {"float": _cell(None, None, base), "none__rtn": _cell("rtn", None, base)}
    drift = study(cells, ["boolq"])["boolq"]["rtn"]["drift"]
    assert quartile_claim(drift) == "no drop" and not drift["acc_test"]["significant"]
    assert drift["claim"] == drift["claim_log_odds"] == drift["claim_ranks"] == "no drop"


def test_gold_confidence_tests_are_one_holm_family() -> None:
    cells = _cells(drop_where_unsure=True)
    noise = np.random.default_rng(3).normal(0, 0.01, size=N)
    base = np.exp(np.array([item["lls"][0] for item in cells["float"]["items"]["boolq"]]))
    cells["none__rtn"] = _cell("rtn", None, np.clip(base + noise, 0.01, 0.99))
    out = study(cells, ["boolq"])["boolq"]
    gptq, rtn = out["gptq"]["drift"]["conf_true_test"], out["rtn"]["drift"]["conf_true_test"]
    low, high = sorted((gptq, rtn), key=lambda t: t["p_ttest"])
    assert low["p_holm"] == pytest.approx(min(1.0, 2 * low["p_ttest"]))
    assert high["p_holm"] == pytest.approx(max(low["p_holm"], high["p_ttest"]))
    assert gptq["p_holm"] < 0.05  # the real drop survives the correction
    assert rtn["p_ttest"] > 0.05  # noise around zero is no drop
    text = "\n".join(findings(study(cells, ["boolq"])))
    assert "Of 1 tasks, in probability: agrees 1, disagrees 0, not shown 0, no drop 0 " \
           "(boolq: agrees); in log-odds: agrees 1," in text
    assert "- **ranks**: the rank test (Mann-Whitney U on the same changes, Holm) reaches " \
           "the t-test's verdict in 2 of the 2 (significant drop x scale) cases" in text
    assert "- **rtn**: does the float model's least confident quartile lose more" in text
    assert "(boolq: no drop)" in text
    assert "1 of 2 task x model gold-answer confidence changes are drops with t-test p < " \
           "0.05; 1 remains after Holm's correction over all 2." in text


def test_a_few_extreme_items_are_named_where_ranks_and_means_disagree() -> None:
    """Ten unsure items collapse (gold log-odds -25) while every other item loses a little:
    the least confident quartile's *mean* log-odds change is the larger loss, but most of its
    items lose less than the rest, and the rank test says so."""
    rng = np.random.default_rng(8)
    base = rng.uniform(0.1, 0.9, size=N)
    logit = np.log(base / (1 - base))
    order = np.argsort(base)
    cells = {"float": _cell(None, None, base)}
    for seed in (0, 1, 2):
        shifted = logit.copy()
        shifted[order[N // 4:]] -= 0.3 + rng.normal(0, 0.02, size=N - N // 4)
        shifted[order[:N // 4]] += rng.normal(0, 0.02, size=N // 4)
        shifted[order[:10]] -= 25.0
        cells[f"random__gptq__s{seed}"] = _cell("gptq", seed, 1 / (1 + np.exp(-shifted)))
    out = study(cells, ["boolq"])
    drift = out["boolq"]["gptq"]["drift"]
    assert drift["claim_log_odds"] == "agrees"
    assert drift["claim_log_odds_ranks"] == "disagrees"
    text = "\n".join(findings(out))
    assert "it differs in boolq/gptq in log-odds: agrees on means, disagrees on ranks" in text
