#!/usr/bin/env python
"""The ZipCal study with seeds and budgets (issue 15): tables, tests, cost and findings.

Reads the cells of one or more `study_zipcal*` grids (one per model; configs/
study_zipcal.yaml, configs/study_zipcal_gemma3.yaml) and writes Markdown + JSON: per
method and calibration budget, the perplexity of random, Zipf-diverse and
perplexity-based selection as the mean over calibration seeds with its 95% interval;
each pair tested over paired evaluation windows and each side's seeds
(`qcal.eval.stats.seeded_ppl_test`), zipf vs perplexity also for equivalence; and what
each selection cost. A grid that is not finished is rendered from the cells it has and
says which are missing.

    python scripts/study_zipcal_tables.py [--grid results/study_zipcal ...]
                                          [--out results/zipcal]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from qcal.eval.stats import mean_ci_text, verdict  # noqa: E402
from qcal.grid.runner import grid_progress  # noqa: E402
from qcal.grid.zipcal import (  # noqa: E402
    EQUIVALENCE_MARGIN,
    SELECTORS,
    by_budget,
    findings,
    mean_ppl,
    pair_tests,
    selection_cost,
)
from qcal.results import markdown_table, provenance, provenance_markdown, write_results  # noqa: E402


def grid_section(run: Path) -> tuple[str, dict[str, Any]]:
    spec, cells, missing = grid_progress(run)
    langs = list(spec["eval_langs"])
    groups = by_budget(cells)
    cost = selection_cost(groups)
    rows = []
    for (method, nsamples, selector), recs in sorted(
            groups.items(), key=lambda kv: (kv[0][0], kv[0][1], SELECTORS.index(kv[0][2]))):
        seconds = cost.get(selector, {}).get(nsamples)
        rows.append([method, nsamples, selector, len(recs), mean_ci_text(mean_ppl(recs, langs)),
                     "-" if seconds is None else f"{seconds:.3g}"])
    tests = pair_tests(groups, langs)
    test_rows = [[t["method"], t["nsamples"], f"{t['a']} vs {t['b']}", f"{t['ppl_a']:.3f}",
                  f"{t['ppl_b']:.3f}", f"{100 * t['relative']:+.2f}%",
                  f"[{100 * t['ci_low'] / t['ppl_b']:+.2f}%, {100 * t['ci_high'] / t['ppl_b']:+.2f}%]",
                  f"{t['p']:.3g}", verdict(t), t["equivalence"]] for t in tests]
    model = spec.get("model") or "SmolLM2-135M-Instruct (default model)"
    parts = [f"## {model} (`{run.relative_to(ROOT)}`)",
             f"Grid: `qcal compare --config configs/{run.name}.yaml`; cells finished: "
             f"{len(cells)} of {len(cells) + len(missing)}"
             + (f" (PARTIAL; not yet run: {', '.join(missing)})" if missing else "") + ".",
             f"Perplexity on {', '.join(langs)} (held-out windows of 512 tokens"
             + (f", the first {spec['max_windows']}" if spec.get("max_windows") else ", all")
             + "): mean over calibration seeds ± the half-width of its 95% t-interval; "
             "selection s: mean seconds the selector took for one draw (calibration manifest).",
             markdown_table(["method", "nsamples", "selector", "seeds", "ppl", "selection s"],
                            rows)]
    if tests:
        parts += ["### Pairwise tests (same windows; seeds resampled per side)",
                  f"Relative Δ = (ppl A - ppl B) / ppl B. equivalence: `matches` when the whole "
                  f"95% interval lies within ±{100 * EQUIVALENCE_MARGIN:.0f}%, `beats`/`trails` "
                  "when significant outside it, else `inconclusive`.",
                  markdown_table(["method", "nsamples", "A vs B", "ppl A", "ppl B", "relative Δ",
                                  "95% CI", "p", "verdict", "equivalence"], test_rows)]
    found = findings(tests, cost)
    parts += ["### Findings (computed from the tables above)",
              "\n".join(found) or "(no finished GPTQ/AWQ settings yet)"]
    return "\n\n".join(parts), {"spec": spec, "missing": missing, "tests": tests,
                                "selection_seconds": cost, "findings": found}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--grid", type=Path, action="append",
                   help="a study_zipcal grid's results folder (repeatable)")
    p.add_argument("--out", type=Path, default=ROOT / "results" / "zipcal",
                   help="output path without suffix (.md and .json are written)")
    args = p.parse_args()
    grids = [g.resolve() for g in (args.grid or [ROOT / "results" / "study_zipcal"])]
    sections, data = [], {}
    for run in grids:
        if not (run / "cells").is_dir():
            raise SystemExit(f"{run} has no cells yet; run its `qcal compare --config` first")
        md, data[run.name] = grid_section(run)
        sections.append(md)
    prov = provenance(command="python scripts/study_zipcal_tables.py "
                      + " ".join(f"--grid {g.relative_to(ROOT)}" for g in grids)
                      + f" --out {args.out.resolve().relative_to(ROOT)}")
    md = "\n\n".join([
        "# ZipCal: random vs Zipf-diverse vs perplexity-based calibration selection",
        provenance_markdown(prov),
        "Every selector draws from the same English calibration pool of the handbook at each "
        "budget (nsamples windows of 512 tokens), three seeds each; GPTQ (act-order) and AWQ, "
        "w4 g128 asym. Tests: 10,000 bootstrap replicates resampling the evaluation windows "
        "(paired) and each side's seeds; the smallest p they can give is 1e-4.",
        *sections,
        "Caveats: small models whose float weights are dequantized GGUF/Q4 files; the "
        "perplexity selector scores the pool with the float model being quantized.",
    ])
    write_results(args.out.resolve(), {"provenance": prov, "grids": data}, md)
    print(f"wrote {args.out}.md")


if __name__ == "__main__":
    main()
