"""The ZipCal study's comparisons, from the cells of a seeded grid over selectors and budgets.

Pure functions of cell records (no files): per method and calibration budget (nsamples),
random vs Zipf-diverse vs perplexity-based selection over calibration seeds, tested on
the same evaluation windows (`qcal.eval.stats.seeded_ppl_test`), with what each selection
cost (from the calibration manifests). The published claim under test is that Zipf
selection *matches* perplexity-based selection at a fraction of the cost, so that pair
also gets an equivalence verdict: the 95% interval of the relative difference inside
+-`EQUIVALENCE_MARGIN`; "beats"/"trails" need the difference to survive Holm's correction
over the study's pair tests.
"""

from __future__ import annotations

from collections import defaultdict
from statistics import mean
from typing import Any

from qcal.eval.stats import significant, with_holm
from qcal.grid.evidence import model_ppl, multiple_comparisons, seed_sorted
from qcal.studies.multilingual import seeded_test

SELECTORS = ["random", "zipf", "perplexity"]
METHODS = ["gptq", "awq"]
PAIRS = [("zipf", "perplexity"), ("zipf", "random"), ("perplexity", "random")]
EQUIVALENCE_MARGIN = 0.01  # relative perplexity difference that counts as "matches"


def by_budget(cells: dict[str, dict[str, Any]]
              ) -> dict[tuple[str, int, str], list[dict[str, Any]]]:
    """{(method, nsamples, selector): [cell per seed, in seed order]}."""
    groups: dict[tuple[str, int, str], list[dict[str, Any]]] = defaultdict(list)
    for rec in cells.values():
        if rec.get("method") in METHODS and rec.get("selector") in SELECTORS:
            nsamples = (rec.get("axes") or {}).get("nsamples") or \
                (rec.get("calibration") or {}).get("nsamples")
            groups[(rec["method"], int(nsamples), rec["selector"])].append(rec)
    return seed_sorted(groups)


def equivalence(test: dict[str, Any], margin: float = EQUIVALENCE_MARGIN) -> str:
    """'matches', 'beats', 'trails' or 'inconclusive' for A against B (lower ppl is better).

    'matches' needs the whole 95% interval of (ppl_A - ppl_B) / ppl_B inside +-margin; a
    significant difference outside it (after Holm, for a test that went through `with_holm`)
    is 'beats' / 'trails'; anything else is too wide to tell."""
    if test.get("no_test"):
        return "untested"  # too few windows for an interval: the effect alone
    low, high = test["ci_low"] / test["ppl_b"], test["ci_high"] / test["ppl_b"]
    if -margin <= low and high <= margin:
        return "matches"
    if significant(test):
        return "beats" if test["delta"] < 0 else "trails"
    return "inconclusive"


def pair_tests(groups: dict, langs: list[str]) -> list[dict[str, Any]]:
    """Every pair of PAIRS within one method and budget, on the windows of `langs` pooled;
    Holm-adjusted over all of them (`p_holm`)."""
    out = []
    for method, nsamples in sorted({(m, n) for m, n, _ in groups}):
        for a_sel, b_sel in PAIRS:
            a_recs, b_recs = groups.get((method, nsamples, a_sel)), groups.get((method, nsamples,
                                                                                  b_sel))
            test = seeded_test(a_recs, b_recs, langs) if a_recs and b_recs else None
            if test is None:
                continue
            out.append({"method": method, "nsamples": nsamples, "a": a_sel, "b": b_sel, **test})
    return [{**test, "equivalence": equivalence(test)} for test in with_holm(out)]


def selection_cost(groups: dict) -> dict[str, dict[int, float]]:
    """{selector: {nsamples: mean selection seconds over the grid's own draws}}."""
    seconds: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for (_, nsamples, selector), recs in groups.items():
        for rec in recs:
            timing = (rec.get("calibration") or {}).get("timing") or {}
            if timing.get("selection_seconds") is not None:
                seconds[selector][nsamples].append(float(timing["selection_seconds"]))
    return {sel: {n: mean(v) for n, v in sorted(by_n.items())} for sel, by_n in seconds.items()}


def distinct_sets(recs: list[dict[str, Any]]) -> int:
    """How many different calibration sets the seeds of one group drew (by manifest digest).
    A selector that ignores its seed on this pool draws one set however many seeds run."""
    return len({(r.get("calibration") or {}).get("digest") or r.get("cell") for r in recs})


