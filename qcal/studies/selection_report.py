"""Multilingual-calibration and ZipCal tables of the issue-8 study (one seed, small budget).

Reads the cells of the two grids run by `make study-grids`
(results/multilingual_grid, results/zipcal_grid) and writes tables.{md,json} beside
each grid's cells. (results/multilingual.md and results/zipcal.md belong to the seeded
issue-15 studies, `make evidence-studies`, which supersede these.) Every number comes
from the grid's cells (and, for selection cost, results/selectors.json); the
comparison with the published findings is computed from those numbers.
Run: qcal report --study selection [results/multilingual_grid results/zipcal_grid]
"""

from __future__ import annotations

import json
from pathlib import Path
from statistics import mean

from qcal.errors import ConfigError
from qcal.grid import FLOAT_CELL, load_cells
from qcal.grid.report import confidence_rows, ppl_table
from qcal.paths import results_dir
from qcal.results import markdown_table, provenance, provenance_markdown, write_results
from qcal.studies.selector_study import cell_key, selector_means, zipf_vs_perplexity

SINGLE = ["ml:en", "ml:de", "ml:ru", "ml:zh", "ml:ar"]
MIXES = ["mix:study10", "mix:en-heavy", "mix:study5"]
ZIPCAL = ["random", "zipf", "perplexity"]


def rel(value: float, reference: float) -> str:
    return f"{100 * (value - reference) / reference:+.1f}%"


def rows_for(selectors: list[str], methods: list[str], table: dict, langs: list[str],
             extra: dict[str, dict[str, object]] | None = None) -> list[list[object]]:
    rows = []
    for method in methods:
        for sel in selectors:
            key = cell_key(sel, method)
            if key in table:
                vals = [table[key].get(lang, float("nan")) for lang in langs]
                rows.append([method, sel, *vals, mean(vals),
                             *((extra or {}).get(key, {}).values())])
    return rows


def multilingual(run: Path, cells: dict, table: dict, langs: list[str], prov: dict) -> None:
    methods = [m for m in ("gptq", "awq") if any(cell_key(s, m) in table for s in SINGLE)]
    ref_rows = [[name, "-", *[table[k].get(lang, float("nan")) for lang in langs],
                 mean(table[k][lang] for lang in langs)]
                for name, k in (("float", FLOAT_CELL), ("rtn", "none__rtn")) if k in table]
    body = ref_rows + rows_for(SINGLE + MIXES, methods, table, langs)
    findings = []
    data: dict[str, object] = {"provenance": prov, "langs": langs, "perplexity": table,
                               "findings": {}}
    for method in methods:
        en_key = cell_key("ml:en", method)
        if en_key not in table:
            continue
        en_mean = mean(table[en_key][lang] for lang in langs)
        non_en = [lang for lang in langs if lang != "en"]
        en_non = mean(table[en_key][lang] for lang in non_en)
        mix_means = {m: mean(table[cell_key(m, method)][lang] for lang in langs)
                     for m in MIXES if cell_key(m, method) in table}
        best_mix = min(mix_means, key=mix_means.get) if mix_means else None
        aligned = {}
        for lang in [s.split(":")[1] for s in SINGLE]:
            if lang not in langs or cell_key(f"ml:{lang}", method) not in table:
                continue
            ranking = sorted((table[cell_key(s, method)][lang], s) for s in SINGLE
                             if cell_key(s, method) in table)
            aligned[lang] = [s for _, s in ranking].index(f"ml:{lang}") + 1
        f = {"english_only_mean_ppl": en_mean, "mix_mean_ppl": mix_means, "best_mix": best_mix,
             "aligned_rank_among_singles": aligned}
        data["findings"][method] = f  # type: ignore[index]
        if best_mix:
            best_non = mean(table[cell_key(best_mix, method)][lang] for lang in non_en)
            verdict = "agrees" if mix_means[best_mix] < en_mean else "disagrees"
            findings.append(
                f"- **{method}, mixes vs English-only**: the best mix ({best_mix}) averages "
                f"{mix_means[best_mix]:.2f} over the {len(langs)} evaluation languages vs "
                f"{en_mean:.2f} for English-only calibration ({mix_means[best_mix] - en_mean:+.2f}; "
                f"non-English only: {best_non - en_non:+.2f}) — this {verdict} with the published "
                "finding that multilingual mixes lower perplexity.")
        ones = sum(1 for r in aligned.values() if r == 1)
        findings.append(
            f"- **{method}, language-aligned calibration**: the set in the evaluation language is "
            f"the best of the five single-language sets for {ones} of {len(aligned)} languages "
            f"(rank per language: {aligned}).")
        worse = [f"{lang} with {s}" for s in SINGLE + MIXES for lang in langs
                 if cell_key(s, method) in table and "none__rtn" in table
                 and table[cell_key(s, method)][lang] > table["none__rtn"][lang]]
        if worse:
            mixes_done = [m for m in MIXES if cell_key(m, method) in table]
            mix_worse = [w for w in worse if w.split(" with ")[1] in MIXES]
            singles_done = [s for s in SINGLE if cell_key(s, method) in table]
            findings.append(
                f"- **{method}, worse than RTN** (which needs no calibration data): "
                f"{len(worse) - len(mix_worse)} of {len(singles_done) * len(langs)} (language, "
                "single-language set) pairs and "
                f"{len(mix_worse)} of {len(mixes_done) * len(langs)} (language, mix) pairs — "
                "calibrating on one language can cost the others more than plain rounding: "
                + ", ".join(worse) + ".")
    plots = [p for p in ("heatmap_gptq.png", "heatmap_awq.png")
             if (run / p).is_file()]
    md = "\n\n".join([
        "# Multilingual calibration on SmolLM2-135M (small-scale reproduction)",
        provenance_markdown(prov),
        "Five single-language calibration sets (en, de, ru, zh, ar: four scripts) and three "
        "mixes (`study10`: equal shares of en, de, fr, es, it, pt, ru, ja, zh, ar; `en-heavy`: "
        "English 1/2, the other nine share 1/2; `study5`: equal shares of the five single "
        "languages), quantized with GPTQ (act-order) and AWQ (w4 g128 asym), perplexity on held-out "
        "handbook chapters (lower is better).",
        markdown_table(["method", "calibration", *langs, "mean"], body, ".2f"),
        "## Findings against the published study (computed from the table)",
        "\n".join(findings) or "(no finished GPTQ/AWQ cells yet)",
        "Caveats: 16 calibration windows of 256 tokens per set and 4 evaluation windows of 512 "
        "tokens per language (a 2-core CPU budget), one seed, a 135M model whose float weights "
        "are themselves dequantized Q4_1, so differences of a few tenths are within noise.",
        *[f"![{p}]({p})" for p in plots],  # beside the tables, in the grid folder
    ])
    write_results(run / "tables", data, md)


