"""The multilingual study's comparisons on synthetic cells with known answers."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from qcal.studies.multilingual import (
    against_rtn,
    by_setting,
    findings,
    holm_method_family,
    matched_language,
    versus_baseline,
)

pytestmark = pytest.mark.unit

LANGS = ["en", "de"]
WINDOWS = 12


def _cell(selector: str | None, method: str, seed: int | None,
          nll_per_token: dict[str, float]) -> dict:
    """A cell whose windows have the given mean NLL per token in each language, with a
    little window-to-window and seed-to-seed noise."""
    rng = np.random.default_rng(zlib.crc32(f"{selector}{method}{seed}".encode()))
    rows = {}
    for lang, level in nll_per_token.items():
        nll = (level + 0.01 * rng.standard_normal(WINDOWS)) * 100
        rows[lang] = {"ppl": float(np.exp(nll.sum() / (100 * WINDOWS))),
                      "window_nll": [float(x) for x in nll], "window_tokens": [100] * WINDOWS}
    axes = {} if seed is None else {"seed": seed}
    return {"selector": selector, "method": method, "axes": axes,
            "eval": {"perplexity": {"model": rows}}}


def _grid(matched_gain: float, en_penalty: float) -> dict[str, dict]:
    """Each ml:<lang> set is `matched_gain` nats/token better on its own language; every
    set but English lowers English-only calibration's penalty on German."""
    cells = {"none__rtn": _cell(None, "rtn", None, {"en": 3.2, "de": 3.6})}
    for selector in ("ml:en", "ml:de", "ml:ru", "mix:study10"):
        for seed in (0, 1, 2):
            own = selector.split(":")[1]
            levels = {lang: 3.0 - (matched_gain if lang == own else 0.0) for lang in LANGS}
            if selector == "ml:en":
                levels["de"] += en_penalty
            cells[f"{selector}__gptq__s{seed}"] = _cell(selector, "gptq", seed, levels)
    return cells


def test_matched_language_ranks_and_tests_each_language_on_its_own_windows() -> None:
    groups = by_setting(_grid(matched_gain=0.1, en_penalty=0.5))
    assert [r["axes"]["seed"] for r in groups[("gptq", "ml:en")]] == [0, 1, 2]
    matched = {m["lang"]: m for m in matched_language(groups, "gptq", LANGS)}
    assert set(matched) == {"en", "de"}
    for lang, other in (("en", {"ml:de", "ml:ru"}), ("de", {"ml:en", "ml:ru"})):
        assert matched[lang]["rank"] == 1 and matched[lang]["of"] == 3
        assert set(matched[lang]["significantly_better_than"]) == other
        assert matched[lang]["significantly_worse_than"] == []


def test_a_matched_set_that_loses_is_reported_as_worse() -> None:
    groups = by_setting(_grid(matched_gain=-0.1, en_penalty=0.0))  # own language hurts
    matched = {m["lang"]: m for m in matched_language(groups, "gptq", LANGS)}
    assert matched["de"]["rank"] == 3
    assert set(matched["de"]["significantly_worse_than"]) == {"ml:en", "ml:ru"}
    text = " ".join(findings("gptq", [], list(matched.values()), []))
    assert "for 0 of 2 languages" in text and "disagrees" in text


def test_english_only_and_rtn_comparisons_and_their_findings() -> None:
    cells = _grid(matched_gain=0.0, en_penalty=0.5)
    groups = by_setting(cells)
    vs_en = {t["a"]: t for t in versus_baseline(groups, "gptq", "ml:en", ["ml:de", "mix:study10"],
                                              LANGS)}
    assert vs_en["mix:study10"]["significant"] and vs_en["mix:study10"]["delta"] < 0
    vs_rtn = {t["a"]: t for t in against_rtn(cells, groups, "gptq", LANGS)}
    # RTN is 3.2/3.6 nats per token, the sets 3.0 except English-only's German at 3.5.
    assert vs_rtn["ml:de"]["delta"] < 0 and vs_rtn["ml:de"]["significant"]
    assert vs_rtn["ml:en"]["ppl_a"] == pytest.approx(np.exp(3.25), rel=0.01)
    text = "\n".join(findings("gptq", list(vs_en.values()), [], list(vs_rtn.values())))
    assert "1 of 1 mixes are significantly better" in text and "agrees with" in text


def test_one_holm_family_per_method_keeps_the_shapes() -> None:
    cells = _grid(matched_gain=0.3, en_penalty=0.5)
    groups = by_setting(cells)
    vs_en = versus_baseline(groups, "gptq", "ml:en", ["ml:de", "mix:study10"], LANGS)
    matched = matched_language(groups, "gptq", LANGS)
    vs_rtn = against_rtn(cells, groups, "gptq", LANGS)
    h_en, h_matched, h_rtn = holm_method_family(vs_en, matched, vs_rtn)
    assert [t["a"] for t in h_en] == [t["a"] for t in vs_en]
    assert [len(m["tests"]) for m in h_matched] == [len(m["tests"]) for m in matched]
    family = h_en + h_rtn + [t for m in h_matched for t in m["tests"]]
    m = len(family)
    smallest = min(family, key=lambda t: t["p"])
    assert smallest["p_holm"] == pytest.approx(min(1.0, smallest["p"] * m))
    assert all(t["p_holm"] >= t["p"] for t in family)
    assert all(t["lang"] in LANGS for mm in h_matched for t in mm["tests"])
    text = "\n".join(findings("gptq", h_en, h_matched, h_rtn))
    raw = sum(t["significant"] for t in family)
    kept = sum(t["significant_holm"] for t in family)
    assert f"{raw} of {m} tests are significant at 95% uncorrected" in text
    assert f"after Holm's correction over all {m}, {kept} remain" in text
    assert kept > 5 and "p_Holm=" not in text  # too many survivors to name
    lost = [t for t in family if t["significant"] and not t["significant_holm"]]
    assert ("no longer significant" in text) == bool(lost)