def mean_ppl(recs: list[dict[str, Any]], langs: list[str]) -> list[float]:
    """Per seed: the mean over `langs` of the cell's perplexity."""
    return [mean(model_ppl(r)[lang]["ppl"] for lang in langs) for r in recs]


def findings(tests: list[dict[str, Any]], cost: dict[str, dict[int, float]],
             groups: dict[tuple[str, int, str], list[dict[str, Any]]] | None = None
             ) -> list[str]:
    """The study's findings as Markdown bullets; `groups` (from `by_budget`) adds a note on
    groups whose seeds all drew one set, and the load average of the selection timings."""
    out = []
    zp = [t for t in tests if (t["a"], t["b"]) == ("zipf", "perplexity")]
    if zp:
        verdicts = [f"{t['method']} n={t['nsamples']}: {t['equivalence']} "
                    f"({100 * t['relative']:+.2f}%, " + (
                        f"95% CI [{100 * t['ci_low'] / t['ppl_b']:+.2f}%, "
                        f"{100 * t['ci_high'] / t['ppl_b']:+.2f}%])" if t["ci_low"] is not None
                        else f"{t['units']} windows, no interval)") for t in zp]
        not_worse = sum(t["equivalence"] in ("matches", "beats") for t in zp)
        agrees = ("agrees" if not_worse == len(zp) else
                  "disagrees" if all(t["equivalence"] == "trails" for t in zp) else "partly agrees")
        out.append(f"- **zipf vs perplexity selection**: {'; '.join(verdicts)}. Zipf matches or "
                   f"beats perplexity-based selection in {not_worse} of {len(zp)} settings; this "
                   f"{agrees} with the published claim that it matches it (equivalence margin "
                   f"+-{100 * EQUIVALENCE_MARGIN:.0f}%).")
    zr = [t for t in tests if (t["a"], t["b"]) == ("zipf", "random")]
    if zr:
        better = [f"{t['method']} n={t['nsamples']}" for t in zr
                  if t["significant"] and t["delta"] < 0]
        worse = [f"{t['method']} n={t['nsamples']}" for t in zr
                 if t["significant"] and t["delta"] > 0]
        out.append(f"- **zipf vs random selection**: zipf significantly better in {len(better)} of "
                   f"{len(zr)} settings ({', '.join(better) or 'none'}), significantly worse in "
                   f"{len(worse)} ({', '.join(worse) or 'none'}).")
    holm = multiple_comparisons("selector pairs", [t for t in tests if "p_holm" in t],
                                lambda t: f"{t['a']} vs {t['b']} {t['method']} n={t['nsamples']}")
    if holm:
        out.append(holm)
    if groups is not None:
        collapsed = [f"{sel} ({method} n={n})" for (method, n, sel), recs in sorted(groups.items())
                     if len(recs) > 1 and distinct_sets(recs) == 1]
        if collapsed:
            out.append("- **seeds**: every seed drew the same calibration set for "
                       + ", ".join(collapsed) + "; their intervals reflect the evaluation "
                       "windows alone.")
    if "zipf" in cost and "perplexity" in cost:
        ratios = [f"n={n}: {cost['perplexity'][n] / cost['zipf'][n]:.0f}x"
                  for n in cost["zipf"] if n in cost["perplexity"] and cost["zipf"][n] > 0]
        if ratios:
            loads = [t["load_average"][0] for recs in (groups or {}).values() for r in recs
                     if (t := (r.get("calibration") or {}).get("timing") or {}).get("load_average")]
            load = f", 1-min load average {min(loads):.1f}-{max(loads):.1f}" if loads else ""
            # Newer manifests time the perplexity selector's model load apart (inside the cost).
            ref = [s for recs in (groups or {}).values() for r in recs
                   if (s := ((r.get("calibration") or {}).get("selection") or {})
                       .get("reference_load_seconds")) is not None]
            ref_text = ""
            if ref:
                span = f"{min(ref):.2g}" + (f"-{max(ref):.2g}" if max(ref) > min(ref) else "")
                ref_text = f"; loading the reference model took {span} s of that"
            out.append("- **cost**: perplexity-based selection took longer than zipf by "
                       + ", ".join(ratios) + f" (selection seconds in the calibration manifests{load}"
                       f"{ref_text}).")
    return out
