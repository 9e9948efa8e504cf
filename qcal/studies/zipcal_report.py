"""The ZipCal study with seeds and budgets (issue 15): tables, tests, cost and findings.

Reads the cells of one or more `study_zipcal*` grids (one per model; configs/
study_zipcal.yaml, configs/study_zipcal_gemma3.yaml) and writes Markdown + JSON, with a
chart per grid (<out>_<grid>.png, every point with its 95% interval): per
method and calibration budget, the perplexity of random, Zipf-diverse and
perplexity-based selection as the mean over calibration seeds with its 95% interval;
each pair tested over paired evaluation windows and each side's seeds
(`qcal.eval.stats.seeded_ppl_test`), zipf vs perplexity also for equivalence; and what
each selection cost. A grid that is not finished is rendered from the cells it has and
says which are missing.

    qcal report [results/study_zipcal ...] --study zipcal [--out results/zipcal]
"""

from __future__ import annotations

from pathlib import Path
from statistics import mean
from typing import Any

from qcal.eval.stats import mean_ci, mean_ci_text, verdict
from qcal.grid.evidence import model_ppl
from qcal.grid.runner import grid_progress
from qcal.grid.spec import FLOAT_CELL
from qcal.results import markdown_table
from qcal.studies.plots import from_mean_ci, interval_chart
from qcal.studies.tables import (
    chart_link,
    grid_heading,
    model_label,
    render_study,
    report_root,
)
from qcal.studies.zipcal import (
    EQUIVALENCE_MARGIN,
    SELECTORS,
    by_budget,
    distinct_sets,
    findings,
    mean_ppl,
    pair_tests,
    selection_cost,
)


def ppl_chart(chart: Path, cells: dict[str, dict[str, Any]], groups: dict, langs: list[str],
              model: str) -> str | None:
    """Perplexity against the calibration budget, one series per selector and a panel per
    method, 95% intervals over seeds; float and RTN as lines. The link, or None."""
    panels: dict[str, dict[str, list]] = {}
    for (method, nsamples, selector), recs in sorted(groups.items()):
        panels.setdefault(method, {}).setdefault(selector, []).append(
            from_mean_ci(str(nsamples), mean_ci(mean_ppl(recs, langs))))
    if not panels:
        return None
    panels = {m: {sel: panels[m][sel] for sel in SELECTORS if sel in panels[m]}
              for m in sorted(panels)}
    refs = {name: mean(model_ppl(cells[key])[lang]["ppl"] for lang in langs)
            for name, key in (("float", FLOAT_CELL), ("rtn", "none__rtn")) if key in cells}
    interval_chart(chart, panels, f"perplexity ({', '.join(langs)})",
                   f"{model}: perplexity by selector and calibration windows, 95% CI over seeds",
                   references={m: refs for m in panels})
    return chart_link(chart, "perplexity by selector and budget with 95% intervals over seeds")


def grid_section(run: Path, chart: Path) -> tuple[str, dict[str, Any]]:
    spec, cells, missing = grid_progress(run)
    langs = list(spec["eval_langs"])
    groups = by_budget(cells)
    cost = selection_cost(groups)
    rows = []
    for (method, nsamples, selector), recs in sorted(
            groups.items(), key=lambda kv: (kv[0][0], kv[0][1], SELECTORS.index(kv[0][2]))):
        seconds = cost.get(selector, {}).get(nsamples)
        rows.append([method, nsamples, selector, f"{len(recs)} ({distinct_sets(recs)})",
                     mean_ci_text(mean_ppl(recs, langs)),
                     "-" if seconds is None else f"{seconds:.3g}"])
    tests = pair_tests(groups, langs)
    test_rows = [[t["method"], t["nsamples"], f"{t['a']} vs {t['b']}", f"{t['ppl_a']:.3f}",
                  f"{t['ppl_b']:.3f}", f"{100 * t['relative']:+.2f}%",
                  f"[{100 * t['ci_low'] / t['ppl_b']:+.2f}%, {100 * t['ci_high'] / t['ppl_b']:+.2f}%]",
                  f"{t['p']:.3g}", f"{t['p_holm']:.3g}", verdict(t), t["equivalence"]]
                 for t in tests]
    parts = [*grid_heading(run, report_root(), spec, len(cells), missing),
             f"Perplexity on {', '.join(langs)} (held-out windows of 512 tokens"
             + (f", the first {spec['max_windows']}" if spec.get("max_windows") else ", all")
             + "): mean over calibration seeds ± the half-width of its 95% t-interval; "
             "seeds (sets): calibration seeds run and the distinct sets they drew; selection s: "
             "mean seconds the selector took for one draw (calibration manifest).",
             markdown_table(["method", "nsamples", "selector", "seeds (sets)", "ppl",
                             "selection s"],
                            rows)]
    link = ppl_chart(chart, cells, groups, langs, model_label(spec))
    if link:
        parts.append(link)
    if tests:
        parts += ["### Pairwise tests (same windows; seeds resampled per side)",
                  f"Relative Δ = (ppl A - ppl B) / ppl B. equivalence: `matches` when the whole "
                  f"95% interval lies within ±{100 * EQUIVALENCE_MARGIN:.0f}%, `beats`/`trails` "
                  "when significant outside it, else `inconclusive`.",
                  markdown_table(["method", "nsamples", "A vs B", "ppl A", "ppl B", "relative Δ",
                                  "95% CI", "p", "p (Holm)", "verdict", "equivalence"],
                                 test_rows)]
    found = findings(tests, cost, groups)
    parts += ["### Findings (computed from the tables above)",
              "\n".join(found) or "(no finished GPTQ/AWQ settings yet)"]
    return "\n\n".join(parts), {"spec": spec, "missing": missing, "tests": tests,
                                "selection_seconds": cost, "findings": found}


def render(grids: list[Path], out: Path | None = None) -> None:
    """Write the zipcal study's report (default results/zipcal) from its grids (default
    results/study_zipcal)."""
    render_study(
        "zipcal", grids, out, "study_zipcal",
        "zipcal", grid_section,
        "# ZipCal: random vs Zipf-diverse vs perplexity-based calibration selection",
        ["Every selector draws from the same English calibration pool of the handbook at each "
         "budget (nsamples windows of 512 tokens), three seeds each; GPTQ (act-order) and AWQ, "
         "w4 g128 asym. Tests: 10,000 bootstrap replicates resampling the evaluation windows "
         "(paired) and each side's seeds; the smallest p they can give is 1e-4. p (Holm): "
         "adjusted over all pairwise tests of one model, which bounds the chance of any false "
         "positive among them at 5%."],
        "Caveats: small models whose float weights are dequantized GGUF/Q4 files; the "
        "perplexity selector scores the pool with the float model being quantized.")