def zipcal(run: Path, cells: dict, table: dict, langs: list[str], prov: dict) -> None:
    methods = [m for m in ("gptq", "awq") if any(cell_key(s, m) in table for s in ZIPCAL)]
    stats = {}
    for sel in ZIPCAL:
        for method in methods:
            rec = cells.get(cell_key(sel, method))
            if rec and rec.get("calibration"):
                st = rec["calibration"].get("statistics", {})
                stats[cell_key(sel, method)] = {"types": st.get("types"),
                                                "ttr": st.get("type_token_ratio")}
    body = rows_for(ZIPCAL, methods, table, langs, stats)
    conf = {(r["cell"], r["task"]): r for r in confidence_rows(cells)}
    acc_rows = [[k, t, r["acc"], r["ece"], r.get("d_conf_true", "-")]
                for (k, t), r in conf.items() if k.split("__")[0] in ZIPCAL or k == FLOAT_CELL]
    cost = selection_cost(cells)
    cost_rows = [[sel, c["selection_seconds"], c["windowing_seconds"]] for sel, c in cost.items()]
    cost_line = ("Selection cost of these very sets (calibration manifests; the perplexity "
                 "selector scores every window of the pool with the float model):\n\n"
                 + (markdown_table(["selector", "selection s", "windowing s"], cost_rows, ".2f")
                    if cost_rows else "not recorded (sets built before qcal recorded timing)")
                 + "\n\nA larger-pool timing of zipf vs perplexity selection is in "
                   "results/selectors.md (scripts/bench_selectors.py).")
    findings = []
    for method in methods:
        means = selector_means(table, method, ZIPCAL, langs)
        verdict = zipf_vs_perplexity(means)
        if verdict is None or "random" not in means:
            continue
        findings.append(
            f"- **{method}**: mean perplexity over {', '.join(langs)}: zipf {means['zipf']:.2f}, "
            f"perplexity-selected {means['perplexity']:.2f}, random {means['random']:.2f}. "
            f"Zipf {verdict} perplexity-based selection (1% tolerance; "
            f"{rel(means['zipf'], means['perplexity'])}) and is "
            f"{rel(means['zipf'], means['random'])} against random — "
            "the published claim is that zipf matches perplexity-based selection.")
    drifts = [(k, r["d_conf_true"]) for (k, _), r in conf.items()
              if isinstance(r.get("d_conf_true"), float) and k.split("__")[0] in ZIPCAL]
    if drifts:
        lower = sum(d < 0 for _, d in drifts)
        findings.append(
            f"- **confidence drift**: {lower} of {len(drifts)} quantized cells lower the model's "
            f"mean confidence on the gold answer (change {min(d for _, d in drifts):+.3f} .. "
            f"{max(d for _, d in drifts):+.3f}); the published study reports that 4-bit GPTQ "
            "lowers confidence on true labels. With 100 items the accuracy differences "
            "(standard error about 0.05) are not significant.")
    if "zipf" in cost and "perplexity" in cost and cost["zipf"]["selection_seconds"] > 0:
        ratio = cost["perplexity"]["selection_seconds"] / cost["zipf"]["selection_seconds"]
        findings.append(f"- **cost**: selecting these sets took zipf "
                        f"{cost['zipf']['selection_seconds']:.2f} s vs perplexity "
                        f"{cost['perplexity']['selection_seconds']:.1f} s ({ratio:.0f}x).")
    md = "\n\n".join([
        "# ZipCal comparison: random vs Zipf-diverse vs perplexity-based selection",
        provenance_markdown(prov),
        "English calibration pool of the handbook; same budget for every selector.",
        markdown_table(["method", "selector", *langs, "mean", "types", "type/token"], body, ".3f"),
        "## Next-sentence task (English, 100 items): accuracy, ECE, change of gold confidence",
        markdown_table(["cell", "task", "acc", "ece", "d_conf_true"], acc_rows, ".3f"),
        "## Findings", "\n".join(findings) or "(no finished cells yet)", cost_line,
    ])
    write_results(run / "tables",
                  {"provenance": prov, "perplexity": table, "calibration_stats": stats,
                   "findings": findings}, md)


