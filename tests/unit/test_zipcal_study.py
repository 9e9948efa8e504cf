"""The ZipCal study's comparisons on synthetic cells with known answers."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from qcal.studies.zipcal import (
    by_budget,
    distinct_sets,
    equivalence,
    findings,
    pair_tests,
    selection_cost,
)

pytestmark = pytest.mark.unit

WINDOWS = 40


def _cell(selector: str, nsamples: int, seed: int, level: float, seconds: float) -> dict:
    rng = np.random.default_rng(zlib.crc32(f"{selector}{nsamples}{seed}".encode()))
    nll = (level + 0.002 * rng.standard_normal(WINDOWS)) * 100
    row = {"ppl": float(np.exp(nll.sum() / (100 * WINDOWS))),
           "window_nll": [float(x) for x in nll], "window_tokens": [100] * WINDOWS}
    return {"selector": selector, "method": "gptq", "axes": {"seed": seed, "nsamples": nsamples},
            "calibration": {"nsamples": nsamples, "timing": {"selection_seconds": seconds}},
            "eval": {"perplexity": {"model": {"en": row}}}}


def _cells(zipf_level: float) -> dict[str, dict]:
    levels = {"random": 3.1, "zipf": zipf_level, "perplexity": 3.0}
    seconds = {"random": 0.001, "zipf": 0.5, "perplexity": 50.0}
    return {f"{s}__gptq__n{n}__s{seed}": _cell(s, n, seed, levels[s], seconds[s])
            for s in levels for n in (16, 64) for seed in (0, 1, 2)}


@pytest.mark.parametrize(("low", "high", "significant", "delta", "verdict"), [
    (-0.05, 0.08, False, 0.01, "matches"),      # within +-1% of 10
    (-0.5, -0.2, True, -0.3, "beats"),
    (0.2, 0.5, True, 0.3, "trails"),
    (-0.3, 0.4, False, 0.05, "inconclusive"),   # no difference shown, none excluded either
])
def test_equivalence_verdicts(low, high, significant, delta, verdict) -> None:
    test = {"ci_low": low, "ci_high": high, "ppl_b": 10.0, "significant": significant,
            "delta": delta}
    assert equivalence(test) == verdict


def test_a_difference_that_does_not_survive_holm_is_not_beats() -> None:
    test = {"ci_low": -0.5, "ci_high": -0.2, "ppl_b": 10.0, "significant": True, "delta": -0.3}
    assert equivalence({**test, "significant_holm": False}) == "inconclusive"
    assert equivalence({**test, "significant_holm": True}) == "beats"


def test_zipf_equal_to_perplexity_matches_and_beats_random() -> None:
    groups = by_budget(_cells(zipf_level=3.0))
    assert sorted({(m, n) for m, n, _ in groups}) == [("gptq", 16), ("gptq", 64)]
    tests = pair_tests(groups, ["en"])
    zp = [t for t in tests if (t["a"], t["b"]) == ("zipf", "perplexity")]
    zr = [t for t in tests if (t["a"], t["b"]) == ("zipf", "random")]
    assert [t["equivalence"] for t in zp] == ["matches", "matches"]
    assert all(t["significant"] and t["delta"] < 0 for t in zr)
    cost = selection_cost(groups)
    assert cost["perplexity"] == {16: 50.0, 64: 50.0} and cost["zipf"][16] == 0.5
    text = "\n".join(findings(tests, cost))
    assert "in 2 of 2 settings; this agrees" in text and "n=16: 100x" in text
    # zipf and perplexity (3.0 nats) both beat random (3.1) at both budgets, clearly enough
    # to survive Holm over the six tests; zipf vs perplexity is not significant.
    assert all("p_holm" in t for t in tests)
    assert "4 of 6 tests are significant at 95% uncorrected" in text
    assert "after Holm's correction over all 6, 4 remain (zipf vs random gptq n=16" in text
    assert "no longer significant" not in text
    groups[("gptq", 16, "zipf")][0]["calibration"]["timing"]["load_average"] = [1.5, 1.0, 1.0]
    groups[("gptq", 64, "perplexity")][1]["calibration"]["timing"]["load_average"] = [2.25, 2, 2]
    assert "load average 1.5-2.2)" in "\n".join(findings(tests, cost, groups))
    groups[("gptq", 16, "perplexity")][0]["calibration"]["selection"] = {
        "reference_load_seconds": 1.25}
    assert "load average 1.5-2.2; loading the reference model took 1.2 s of that)" in \
        "\n".join(findings(tests, cost, groups))


def test_zipf_clearly_worse_trails_and_disagrees() -> None:
    tests = pair_tests(by_budget(_cells(zipf_level=3.05)), ["en"])
    zp = [t for t in tests if (t["a"], t["b"]) == ("zipf", "perplexity")]
    assert [t["equivalence"] for t in zp] == ["trails", "trails"]
    assert "this disagrees" in findings(tests, {})[0]


def test_seeds_that_drew_one_set_are_named() -> None:
    cells = _cells(zipf_level=3.0)
    for key, rec in cells.items():  # random draws a new set per seed; zipf the same one
        rec["calibration"]["digest"] = key.split("__")[2] if key.startswith("zipf") else key
    groups = by_budget(cells)
    assert distinct_sets(groups[("gptq", 16, "random")]) == 3
    assert distinct_sets(groups[("gptq", 16, "zipf")]) == 1
    note = [line for line in findings(pair_tests(groups, ["en"]), {}, groups)
            if line.startswith("- **seeds**")]
    assert note == ["- **seeds**: every seed drew the same calibration set for zipf (gptq n=16), "
                    "zipf (gptq n=64); their intervals reflect the evaluation windows alone."]
