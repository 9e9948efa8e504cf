"""The confidence study (issue 15): benchmark accuracy, calibration and drift tables.

Reads the cells of the `study_confidence*` grids (one per model; configs/
study_confidence.yaml, configs/study_confidence_gemma3.yaml) and of the `study_benchmarks*`
grids (configs/study_benchmarks{,_gemma3}.yaml: the benchmark tasks the confidence grids
do not run, one calibration draw) and writes two reports:
- benchmarks (from the benchmark grids, plus the tasks they leave to the confidence grid
  of the same model; a model whose benchmark grid has no cells yet from its confidence
  grid alone; a second benchmark grid of a model, such as configs/study_lambada_seeds.yaml,
  supplies the tasks it re-ran with more calibration draws):
  lm-eval's own acc, acc_norm and perplexity with stderr and item counts, float and every
  method, groups with their direct subtasks (qcal.studies.benchmarks), and the grid each
  row comes from; each method's paired accuracy change from float, and the methods against
  each other (AWQ and GPTQ vs RTN, AWQ vs GPTQ) paired over the same items;
- confidence: accuracy, ECE, Brier, NLL and gold-answer confidence of the raw choice
  probabilities (mean ± 95% interval over seeds), the paired drift from the float model
  on the same items, the per-quartile table, and the test of the published claim that 4-bit
  GPTQ lowers confidence on the gold answer mostly where the float model was unsure (least
  confident quartile vs the rest, on probabilities and on log-odds;
  qcal.studies.confidence).
Each report has a chart per grid (<out>_<grid>.png: accuracy with its stderr interval;
drift from the float model with its paired-bootstrap interval). A grid that is not
finished is rendered from the cells it has and says which are missing.

    qcal report [results/study_confidence ...] --study confidence
        [--bench-grid results/study_benchmarks ...]
        [--out results/confidence] [--out-benchmarks results/benchmarks]
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from qcal.grid.runner import grid_progress, saved_spec
from qcal.paths import results_dir
from qcal.results import markdown_table, provenance, provenance_markdown
from qcal.studies.benchmarks import (
    SCORES,
    cell_text,
    combined_table,
    delta_text,
    method_pair_tests,
    pair_findings,
    share_text,
    test_text,
)
from qcal.studies.benchmarks import findings as benchmark_findings
from qcal.studies.confidence import (
    CLAIM_KEYS,
    CONTRASTS,
    METRICS,
    RANKS,
    SCALES,
    findings,
    study,
)
from qcal.studies.plots import Point, from_test, interval_chart
from qcal.studies.tables import (
    chart_link,
    chart_path,
    grid_heading,
    model_label,
    report_root,
    shown,
    write_report,
)


def benchmark_rows(rows: list[dict[str, Any]], names: list[str]) -> list[list[object]]:
    """Table rows of `combined_table`'s rows; `names[source]` is the grid a row came from."""
    return [[("&nbsp;&nbsp;" * r["depth"]) + r["task"], r["model"], r["seeds"],
             r["items"] if r["items"] is not None else "-",
             *[cell_text(r, m) for m in SCORES], *delta_text(r), share_text(r, "majority"),
             share_text(r, "top_answer"), names[r["source"]]] for r in rows]


def accuracy_chart(chart: Path, rows: list[dict[str, Any]], model: str) -> str | None:
    """Accuracy of every top-level task (groups, not their subtasks) per model, ± 1.96 x
    lm-eval's stderr; the Markdown link, or None when no task has an accuracy."""
    series: dict[str, list[Point]] = {}
    for r in rows:
        if r["depth"] == 0 and "acc" in r:
            err = r.get("acc_stderr")
            series.setdefault(r["model"], []).append(
                Point(r["task"], r["acc"]) if err is None else
                Point(r["task"], r["acc"], r["acc"] - 1.96 * err, r["acc"] + 1.96 * err))
    if not series:
        return None
    interval_chart(chart, {"accuracy": series}, "acc",
                   f"{model}: lm-eval accuracy, 95% interval from its stderr")
    return chart_link(chart, "accuracy per task and model with 95% intervals")


