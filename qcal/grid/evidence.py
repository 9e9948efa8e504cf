"""The statistics section of a grid report: means with 95% CIs across calibration seeds,
and paired tests between calibration settings on the same evaluation windows.

Cells are matched by everything but the axis being compared: two selectors are compared
within one method, model, seed and scheme; seeds are pooled within one selector/method.
Cells computed before per-window NLLs were recorded cannot be tested and are listed so.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from qcal.eval.stats import mean_ci, paired_ppl_test, test_p, verdict, with_holm
from qcal.results import markdown_table


def model_ppl(rec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A cell's perplexity results of the evaluated model, per language ({} if none)."""
    return ((rec.get("eval") or {}).get("perplexity") or {}).get("model") or {}


def model_lm_eval(rec: dict[str, Any]) -> dict[str, Any]:
    """A cell's lm-eval record of the evaluated model: {"results": {task: row}, "info": ...}
    (empty where there is none)."""
    block = (rec.get("eval") or {}).get("lm_eval") or {}
    return {"results": (block.get("results") or {}).get("model") or {},
            "info": block.get("info") or {}}


def seed_sorted(groups: dict[Any, list[dict[str, Any]]]) -> dict[Any, list[dict[str, Any]]]:
    """`groups` with each list of cells put in calibration-seed order (in place)."""
    for recs in groups.values():
        recs.sort(key=lambda r: (r.get("axes") or {}).get("seed", 0))
    return groups


