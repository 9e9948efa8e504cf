"""The multilingual calibration study with seeds (issue 15): tables, tests and findings.

Reads the cells of one or more `study_multilingual*` grids (one per model; configs/
study_multilingual.yaml, configs/study_multilingual_gemma3.yaml) and writes Markdown +
JSON, with a chart per grid (<out>_<grid>.png, every point with its 95% interval):
perplexity per language as the mean over calibration seeds with its 95% interval,
every calibration setting against English-only calibration, and language-matched
calibration against the other single-language sets, each as a bootstrap over evaluation
windows (paired) and calibration draws (`qcal.eval.stats.seeded_ppl_test`). The findings
are computed from those numbers and compared with the published ones. A grid that is not
finished is rendered from the cells it has and says which are missing.

    qcal report [results/study_multilingual ...] --study multilingual [--out results/multilingual]
"""

from __future__ import annotations

from pathlib import Path
from statistics import mean
from typing import Any

from qcal.eval.stats import mean_ci, mean_ci_text, verdict
from qcal.grid import FLOAT_CELL
from qcal.grid.evidence import model_ppl
from qcal.grid.runner import grid_progress
from qcal.results import markdown_table
from qcal.studies.multilingual import (
    METHODS,
    MIXES,
    SINGLE,
    against_rtn,
    by_setting,
    findings,
    holm_method_family,
    matched_language,
    versus_baseline,
)
from qcal.studies.plots import from_mean_ci, interval_chart
from qcal.studies.tables import (
    chart_link,
    grid_heading,
    model_label,
    render_study,
    report_root,
)


def ppl_table(cells: dict[str, dict[str, Any]], groups: dict, langs: list[str]
              ) -> tuple[list[list[object]], dict[str, Any]]:
    rows: list[list[object]] = []
    data: dict[str, Any] = {}
    for name, key in (("float", FLOAT_CELL), ("rtn", "none__rtn")):
        if key in cells:
            ppl = {lang: model_ppl(cells[key])[lang]["ppl"] for lang in langs}
            rows.append([name, "-", "-", *[f"{ppl[lang]:.2f}" for lang in langs],
                         f"{mean(ppl.values()):.2f}"])
            data[name] = ppl
    for method in METHODS:
        for selector in SINGLE + MIXES:
            recs = groups.get((method, selector))
            if not recs:
                continue
            per_seed = [{lang: model_ppl(r)[lang]["ppl"] for lang in langs} for r in recs]
            rows.append([method, selector, len(recs),
                         *[mean_ci_text([p[lang] for p in per_seed]) for lang in langs],
                         mean_ci_text([mean(p.values()) for p in per_seed])])
            data[f"{method}/{selector}"] = per_seed
    return rows, data


def ppl_chart(chart: Path, table: dict[str, Any], model: str) -> str | None:
    """Mean perplexity over the languages per calibration set and method, with the 95%
    interval over seeds, float and RTN as lines; the Markdown link, or None without sets."""
    panels = {method: {"mean over languages": [
        from_mean_ci(key.split("/", 1)[1], mean_ci([mean(p.values()) for p in per_seed]))
        for key, per_seed in table.items() if key.startswith(f"{method}/")]}
        for method in METHODS}
    if not any(series["mean over languages"] for series in panels.values()):
        return None
    refs = {name: mean(table[name].values()) for name in ("float", "rtn") if name in table}
    interval_chart(chart, panels, "perplexity (mean over languages)",
                   f"{model}: perplexity by calibration set, 95% CI over seeds",
                   references={method: refs for method in METHODS})
    return chart_link(chart, "perplexity by calibration set with 95% intervals over seeds")


def test_rows(tests: list[dict[str, Any]]) -> list[list[object]]:
    return [[t["method"], f"{t['a']} vs {t['b']}", f"{t['ppl_a']:.2f}", f"{t['ppl_b']:.2f}",
             f"{t['delta']:+.2f}", f"[{t['ci_low']:+.2f}, {t['ci_high']:+.2f}]", f"{t['p']:.3g}",
             f"{t['p_holm']:.3g}" if "p_holm" in t else "-",
             "-" if t["effect_dz"] is None else f"{t['effect_dz']:.2f}", verdict(t)]
            for t in tests]


