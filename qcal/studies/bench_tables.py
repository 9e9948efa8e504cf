"""Tables of the one-off scoring benchmarks, rendered from the JSON they write (so a table
can be written again without rerunning the measurement):

    qcal report --study window-nll       [--out results/window_nll]      (scripts/bench_window_nll.py)
    qcal report --study shared-context   [--out results/shared_context]  (scripts/bench_shared_context.py)
    qcal report --study selection-cost   [--out results/selection_cost]  (scripts/bench_selection_cost.py)
    qcal report --study scaling          [--out results/scaling]         (scripts/bench_scaling.py)
    qcal report --study selectors        [--out results/selectors]       (scripts/bench_selectors.py)
    qcal report --study interop          [--out results/interop]         (scripts/interop_matrix.py)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from qcal.results import markdown_table, provenance_markdown, write_results

SEQLEN, BATCH = 512, 4  # the perplexity evaluation's windows and batch
SELECTION_SOURCE = "debian-handbook"  # the study_zipcal grids' pool
SELECTION_ARMS = {"zipf": "zipf:pool_size=256",
                  "perplexity": "perplexity:max_candidates=256,score_tokens=128",
                  "perplexity, transposed CE": "perplexity:max_candidates=256,score_tokens=128"}


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


def render_selection_cost(data: dict[str, Any]) -> str:
    from statistics import median

    rows = []
    for m in data["models"]:
        med = m["median_seconds"]
        loads = [r["reference_load_seconds"] for r in m["runs"]
                 if r["reference_load_seconds"] is not None]
        rows.append([m["model"], len(m["runs"]) // len(SELECTION_ARMS), f"{med['zipf']:.3f}",
                     f"{med['perplexity']:.1f}", f"{med['perplexity, transposed CE']:.1f}",
                     f"{median(loads):.1f}" if loads else "-",
                     f"{med['perplexity'] / med['zipf']:.0f}x",
                     f"{med['perplexity, transposed CE'] / med['zipf']:.0f}x",
                     f"{med['perplexity, transposed CE'] / med['perplexity']:.2f}x",
                     f"{m['same_selection']} of {m['compared']}"])
    return "\n\n".join([
        "# Selection cost: zipf vs perplexity-based selection (ZipCal grid settings)",
        provenance_markdown(data["provenance"]),
        f"Pool: English windows of {SEQLEN} tokens from {SELECTION_SOURCE} (calib split), as the "
        "study_zipcal grids draw them. zipf: `pool_size=256` (a random 256 candidates per "
        "greedy step); perplexity: `max_candidates=256,score_tokens=128` (the reference model, "
        "loaded from the model directory as a grid cell does, scores the first 128 tokens of "
        "256 random candidates). Seconds: the selection step as the calibration manifest "
        "records it (perplexity's includes loading its reference model; that load is also "
        "shown alone); median over the draws (seeds x nsamples), arms interleaved in one "
        "process. `transposed CE`: the scoring the default model's study_zipcal cells were "
        "selected with; same selection: draws where old and new scoring chose the same "
        "windows (by manifest digest).",
        markdown_table(["model", "draws", "zipf s", "perplexity s", "perplexity s (transposed "
                        "CE)", "of which model load s", "perplexity / zipf",
                        "as the grid ran it", "old / new scoring", "same selection"], rows)])


def render_scaling(data: dict[str, Any]) -> str:
    runs = data["runs"]
    first = runs[next(iter(runs))]
    rows = [[n, r["wall_seconds"], r["quantize_seconds"],
             first["quantize_seconds"] / r["quantize_seconds"], r["max_rss_mib"], r["ppl_en"],
             100 * (r["ppl_en"] / first["ppl_en"] - 1), r["identical_codes_vs_first"],
             f"{r['load_before']} / {r['load_after']}"] for n, r in runs.items()]
    return "\n\n".join([
        "# Data-parallel GPTQ: 1 vs N processes (torchrun, gloo, CPU)",
        provenance_markdown(data["provenance"]),
        markdown_table(["processes", "wall s", "quantize s", "speed-up", "peak RSS MiB", "ppl (en)",
                        "ppl change %", "identical codes", "load before / after"], rows, ".3f"),
        "How it scales: each process runs the current layer's forward passes on its share of "
        "the calibration windows (the part that divides by N), the Hessians are summed "
        "(one all-reduce of in_features^2 floats per distinct input, a few per layer), and "
        "each linear is quantized by one owner process (so the column loops of a layer's "
        "linears run side by side, up to the number of linears per step). Every process "
        "loads the model and builds the calibration set itself. On this 2-core machine two "
        "processes share two cores that one process already used (torch's intra-op threads), "
        "so little or no speed-up is the expected outcome here; the design targets one "
        "accelerator per process. Codes differ where the summation order of the Hessians "
        "differs (float32), which moves a few rounding decisions; the perplexity column "
        "shows what that costs.",
    ])


def render_selectors(data: dict[str, Any]) -> str:
    setting, pool, timing, sets = data["setting"], data["pool"], data["timing"], data["sets"]
    source = setting.get("source") or data["provenance"]["data"].split(" calib split")[0]
    rows = [["zipf (greedy concept coverage)", f"{timing['zipf_seconds_first']:.3f}",
             f"{timing['zipf_seconds_median']:.3f}"],
            ["perplexity, low (float model scores every window)",
             f"{timing['perplexity_seconds']:.1f}", "-"]]
    set_rows = [[k, v["types"], v["type_token_ratio"], v["zipf_exponent"]] for k, v in sets.items()]
    return "\n\n".join([
        "# Selector wall time: zipf vs perplexity",
        f"Pool: {pool['documents']} documents of {source} ({pool['documents_per_language']}"
        f"), {pool['windows']} candidate windows of {setting['seqlen']} tokens (one per "
        f"document, short documents packed). Both select n={setting['n']} from the same pool. "
        "Timed: `select()` only (zipf: concept mapping + greedy coverage; perplexity: scoring "
        f"every window with the float model in batches of {setting['batch_size']}, then "
        f"ranking). Model load ({timing['model_load_seconds']:.1f} s) and windowing "
        f"({pool['windowing_seconds']} s) are shared and not timed.",
        markdown_table(["selector", "first run (s)",
                        f"median of {len(timing['zipf_seconds_all'])} (s)"], rows),
        f"**Speed-up of zipf over perplexity: {timing['speedup_first']}x** (first zipf run), "
        f"{timing['speedup_median']}x (median zipf run); end to end from documents (windowing "
        f"for both, model load for perplexity): {timing['speedup_end_to_end']}x.",
        "## Selected sets (n x seqlen tokens each)",
        markdown_table(["set", "distinct types", "type/token ratio", "Zipf exponent"], set_rows,
                       floatfmt=".4f"),
        "## Provenance", provenance_markdown(data["provenance"]),
    ])


def interop_row(cell: dict[str, Any]) -> list[Any]:
    scheme = ("sym" if cell["sym"] else "asym") + (" act-order" if cell["act_order"] else "")
    return [cell["format"], scheme, cell["loader"], cell["dtype"], cell["loads"],
            cell.get("max_rel_diff", "-"),
            cell.get("top1_agree", cell.get("lm_eval_acc_5_items", "-")),
            cell.get("error", "").replace("|", "/")]


def render_interop(table: dict[str, Any]) -> str:
    rows = [interop_row(cell) for cell in table["cells"]]
    return "\n\n".join([
        "# Checkpoint interoperability: format x scheme x act-order x loader (CPU)",
        provenance_markdown(table["provenance"]),
        markdown_table(["format", "scheme", "loader", "dtype", "loads", "max rel diff",
                        "top-1 agree / lm_eval acc", "error"], rows, ".2e"),
        "The default format, compressed-tensors, loads in every loader here, symmetric or "
        "asymmetric, with or without act-order, with no extra argument (docs/formats.md says "
        "how: actorder 'weight' for act-order, and `dequantize: true` in an asymmetric export's "
        "quantization_config, which transformers reads and vLLM ignores). "
        "transformers 5.24 reads the GPTQ and AWQ layouts only through GPTQModel/optimum (not "
        "installed in qcal's environment by design), so those rows record the refusal; the "
        "lm_eval column then fails the same way. lm_eval's accuracy on 5 items only shows that "
        "the model ran. Not run here: vLLM (needs a CUDA GPU: `scripts/gpu_check.sh` is where "
        "it belongs). GPTQModel 7.6.0 runs in its own venv (scripts/setup_peer_venv.sh) when "
        "present; it reads asymmetric GPTQ checkpoints as `--format gptq_v2`.",
    ])


def _rerender(name: str, stem: str, render: Callable[[dict[str, Any]], str],
              grids: list[Path], out: Path | None, script: str | None = None) -> None:
    from qcal.studies.bench import benchmark_json

    out, data = benchmark_json(name, stem, script or f"scripts/bench_{stem}.py", grids, out)
    write_results(out, data, render(data))
    print(f"wrote {out}.md")


def window_nll_study(grids: list[Path], out: Path | None = None) -> None:
    _rerender("window-nll", "window_nll", render_window_nll, grids, out)


def shared_context_study(grids: list[Path], out: Path | None = None) -> None:
    _rerender("shared-context", "shared_context", render_shared_context, grids, out)


def selection_cost_study(grids: list[Path], out: Path | None = None) -> None:
    _rerender("selection-cost", "selection_cost", render_selection_cost, grids, out)


def scaling_study(grids: list[Path], out: Path | None = None) -> None:
    _rerender("scaling", "scaling", render_scaling, grids, out)


def selectors_study(grids: list[Path], out: Path | None = None) -> None:
    _rerender("selectors", "selectors", render_selectors, grids, out)


def interop_study(grids: list[Path], out: Path | None = None) -> None:
    _rerender("interop", "interop", render_interop, grids, out, "scripts/interop_matrix.py")