def holm_families(*families: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """`with_holm` over the tests of all `families` together (one report's family of
    tests), handed back split as they came."""
    adjusted = with_holm([t for family in families for t in family])
    out, start = [], 0
    for family in families:
        out.append(adjusted[start:start + len(family)])
        start += len(family)
    return out


def multiple_comparisons(label: str, tests: list[dict[str, Any]], name: Any,
                         most_named: int = 5) -> str | None:
    """A findings bullet: how many of a family's tests (after `with_holm`) are significant
    before and after Holm's adjustment, naming with `name(test)` those that lose their
    significance, and the survivors when there are at most `most_named`."""
    if not tests:
        return None
    raw = sum(bool(t["significant"]) for t in tests)
    kept = [f"{name(t)} (p_Holm={t['p_holm']:.2g})" for t in tests if t["significant_holm"]]
    lost = [name(t) for t in tests if t["significant"] and not t["significant_holm"]]
    tested = [p for p in (test_p(t) for t in tests) if p is not None]
    if not tested:
        return (f"- **{label}**: none of the {len(tests)} comparisons has enough paired units "
                "for a test; their effects are reported without p-values.")
    untested = len(tests) - len(tested)
    text = (f"- **{label}, multiple comparisons**: {raw} of {len(tested)} tests are significant "
            f"at 95% uncorrected (smallest p {min(tested):.2g}); after Holm's correction over all "
            f"{len(tested)}, {len(kept)} remain{'s' if len(kept) == 1 else ''}"
            + (f" ({untested} comparison{'s' if untested != 1 else ''} too small to test)"
               if untested else ""))
    if kept and len(kept) <= most_named:
        text += f" ({', '.join(kept)})"
    if lost:
        text += f"; no longer significant: {', '.join(lost)}"
    if not kept:
        text += "; none of the differences is established on its own"
    return text + "."


def _windows(rec: dict[str, Any]) -> dict[str, tuple[list[float], list[int]]]:
    return {lang: (row["window_nll"], row["window_tokens"]) for lang, row in model_ppl(rec).items()
            if row.get("window_nll")}


def _ppl(rec: dict[str, Any]) -> dict[str, float]:
    return {lang: float(row["ppl"]) for lang, row in model_ppl(rec).items()}


def _group_key(rec: dict[str, Any], without: str) -> tuple:
    axes = {k: v for k, v in (rec.get("axes") or {}).items() if k != without}
    selector = None if without == "selector" else rec.get("selector")
    return (rec.get("method"), selector, tuple(sorted(axes.items())))


def seed_intervals(cells: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (method, selector, other axes) and language: mean ppl and its 95% CI over seeds."""
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for rec in cells.values():
        if rec.get("method") is not None and "seed" in (rec.get("axes") or {}):
            groups[_group_key(rec, "seed")].append(rec)
    rows = []
    for (method, selector, axes), recs in groups.items():
        langs = sorted(set.intersection(*(set(_ppl(r)) for r in recs)))
        for lang in langs:
            ci = mean_ci([_ppl(r)[lang] for r in recs])
            rows.append({"method": method, "selector": selector, "axes": dict(axes),
                         "lang": lang, **ci})
    return rows


def selector_tests(cells: dict[str, dict[str, Any]], baseline: str) -> list[dict[str, Any]]:
    """Each selector vs `baseline` on the same windows (pooled over languages, and per
    language): paired bootstrap of the perplexity difference."""
    groups: dict[tuple, dict[str, dict[str, Any]]] = defaultdict(dict)
    for rec in cells.values():
        if rec.get("selector") is not None:
            groups[_group_key(rec, "selector")][rec["selector"]] = rec
    out = []
    for (method, _, axes), by_selector in groups.items():
        base = by_selector.get(baseline)
        if base is None:
            continue
        for selector, rec in by_selector.items():
            if selector == baseline:
                continue
            a, b = _windows(rec), _windows(base)
            row: dict[str, Any] = {"method": method, "axes": dict(axes), "a": selector,
                                   "b": baseline}
            langs = sorted(set(a) & set(b))
            if not langs:
                row["note"] = "no per-window NLLs recorded (cell computed before they were)"
                out.append(row)
                continue
            pooled_a = [x for lang in langs for x in a[lang][0]]
            pooled_b = [x for lang in langs for x in b[lang][0]]
            tokens = [x for lang in langs for x in a[lang][1]]
            row["pooled"] = paired_ppl_test(pooled_a, tokens, pooled_b, tokens)
            row["per_language"] = {lang: paired_ppl_test(a[lang][0], a[lang][1], b[lang][0],
                                                         b[lang][1]) for lang in langs}
            out.append(row)
    return out


def evidence_markdown(cells: dict[str, dict[str, Any]], baseline: str) -> tuple[list[str], dict]:
    """Markdown parts and JSON data of the statistics section."""
    parts: list[str] = []
    intervals = seed_intervals(cells)
    if intervals:
        parts += ["## Across calibration seeds (mean and 95% CI, Student t)",
                  markdown_table(["method", "selector", "other axes", "lang", "n", "mean ppl",
                                  "95% CI"],
                                 [[r["method"], r["selector"] or "-", r["axes"] or "-", r["lang"],
                                   r["n"], r["mean"],
                                   "-" if r["half_width"] is None else
                                   f"[{r['low']:.2f}, {r['high']:.2f}]"] for r in intervals],
                                 ".2f")]
    tests = selector_tests(cells, baseline)
    if tests:
        rows = []
        for t in tests:
            if "pooled" not in t:
                rows.append([t["method"], t["axes"] or "-", f"{t['a']} vs {t['b']}", "-", "-", "-",
                             "-", "-", t["note"]])
                continue
            p = t["pooled"]
            wins = [v for v in t["per_language"].values() if v["significant"]]
            a_wins = sum(v["delta"] < 0 for v in wins)
            rows.append([t["method"], t["axes"] or "-", f"{t['a']} vs {t['b']}",
                         f"{p['delta']:+.3f}",
                         "-" if p["ci_low"] is None else f"[{p['ci_low']:+.3f}, {p['ci_high']:+.3f}]",
                         "-" if p["p"] is None else f"{p['p']:.3g}", p["units"],
                         "-" if p["effect_dz"] is None else f"{p['effect_dz']:.2f}",
                         f"{verdict(p)}; per language: A better in {a_wins}, B better in "
                         f"{len(wins) - a_wins} of {len(t['per_language'])}"])
        parts += [f"## Paired tests: each selector vs {baseline} (same windows)",
                  "Δppl = ppl(A) - ppl(B) on the pooled evaluation windows (negative: A better); "
                  "95% CI and two-sided p from 10,000 paired bootstrap resamples of windows; "
                  "effect size d_z of the per-window mean-NLL differences; n: paired windows. "
                  "With fewer than 10 windows there is no test: the effect stands alone.",
                  markdown_table(["method", "other axes", "A vs B", "Δppl", "95% CI", "p", "n",
                                  "d_z", "verdict"], rows)]
    return parts, {"seed_intervals": intervals, "selector_tests": tests}
