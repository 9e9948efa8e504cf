"""results/big_model.md from results/big_model.json: the rows `scripts/bench_big_model.py`
measured (peak RSS, wall time, s/layer, disk written of quantize and eval on random
Llama-shaped models, and GPTQModel on the same files). `qcal report --study big-model`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# The benchmark's plan (issue 36): rows still missing are listed as such.
PLANNED = (("1b", "rtn"), ("1b", "gptq"), ("1b", "awq"), ("1b", "eval"), ("1b", "gptqmodel"),
           ("8b", "rtn"), ("8b", "gptq"), ("8b", "eval"), ("8b", "gptqmodel"),
           ("8b", "gptqmodel-bf16"))

_INTRO = [
    "# Models bigger than memory (issue 36)",
    "",
    "Random Llama-shaped bf16 models from `python -m qcal.studies.random_model` (memory and time "
    "only, never quality), quantized and evaluated on the CPU by "
    "`python scripts/bench_big_model.py` (one run per row, under `/usr/bin/time -v`).",
    "Machine: 2 CPU cores, 24 GiB RAM, no swap, shared with other jobs: the load "
    "average before and after each step is recorded; wall times under load are upper bounds.",
    "Disk written is the process's file-system output (512-byte blocks), work-dir "
    "state and the assembled checkpoint included.",
    "",
    "| shape | step | exit | wall s | quantize s | s/layer | layers done | first layer s | "
    "s/layer after first | peak RSS GiB | CPU | CPU s | disk written GB | output GB | "
    "load avg before/after | started (UTC) |",
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
]

_COLUMNS = (
    "Columns: `quantize s` is the quantize step's own time (quant_log.json); `layers done`, "
    "`first layer s` (from the start of the process: loading and calibration included) and "
    "`s/layer after first` come from the per-layer files in `<output>.work`, so they exist for "
    "a step stopped at its time limit too. For GPTQModel (`gptqmodel` in float32, "
    "`gptqmodel-bf16` in the stored dtype; its own venv, qcal/studies/peer_worker.py, the same "
    "calibration ids) they come from its layer callback, timed from the end of loading.")

_WHERE_TIME_GOES = (
    "Where the time goes (from the code, for reading the rows): before the first layer, "
    "`qcal quantize` reads every weight file once to refuse NaN/Inf weights and truncated files "
    "before any work (a full extra read of the float files: most of `first layer s` for RTN); "
    "after the last layer, the checkpoint is assembled from the per-layer files in "
    "`<output>.work` in two passes (plan the shards, then write them), so the packed layers are "
    "written twice and read twice. `qcal eval` keeps a float32 dequantized copy of each linear "
    "only when all of them together fit in a quarter of the available RAM (a 1B model does, an "
    "8B one does not), so the eval peak of a model that fits is its float32 size, by design.")


def _row(r: dict[str, Any]) -> str:
    rss = r["peak_rss_gib"] if r["peak_rss_gib"] is not None else "-"
    return (f"| {r['shape']} | {r['step']} | {r['exit']} | {r['wall_s']:.0f} | "
            f"{r.get('quantize_s', '-')} | {r.get('s_per_layer', '-')} | "
            f"{r.get('layers_done', '-')} | {r.get('first_layer_done_s', '-')} | "
            f"{r.get('s_per_layer_after_first', '-')} | {rss} | {r['cpu_percent'] or '-'} | "
            f"{r.get('cpu_s') or '-'} | {r['disk_written_gb']} | {r['output_gb']} | "
            f"{r['load_before']}/{r['load_after']} | {r['started']} |")


def render(rows: list[dict[str, Any]]) -> str:
    """The Markdown page of the benchmark's rows (in the order given)."""
    lines = [*_INTRO, *map(_row, rows), "", "Commands (paths relative to the checkout):", ""]
    lines += [f"- {r['shape']} {r['step']}: `{r['command']}` (git commit {r.get('commit', '?')})"
              for r in rows]
    # A row kept from an earlier commit is named step@commit (it still counts as done).
    done = {(r["shape"], r["step"].split("@")[0]) for r in rows if r["exit"] == 0}
    stopped = [f"{r['shape']} {r['step']} ({r.get('layers_done', 0)} layers done)"
               for r in rows if r["exit"] != 0]
    missing = [f"{shape} {step}" for shape, step in PLANNED if (shape, step) not in done
               and not any(x.startswith(f"{shape} {step} ") for x in stopped)]
    lines += ["", _COLUMNS, "", _WHERE_TIME_GOES]
    lines += [f"- Note on {r['shape']} {r['step']}: {r['note']}" for r in rows if r.get("note")]
    if stopped:
        lines += ["", "Stopped before all layers (the exit column says why: `--timeout`, or "
                  "`--rss-limit` before the machine ran out of memory): " + "; ".join(stopped)
                  + ". Their peak RSS is the peak up to the stop."]
    if missing:
        lines += ["", "Not measured yet (issue 36's plan): " + ", ".join(missing) + "."]
    return "\n".join(lines) + "\n"


def write(rows: list[dict[str, Any]], stem: Path) -> None:
    """`stem`.json and `stem`.md (results/big_model) from `rows`."""
    stem.with_suffix(".json").write_text(json.dumps(rows, indent=2))
    stem.with_suffix(".md").write_text(render(rows))


def render_study(grids: list[Path], out: Path | None = None) -> None:
    """`qcal report --study big-model`: re-render the page from its JSON (it reads no grid)."""
    from qcal.studies.bench import benchmark_json

    out, rows = benchmark_json("big-model", "big_model", "scripts/bench_big_model.py", grids, out)
    out.with_suffix(".md").write_text(render(rows))
