"""Tables of the one-off scoring benchmarks, rendered from the JSON they write (so a table
can be written again without rerunning the measurement):

    qcal report --study window-nll       [--out results/window_nll]      (scripts/bench_window_nll.py)
    qcal report --study shared-context   [--out results/shared_context]  (scripts/bench_shared_context.py)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from qcal.results import markdown_table, provenance_markdown, write_results

SEQLEN, BATCH = 512, 4  # the perplexity evaluation's windows and batch


def render_window_nll(data: dict[str, Any]) -> str:
    models = data["models"]
    repeats = models[0]["repeats"] if models else 0
    windows = data.get("windows") or (models[0]["batches"] * BATCH if models else 0)
    rows = [[m["model"], m["vocab"], m["batches"] * m["repeats"],
             f"{m['median']['flattened']:.2f}", f"{m['median']['row by row']:.2f}",
             f"{m['median']['flattened'] / m['median']['row by row']:.2f}x",
             "yes" if m["identical"] else "NO"] for m in models]
    return "\n\n".join([
        "# Perplexity evaluation: scoring a batch of windows, flattened vs row by row",
        provenance_markdown(data["provenance"]),
        f"Batches of {BATCH} held-out English handbook windows of {SEQLEN} tokens (the first "
        f"{windows}, as the study grids evaluate them); seconds per batch, forward pass "
        f"included, median over {repeats} passes with the two ways interleaved; load "
        f"average {data['load_before']} before, {data['load_after']} after. identical: every "
        "per-token NLL bit-for-bit equal.",
        markdown_table(["model", "vocab", "batches timed", "flattened s", "row by row s",
                        "speed-up", "identical"], rows)])


def render_shared_context(data: dict[str, Any]) -> str:
    results = data["results"]
    tasks = list(results[0]["tasks"]) if results else []
    limit = results[0]["limit"] if results else 0
    rows = [[r["model"], r["order"], r["lm_eval"]["seconds"], r["shared"]["seconds"],
             f"{r['speedup']:.2f}x", f"{r['lm_eval']['load_before'][0]}-"
             f"{r['shared']['load_after'][0]}",
             f"{max(t['max_abs_ll_diff'] for t in r['tasks'].values()):.2e}",
             sum(t["argmax_flips"] for t in r["tasks"].values())] for r in results]
    task_rows = [[r["model"], t, v["items"], f"{v['max_abs_ll_diff']:.2e}", v["argmax_flips"],
                  v["acc_lm_eval"], v["acc_shared"]]
                 for r in results for t, v in r["tasks"].items()]
    return "\n\n".join([
        "# lm-eval task scoring: lm-eval's HFLM vs qcal's shared-context scorer",
        provenance_markdown(data["provenance"]),
        f"Tasks {', '.join(tasks)}, first {limit} items each, float models, CPU, one "
        "process; the two scorers run back to back on the same loaded model (order "
        "alternates per model). Speed-up = lm-eval seconds / shared-context seconds, measured "
        "in this one run on a shared machine (load average: first 1-min value before, last "
        "after).",
        markdown_table(["model", "order", "lm-eval s", "shared s", "speed-up", "load",
                        "max |Δ ll|", "argmax flips"], rows),
        "Agreement per task (per-choice log-likelihoods; acc as lm-eval computes it):",
        markdown_table(["model", "task", "items", "max |Δ ll|", "argmax flips", "acc lm-eval",
                        "acc shared"], task_rows, floatfmt=".4f"),
    ])


def _rerender(name: str, stem: str, render: Callable[[dict[str, Any]], str],
              grids: list[Path], out: Path | None) -> None:
    from qcal.errors import ConfigError
    from qcal.paths import results_dir

    if grids:
        raise ConfigError(f"--study {name} reads no grid: it re-renders a benchmark's JSON "
                          "(--out names it)")
    out = out or results_dir() / stem
    source = out.with_suffix(".json")
    if not source.is_file():
        raise ConfigError(f"{source} does not exist; run scripts/bench_{stem}.py first")
    data = json.loads(source.read_text())
    write_results(out, data, render(data))
    print(f"wrote {out}.md")


def window_nll_study(grids: list[Path], out: Path | None = None) -> None:
    _rerender("window-nll", "window_nll", render_window_nll, grids, out)


def shared_context_study(grids: list[Path], out: Path | None = None) -> None:
    _rerender("shared-context", "shared_context", render_shared_context, grids, out)