def selection_cost(cells: dict) -> dict[str, dict[str, float]]:
    """{selector: timing} from the manifests of the grid's own calibration sets."""
    out = {}
    for sel in ZIPCAL:
        for rec in cells.values():
            timing = (rec.get("calibration") or {}).get("timing")
            if rec.get("selector") == sel and timing:
                out[sel] = timing
                break
    return out


def grid_provenance(run: Path, cells: dict) -> dict:
    from qcal.grid import grid_from_dict, plan_cells

    spec = json.loads((run / "grid.json").read_text())["spec"]
    planned = [c.key for c in plan_cells(grid_from_dict(spec))]
    missing = [k for k in planned if k not in cells]
    cell_prov = [rec.get("provenance", {}) for rec in cells.values()]
    dates = sorted(p["date"] for p in cell_prov if p.get("date"))
    commits = sorted({p.get("git_commit") for p in cell_prov if p.get("git_commit")})
    return provenance(
        command=f"make study-grids  (= qcal compare --config configs/{run.name}.yaml; "
                "then qcal report --study selection)",
        grid=", ".join(f"{k}={v}" for k, v in spec.items() if v not in (None, [], ())),
        model="SmolLM2-135M-Instruct (default model)",
        data=f"calibration: {spec['source']} calib split, {spec['nsamples']} x {spec['seqlen']} "
             f"tokens, seed {spec['seed']}; evaluation: held-out chapters, first "
             f"{spec['max_windows']} windows of {spec['eval_seqlen']} tokens per language",
        cells_run=(f"{dates[0]} .. {dates[-1]}, commits {', '.join(commits)}" if dates else "?"),
        cells_finished=f"{len(cells)} of {len(planned)}"
        + (f" (PARTIAL: not yet run: {', '.join(missing)}; re-run the command to continue)"
           if missing else ""),
    )


RENDERERS = {"multilingual_grid": multilingual, "zipcal_grid": zipcal}


def render(grids: list[Path], out: Path | None = None) -> None:
    """Write tables.{md,json} beside each grid's cells (default: both grids of the study,
    results/multilingual_grid and results/zipcal_grid; a grid is known by its name)."""
    if out is not None:
        raise ConfigError("--study selection writes tables.md beside each grid; drop --out")
    runs = [Path(g) for g in grids] or [results_dir() / name for name in RENDERERS]
    unknown = [str(run) for run in runs if run.name not in RENDERERS]
    if unknown:
        raise ConfigError(f"--study selection renders the grids named {' and '.join(RENDERERS)}, "
                          f"not {', '.join(unknown)}")
    for run in runs:
        if not (run / "cells").is_dir():
            print(f"{run} has no cells yet; run make study-grids")
            continue
        cells = load_cells(run)
        langs, table = ppl_table(cells)
        RENDERERS[run.name](run, cells, table, langs, grid_provenance(run, cells))
        print(f"rendered {run.name}")