def grid_section(run: Path, chart: Path) -> tuple[str, dict[str, Any]]:
    spec, cells, missing = grid_progress(run)
    langs = list(spec["eval_langs"])
    groups = by_setting(cells)
    rows, table = ppl_table(cells, groups, langs)
    parts = [*grid_heading(run, report_root(), spec, len(cells), missing),
             f"Perplexity per language: mean over calibration seeds ± the half-width of its "
             f"95% t-interval; {spec['nsamples']} x {spec['seqlen']} calibration tokens per "
             f"set and seed, the first {spec.get('max_windows')} held-out windows of 512 "
             "tokens per language; the last column averages the languages per seed first.",
             markdown_table(["method", "calibration", "seeds", *langs, "mean"], rows)]
    link = ppl_chart(chart, table, model_label(spec))
    if link:
        parts.append(link)
    data: dict[str, Any] = {"spec": spec, "missing": missing, "perplexity": table}
    all_findings: list[str] = []
    for method in METHODS:
        vs_en = versus_baseline(groups, method, "ml:en", SINGLE + MIXES, langs)
        matched = matched_language(groups, method, langs)
        vs_rtn = against_rtn(cells, groups, method, langs)
        vs_en, matched, vs_rtn = holm_method_family(vs_en, matched, vs_rtn)
        head = ["method", "A vs B", "ppl A", "ppl B", "Δppl", "95% CI", "p", "p (Holm)", "d_z",
                "verdict"]
        if vs_en:
            parts += [f"### {method}: every calibration set vs English-only and vs RTN",
                      "On the windows of all languages pooled (perplexity over their tokens, "
                      "so it weighs languages by token count and differs from the mean column "
                      "above).", markdown_table(head, test_rows(vs_en + vs_rtn))]
        if matched:
            parts += [f"### {method}: language-matched calibration (each language's windows)",
                      markdown_table(
                          ["lang", "rank of ml:<lang>", "significantly better than",
                           "significantly worse than"],
                          [[m["lang"], f"{m['rank']} of {m['of']}",
                            ", ".join(m["significantly_better_than"]) or "-",
                            ", ".join(m["significantly_worse_than"]) or "-"] for m in matched])]
        all_findings += findings(method, vs_en, matched, vs_rtn)
        data[method] = {"vs_english": vs_en, "vs_rtn": vs_rtn, "matched_language": matched}
    parts += ["### Findings (computed from the tables above)",
              "\n".join(all_findings) or "(no finished GPTQ/AWQ settings with seeds yet)"]
    data["findings"] = all_findings
    return "\n\n".join(parts), data


def render(grids: list[Path], out: Path | None = None) -> None:
    """Write the multilingual study's report (default results/multilingual) from its grids
    (default results/study_multilingual)."""
    render_study(
        "multilingual", grids, out, "study_multilingual", "multilingual", grid_section,
        "# Multilingual calibration: seeds, intervals and paired tests",
        ["Five single-language calibration sets (en, de, ru, zh, ar: four scripts) and three "
         "mixes (`study10`: equal shares of en, de, fr, es, it, pt, ru, ja, zh, ar; `en-heavy`: "
         "English 1/2, the other nine share 1/2; `study5`: equal shares of the five single "
         "languages), each drawn with three seeds, quantized with GPTQ (act-order) and AWQ "
         "(w4 g128 asym); perplexity on held-out handbook chapters (lower is better).",
         "Tests: Δppl = ppl(A) - ppl(B), each side's perplexity the mean over its seeds; 95% CI "
         "and two-sided p from 10,000 bootstrap replicates that resample the evaluation windows "
         "(paired between A and B) and each side's calibration seeds; d_z: effect size of the "
         "seed-averaged per-window mean-NLL differences. The smallest p 10,000 replicates "
         "can give is 1e-4. p (Holm): adjusted over all of one method's tests (vs "
         "English-only, vs RTN and the language-matched tests), which bounds the chance of "
         "any false positive among them at 5%."],
        "Caveats: the models are small (135M-270M parameters) and their float weights are "
        "dequantized GGUF/Q4 files, so the size of an effect is not comparable with the "
        "8B-scale papers, only its direction; three seeds give wide intervals.")

