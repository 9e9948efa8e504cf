"""The multilingual calibration study's comparisons, from the cells of a seeded grid.

Pure functions of cell records (no files): group cells by (method, calibration set) over
seeds, test every set against English-only calibration and against RTN on all languages'
windows pooled, test language-matched calibration on each language's own windows
(`qcal.eval.stats.seeded_ppl_test`: windows paired, seeds resampled per side), and turn
the results into findings set against the published ones.
qcal.studies.multilingual_report renders them.
"""

from __future__ import annotations

from collections import defaultdict
from statistics import mean
from typing import Any

from qcal.eval.stats import p_text, seeded_ppl_test
from qcal.grid.evidence import holm_families, model_ppl, multiple_comparisons, seed_sorted

SINGLE = ["ml:en", "ml:de", "ml:ru", "ml:zh", "ml:ar"]
MIXES = ["mix:study10", "mix:en-heavy", "mix:study5"]
METHODS = ["gptq", "awq"]
PUBLISHED_MIX_GAIN = 3.52  # ppl, multilingual mixes vs English-only on 8B models


def by_setting(cells: dict[str, dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """{(method, selector): [cell per seed, in seed order]} for the calibrated methods."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for rec in cells.values():
        if rec.get("method") in METHODS and rec.get("selector"):
            groups[(rec["method"], rec["selector"])].append(rec)
    return seed_sorted(groups)


def has_windows(recs: list[dict[str, Any]], langs: list[str]) -> bool:
    """Whether every cell recorded per-window NLLs for `langs` (older cells did not)."""
    return all(model_ppl(r).get(lang, {}).get("window_nll") for r in recs for lang in langs)


def window_nll(recs: list[dict[str, Any]], langs: list[str]) -> tuple[list[list[float]], list[int]]:
    """[seeds][windows] summed NLLs over the windows of `langs` (concatenated), and tokens."""
    nll = [[x for lang in langs for x in model_ppl(r)[lang]["window_nll"]] for r in recs]
    tokens = [t for lang in langs for t in model_ppl(recs[0])[lang]["window_tokens"]]
    return nll, tokens


def seeded_test(a_recs: list[dict[str, Any]], b_recs: list[dict[str, Any]],
                langs: list[str]) -> dict[str, Any] | None:
    """`seeded_ppl_test` of two settings on the windows of `langs` pooled; None when a cell
    has no per-window NLLs to pair."""
    if not has_windows(a_recs + b_recs, langs):
        return None
    a, tokens = window_nll(a_recs, langs)
    b, _ = window_nll(b_recs, langs)
    return seeded_ppl_test(a, b, tokens)


def versus_baseline(groups: dict, method: str, baseline: str, candidates: list[str],
                  langs: list[str]) -> list[dict[str, Any]]:
    """Each candidate vs `baseline` on the windows of every language pooled."""
    base = groups.get((method, baseline))
    out = []
    for selector in candidates:
        recs = groups.get((method, selector))
        test = seeded_test(recs, base, langs) if recs and base and selector != baseline \
            else None
        if test is not None:
            out.append({"method": method, "a": selector, "b": baseline, **test})
    return out


def matched_language(groups: dict, method: str, langs: list[str]) -> list[dict[str, Any]]:
    """For each evaluation language with a calibration set in it: that set vs every other
    single-language set, on that language's windows."""
    out = []
    for lang in langs:
        own = f"ml:{lang}"
        if own not in SINGLE or not groups.get((method, own)):
            continue
        tests = versus_baseline(groups, method, own, SINGLE, [lang])
        # versus_baseline compares other (A) vs own (B): own wins where A is worse.
        wins = [t["a"] for t in tests if t["significant"] and t["delta"] > 0]
        losses = [t["a"] for t in tests if t["significant"] and t["delta"] < 0]
        means = {s: mean(model_ppl(r)[lang]["ppl"] for r in groups[(method, s)])
                 for s in SINGLE if groups.get((method, s))}
        rank = sorted(means, key=means.get).index(own) + 1
        tests = [{**t, "lang": lang} for t in tests]
        out.append({"lang": lang, "rank": rank, "of": len(means), "significantly_better_than":
                    wins, "significantly_worse_than": losses, "compared": len(tests),
                    "tests": tests})
    return out


def against_rtn(cells: dict[str, dict[str, Any]], groups: dict, method: str,
                langs: list[str]) -> list[dict[str, Any]]:
    """Each calibration set vs RTN (no calibration, one run) on all windows pooled."""
    rtn = cells.get("none__rtn")
    if rtn is None:
        return []
    out = []
    for selector in SINGLE + MIXES:
        recs = groups.get((method, selector))
        test = seeded_test(recs, [rtn], langs) if recs else None
        if test is not None:
            out.append({"method": method, "a": selector, "b": "rtn", **test})
    return out


def holm_method_family(vs_en: list[dict[str, Any]], matched: list[dict[str, Any]],
                       vs_rtn: list[dict[str, Any]]
                       ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """The three kinds of test of one method as one Holm family (every test gets `p_holm`
    and `significant_holm`), returned in the shapes they came in."""
    vs_en, vs_rtn, *per_lang = holm_families(vs_en, vs_rtn, *[m["tests"] for m in matched])
    return vs_en, [{**m, "tests": t} for m, t in zip(matched, per_lang, strict=True)], vs_rtn


def test_name(test: dict[str, Any]) -> str:
    where = f" on {test['lang']}" if "lang" in test else ""
    return f"{test['a']} vs {test['b']}{where}"


def findings(method: str, vs_en: list[dict[str, Any]], matched: list[dict[str, Any]],
             vs_rtn: list[dict[str, Any]]) -> list[str]:
    out = []
    if vs_rtn:
        worse = [t["a"] for t in vs_rtn if t["significant"] and t["delta"] > 0]
        better = [t["a"] for t in vs_rtn if t["significant"] and t["delta"] < 0]
        out.append(
            f"- **{method} vs RTN** (plain rounding, no calibration data): on all languages' "
            f"windows pooled, {len(better)} of {len(vs_rtn)} calibration sets are significantly "
            f"better than RTN ({', '.join(better) or 'none'}) and {len(worse)} significantly "
            f"worse ({', '.join(worse) or 'none'})"
            + (": calibrating on one language can cost the others more than it gains."
               if worse else "."))
    mixes = [t for t in vs_en if t["a"] in MIXES]
    if mixes:
        best = min(mixes, key=lambda t: t["delta"])
        better = [t["a"] for t in mixes if t["significant"] and t["delta"] < 0]
        agrees = "agrees" if better else "does not agree"
        out.append(
            f"- **{method}, mixes vs English-only**: {len(better)} of {len(mixes)} mixes are "
            f"significantly better than English-only calibration on the pooled windows of all "
            f"languages; the best, {best['a']}, by {-best['delta']:.2f} ppl ("
            + (f"95% CI [{-best['ci_high']:.2f}, {-best['ci_low']:.2f}], {p_text(best)}"
               if best.get("no_test") is None else p_text(best))
            + f"). This {agrees} "
            f"with the published finding that mixes beat English-only calibration (by up to "
            f"{PUBLISHED_MIX_GAIN} ppl on 8B models; ours has 135M-270M parameters, so only the "
            "direction is comparable).")
    if matched:
        best_own = sum(m["rank"] == 1 for m in matched)
        beats_all = [m["lang"] for m in matched
                     if len(m["significantly_better_than"]) == m["compared"] and m["compared"]]
        agrees = "agrees" if best_own == len(matched) else (
            "partly agrees" if best_own else "disagrees")
        ranks = ", ".join(f"{m['lang']}: {m['rank']}/{m['of']}" for m in matched)
        out.append(
            f"- **{method}, language-matched calibration**: the set in the evaluation language "
            f"has the lowest mean perplexity of the single-language sets for {best_own} of "
            f"{len(matched)} languages (rank {ranks}) and is significantly better than every "
            f"other single-language set for {len(beats_all)} ({', '.join(beats_all) or 'none'}). "
            f"This {agrees} with the published finding that calibrating in the target language "
            "helps most.")
    family = [t for t in vs_en + vs_rtn + [t for m in matched for t in m["tests"]]
              if "p_holm" in t]
    holm = multiple_comparisons(method, family, test_name)
    if holm:
        out.append(holm)
    return out