def bench_section(run: Path, supplements: list[Path], conf_grids: list[Path], chart: Path
                  ) -> tuple[list[str], dict[str, Any]]:
    """One model's benchmark table: the benchmark grid's tasks, each task a supplementary
    benchmark grid re-ran (more calibration draws) taken from that grid instead, then the
    tasks that the confidence grid of the same model ran and the benchmark grid left to it;
    `chart`: where its accuracy chart goes."""
    spec, cells, missing = grid_progress(run)
    head = grid_heading(run, report_root(), spec, len(cells), missing, _limits(spec))
    # A task comes from the first source that ran it: supplements go first.
    sources, names = [], []
    for extra in supplements:
        extra_spec, extra_cells, extra_missing = grid_progress(extra)
        extra_tasks = list(extra_spec.get("tasks") or [])
        seeds = extra_spec.get("seed")
        seeds = ", ".join(map(str, seeds)) if isinstance(seeds, list) else seeds
        done = f"{len(extra_cells)} of {len(extra_cells) + len(extra_missing)}"
        if extra_missing:
            # Half a supplement would replace whole rows with fewer methods or draws.
            head.append(f"`{shown(extra, report_root())}` (re-runs {', '.join(extra_tasks)} with "
                        f"calibration seeds {seeds}) is left out until it is finished "
                        f"(cells finished: {done}).")
            continue
        sources.append((extra_cells, extra_tasks))
        names.append(extra.name)
        head.append(f"{', '.join(extra_tasks)} from `{shown(extra, report_root())}` instead, which "
                    f"re-ran {'them' if len(extra_tasks) > 1 else 'it'} with calibration seeds "
                    f"{seeds} (cells finished: {done}{_limits(extra_spec)}; its calibrated "
                    "methods have one row per method, the mean over its seeds).")
    sources.append((cells, list(spec.get("tasks") or [])))
    names.append(run.name)
    for conf in conf_grids:
        if conf == run:
            continue
        conf_spec, conf_cells, conf_missing = grid_progress(conf)
        if conf_spec.get("model") != spec.get("model"):
            continue
        sources.append((conf_cells, list(conf_spec.get("tasks") or [])))
        names.append(conf.name)
        head.append(f"Tasks only the confidence grid runs come from `{shown(conf, report_root())}` "
                    f"(cells finished: {len(conf_cells)} of {len(conf_cells) + len(conf_missing)}"
                    f"{_limits(conf_spec)}; its calibrated methods have one row per method, "
                    "the mean over its seeds).")
    rows = combined_table(sources)
    table = markdown_table(["task", "model", "seeds", "items", "acc", "acc_norm", "perplexity",
                            "Δacc vs float [95% CI]", "p (Holm)", "majority", "top answer",
                            "grid"], benchmark_rows(rows, names))
    link = accuracy_chart(chart, rows, model_label(spec))
    found = benchmark_findings(rows)
    pairs = method_pair_tests(sources)
    pair_found = pair_findings(pairs)
    pair_part = [
        "### Methods against each other (paired over items)",
        "Δacc = accuracy of the first method minus the second's on the same items of each "
        "top-level task (a method's per-item score is the share of its seeds right), 95% "
        "paired-bootstrap CI, p (Holm): over every pair of this model, * below 0.05; d_z: "
        "effect size of the per-item differences. Resampling the items alone leaves out the "
        "variance of the calibration draw, which one draw per benchmark-grid cell cannot "
        "measure.",
        markdown_table(["task", "comparison", "Δacc [95% CI]", "p (Holm)", "d_z", "grid"],
                       pair_rows(pairs, names)),
        "\n".join(pair_found)] if pairs else []
    return [*head, table, *([link] if link else []),
            "### Findings (computed from the table above)",
            "\n".join(found) or "(no quantized cells yet)", *pair_part], {
                "spec": spec, "missing": missing, "grids": names, "rows": rows, "findings": found,
                "method_pairs": pairs, "method_pair_findings": pair_found}


def pair_rows(pairs: list[dict[str, Any]], names: list[str]) -> list[list[object]]:
    """Table rows of `method_pair_tests`' pairs."""
    return [[pair["task"], f"{pair['a']} - {pair['b']}", *test_text(pair["test"]),
             "-" if pair["test"]["effect_dz"] is None else f"{pair['test']['effect_dz']:+.2f}",
             names[pair["source"]]] for pair in pairs]


def confidence_rows(per_task: dict[str, Any]) -> list[list[object]]:
    rows = []
    for task, per_method in per_task.items():
        for method, entry in per_method.items():
            m = entry["metrics"]
            if m:
                rows.append([task, method, *[_ci4(m[k]) for k in METRICS]])
    return rows


def _ci4(ci: dict[str, Any]) -> str:
    if ci["half_width"] is None:
        return f"{ci['mean']:.4f}"
    return f"{ci['mean']:.4f} ± {ci['half_width']:.4f}"


def drift_rows(per_task: dict[str, Any]
               ) -> tuple[list[list[object]], list[list[object]], list[list[object]]]:
    """Rows of the drift, per-quartile and unsure-vs-rest contrast tables."""
    drift, quartiles, contrasts = [], [], []
    for task, per_method in per_task.items():
        for method, entry in per_method.items():
            d = entry.get("drift")
            if d is None:
                continue
            acc, conf = d["acc_test"], d["conf_true_test"]
            drift.append([task, method, d["seeds"], d["drift"]["n"],
                          delta_ci(acc), delta_ci(conf), number(conf["p_ttest"], ".3g"),
                          number(conf.get("p_holm"), ".3g"),
                          f"{d['drift']['flip_rate']:.3f}",
                          *[d[CLAIM_KEYS[scale]] for scale in SCALES]])
            for q, test in zip(d["drift"]["by_base_conf_quantile"], d["quartile_tests"],
                               strict=True):
                lo, hi = q["base_conf_true_range"]
                quartiles.append([task, method, q["quantile"], f"{lo:.3f}-{hi:.3f}", q["n"],
                                  f"{q['base_conf_true']:.4f}", f"{q['delta_conf_true']:+.4f}",
                                  "-" if test is None or test["p_ttest"] is None
                                  else f"{test['p_ttest']:.3g}",
                                  f"{q['delta_log_odds_true']:+.3f}",
                                  f"{q['share_of_loss']:.2f}", f"{q['flip_rate']:.3f}"])
            for contrast in CONTRASTS:
                t = d["unsure_vs_rest"].get(contrast)
                if t is not None:
                    *cells, effect = contrast_cells(contrast, t)
                    contrasts.append([task, method, *cells,
                                      f"{t['p_holm']:.3g}" if "p_holm" in t else "-",
                                      effect, d[CLAIM_KEYS[contrast]]])
    return drift, quartiles, contrasts


def number(value: float | None, spec: str) -> str:
    """A statistic, or "-" where the test was not run (too few units to test)."""
    return "-" if value is None else format(value, spec)


def delta_ci(t: dict[str, Any]) -> str:
    """Difference [95% CI]; the difference alone where no interval was computed."""
    if t.get("ci_low") is None or t.get("ci_high") is None:
        return f"{t['delta']:+.4f} (untested)"
    return f"{t['delta']:+.4f} [{t['ci_low']:+.4f}, {t['ci_high']:+.4f}]"


def contrast_cells(contrast: str, t: dict[str, Any]) -> list[str]:
    """Scale, test, Q1, Q2-4, difference, p and effect of one unsure-vs-rest contrast: means,
    their difference [bootstrap CI], Welch p and Cohen's d; or, for a rank test, medians,
    the Hodges-Lehmann shift, Mann-Whitney p and the rank-biserial r."""
    if contrast.endswith(RANKS):
        return [SCALES[contrast.removesuffix(RANKS)], "Mann-Whitney U",
                f"{t['median_a']:+.4f}", f"{t['median_b']:+.4f}", f"{t['delta']:+.4f}",
                number(t["p"], ".3g"), f"r {t['effect_r']:+.2f}"]
    return [SCALES[contrast], "Welch t", f"{t['mean_a']:+.4f}", f"{t['mean_b']:+.4f}",
            delta_ci(t), number(t["p_ttest"], ".3g"),
            "-" if t["effect_d"] is None else f"d {t['effect_d']:+.2f}"]


def drift_chart(chart: Path, per_task: dict[str, Any], model: str) -> str | None:
    """Change from the float model in gold-answer confidence and accuracy per task, one
    series per method, with the paired-bootstrap 95% intervals; the link, or None."""
    panels: dict[str, dict[str, list]] = {"Δconf_true": {}, "Δacc": {}}
    for task, per_method in per_task.items():
        for method, entry in per_method.items():
            if "drift" in entry:
                for panel, key in (("Δconf_true", "conf_true_test"), ("Δacc", "acc_test")):
                    panels[panel].setdefault(method, []).append(
                        from_test(task, entry["drift"][key]))
    if not panels["Δconf_true"]:
        return None
    interval_chart(chart, panels, "model - float (same items)",
                   f"{model}: drift from the float model, paired-bootstrap 95% CI",
                   zero_line=True)
    return chart_link(chart, "drift from the float model with paired-bootstrap 95% intervals")


def _limits(spec: dict[str, Any]) -> str:
    own = spec.get("task_limits") or {}
    return (f"; items per task: lm-eval --limit {spec.get('limit') or 'none (all)'}"
            + "".join(f", {task}: {n} per subtask" for task, n in sorted(own.items())))


def render(grids: list[Path], out: Path | None = None, bench_grids: list[Path] | None = None,
           out_benchmarks: Path | None = None) -> None:
    """Write the confidence report (`out`, default results/confidence) from the confidence
    grids (default results/study_confidence) and the benchmarks report (default
    results/benchmarks) from the benchmark grids (default: results/study_benchmarks*). A
    model's first benchmark grid heads its section, a later one of the same model supplies
    the tasks it re-ran."""
    out_confidence = Path(out) if out is not None else results_dir() / "confidence"
    out_benchmarks = Path(out_benchmarks) if out_benchmarks is not None else (
        results_dir() / "benchmarks")
    grids = [Path(g).resolve() for g in (grids or [results_dir() / "study_confidence"])]
    bench_grids = [Path(g).resolve() for g in (bench_grids or sorted(
        g for g in results_dir().glob("study_benchmarks*") if (g / "cells").is_dir()))]
    conf_parts, bench_parts, data, bench_data = [], [], {}, {}
    # A model's first benchmark grid heads its section; a later one of the same model is a
    # supplement that re-ran some of its tasks with more calibration draws.
    by_model: dict[Any, list[Path]] = {}
    for g in bench_grids:
        by_model.setdefault(saved_spec(g).get("model"), []).append(g)
    # A model's confidence grid stands in for its benchmark grid until that one has cells,
    # so a model is never missing from benchmarks.md while its benchmark grid runs.
    bench_sources = [runs[0] for runs in by_model.values()] + [
        g for g in grids if saved_spec(g).get("model") not in by_model]
    bench_charts = [chart_path(out_benchmarks.resolve(), run) for run in bench_sources]
    conf_charts = [chart_path(out_confidence.resolve(), run) for run in grids]
    for run, chart in zip(bench_sources, bench_charts, strict=True):
        heads_a_model = run in bench_grids
        supplements = by_model[saved_spec(run).get("model")][1:] if heads_a_model else []
        parts, bench_data[run.name] = bench_section(run, supplements,
                                                    grids if heads_a_model else [], chart)
        bench_parts += parts
    for run, chart in zip(grids, conf_charts, strict=True):
        spec, cells, missing = grid_progress(run)
        per_task = study(cells, list(spec.get("tasks") or []))
        data[run.name] = {"spec": spec, "missing": missing, "tasks": per_task}
        head = grid_heading(run, report_root(), spec, len(cells), missing, _limits(spec))
        drift, quartiles, contrasts = drift_rows(per_task)
        link = drift_chart(chart, per_task, model_label(spec))
        conf_parts += [*head,
                       "### Calibration of the raw choice probabilities (mean ± 95% CI over seeds)",
                       markdown_table(["task", "model", *METRICS], confidence_rows(per_task)),
                       "### Drift from the float model on the same items",
                       "Δ = model - float, per item, the model's probabilities averaged over its "
                       "seeds; [95% paired-bootstrap CI]; p: paired t-test on gold-answer "
                       "confidence, p (Holm): adjusted over every task and model of this "
                       "table; flips: share of items whose predicted answer changed; claim: "
                       "the verdict on the published claim from the contrast below, on "
                       "probabilities and on log-odds.",
                       markdown_table(["task", "model", "seeds", "items", "Δacc", "Δconf_true",
                                       "p", "p (Holm)", "flips", "claim (p)",
                                       "claim (log-odds)"], drift),
                       *([link] if link else []),
                       "### By quartile of the float model's gold-answer confidence",
                       "p: paired t-test of the quartile's Δconf_true; Δlog-odds: mean change "
                       "of the gold answer's log-odds, log p / (1 - p).",
                       markdown_table(["task", "model", "quartile", "float conf_true range",
                                       "items", "float conf_true", "Δconf_true", "p", "Δlog-odds",
                                       "share of loss", "flips"], quartiles),
                       "### The claim as a test: least confident quartile vs the other three",
                       "Welch t: mean change of the float model's least confident quartile "
                       "(Q1) and of the other three (Q2-4), their difference [95% bootstrap "
                       "CI], Welch's t-test, Cohen's d. Mann-Whitney U: the same changes on "
                       "ranks (medians, Hodges-Lehmann shift, rank-biserial r), a check that "
                       "a few extreme items do not make the verdict. Holm over every task and "
                       "model per scale and test. The claim agrees when Q1 loses "
                       "significantly more after Holm (and the overall drop is significant "
                       "after Holm), disagrees when it loses significantly less.",
                       markdown_table(["task", "model", "scale", "test", "Δ Q1", "Δ Q2-4",
                                       "Q1 - rest", "p", "p (Holm)", "effect", "verdict"],
                                      contrasts),
                       "### Findings (computed from the tables above)",
                       "\n".join(findings(per_task)) or "(no quantized cells yet)"]
    command = ("qcal report " + " ".join(shown(g, report_root()) for g in grids)
               + " --study confidence"
               + "".join(f" --bench-grid {shown(g, report_root())}" for g in bench_grids))
    prov = provenance(command=command)
    intro = ("lm-eval 0.4.13's own task definitions on the offline benchmark data "
             "(`qcal provision --only benchmarks`; sources and licences in "
             "data/benchmarks/tasks/README.md); w4 g128 asym; calibration draws of 32 x 512 "
             "random handbook windows for GPTQ (act-order) and AWQ: three seeds in the "
             "confidence grids and in a benchmark grid that re-runs some tasks, one in the "
             "main benchmark grids (each section names the grid of each task).")
    bench_intro = ("Each score is lm-eval's own (acc, acc_norm; perplexity for lambada_openai) "
                   "± lm-eval's stderr; a method with several calibration seeds shows the mean "
                   "of each. Groups are followed by their direct subtasks (indented); a "
                   "group's items are the sum over its tasks. majority: share of items whose "
                   "gold answer is the most common one (the accuracy of always giving it); "
                   "top answer: share of items on which the model gives its own most common "
                   "answer (raw log-likelihood; near 1, the model answers alike whatever the "
                   "item, and its accuracy is the baseline, not skill). Δacc vs float: the "
                   "method's accuracy minus the float model's on the same items, with a 95% "
                   "paired-bootstrap interval over items (a method's per-item score is the "
                   "share of its seeds that got the item right, so Δacc is the difference of "
                   "the acc column); p (Holm): the bootstrap's two-sided p, Holm-adjusted "
                   "over every method row of the model's table, * where it stays below 0.05. "
                   "Overlapping ± stderr intervals do not mean 'no difference': both models "
                   "answer the same items, and only the paired test can tell. On LAMBADA an "
                   "item is right when its whole continuation is the greedy one (lm-eval's "
                   "acc); its perplexity gets no test. confidence.md's Δacc differs where a method has "
                   "several seeds: it scores the seeds' averaged probabilities.")
    write_report(out_benchmarks.resolve(), {"provenance": prov, "grids": bench_data},
                 "\n\n".join(["# Benchmarks: float and 4-bit methods on real lm-eval tasks",
                              provenance_markdown(prov), intro, bench_intro, *bench_parts]),
                 bench_charts)
    write_report(out_confidence.resolve(), {"provenance": prov, "grids": data}, "\n\n".join(
        ["# Confidence calibration and drift under 4-bit quantization", provenance_markdown(prov),
         intro, *conf_parts]), conf_charts)
    print(f"wrote {out_benchmarks}.md and {out_confidence}.md")

