"""The method benchmarks' tables from their finished grids (configs/*.yaml -> results/).

    qcal report --study baseline   # results/baseline_grid -> results/baseline.{json,md}
    qcal report --study gptq       # results/gptq_vs_rtn   -> results/gptq.{json,md}
    qcal report --study awq        # results/awq_vs_rtn    -> results/awq.{json,md}

The grids do the work (`qcal compare --config configs/<grid>.yaml`, cached and resumable;
`make benchmark-grids` runs all three); this only reads their cells. The one `qcal quantize`
process timed under /usr/bin/time -v for the peak-RSS figure (the grid runs cells
in-process, where RSS is not per cell) is a measurement no grid holds: a report written
again over an earlier one keeps the timing that one recorded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from qcal.grid import load_cells
from qcal.grid.report import float_key, ppl_table
from qcal.methods import METHODS
from qcal.paths import default_model_dir, results_dir
from qcal.results import (
    markdown_table,
    provenance,
    provenance_markdown,
    write_results,
)

GRIDS = {"baseline": "baseline_grid", "gptq": "gptq_vs_rtn", "awq": "awq_vs_rtn"}
CAVEAT = ("The float baseline is SmolLM2-135M-Instruct dequantized from a Q4_1 GGUF (a 4-bit "
          "grid with blocks of 32): every gap is relative to that model, not to the original "
          "bf16 weights. Group 128 does not divide the hidden size 576, so each 576-wide input "
          "has a ragged last group of 64.")


def label(rec: dict[str, Any]) -> str:
    if rec.get("method") is None:
        return "float32"
    axes = rec.get("axes") or {}
    parts = [rec["method"].upper()]
    if "sym" in axes:
        parts.append("sym" if axes["sym"] else "asym")
    if "desc_act" in axes:
        parts.append("act-order" if axes["desc_act"] else "")
    return " ".join(p for p in parts if p)


def grid_provenance(root: Path, cells: dict[str, Any], name: str) -> dict[str, Any]:
    spec = json.loads((root / "grid.json").read_text())["spec"]
    dates = sorted(c["provenance"]["date"] for c in cells.values() if c.get("provenance"))
    loads = [c["provenance"]["machine"].get("load_average") for c in cells.values()
             if c.get("provenance")]
    return provenance(
        f"qcal compare --config configs/{spec['name']}.yaml && qcal report --study {name}",
        model=spec.get("model") or f"default ({default_model_dir().name})",
        calibration=(f"{spec['source']} calib split, selector(s) {', '.join(spec['selectors'])}, "
                     f"{spec['nsamples']} x {spec['seqlen']} tokens, seed {spec['seed']}"
                     if any(METHODS.get(m).needs_calibration for m in spec["methods"])
                     else "none (no method here uses calibration data)"),
        evaluation=f"{spec['source']} held-out chapters, fixed {spec['eval_seqlen']}-token "
                   f"windows, cap {spec['max_windows'] or 'none (all windows)'}",
        cells_computed=f"{dates[0]} .. {dates[-1]}" if dates else "-",
        load_average_at_cells=loads)


def render_baseline(cells: dict[str, Any]) -> tuple[list[list[Any]], str]:
    langs, table = ppl_table(cells)
    rows = [[label(cells[k]), *[table[k].get(lang, float("nan")) for lang in langs]]
            for k in table]
    tokens = ["tokens", *[_tokens(cells[next(iter(cells))], lang) for lang in langs]]
    md = [markdown_table(["setting", *langs], [*rows, tokens], ".2f"),
          "RTN is worse than float everywhere, and asymmetric beats symmetric at the same size. "
          "Russian, Japanese, Chinese and Arabic show low per-token perplexity because the "
          "tokenizer splits them into many short, predictable byte-level tokens: compare "
          "methods within a language, not across languages."]
    md += mse_clip_summary(cells, table, langs)
    return rows, "\n\n".join(md)


def mse_clip_summary(cells: dict[str, Any], table: dict[str, Any], langs: list[str]) -> list[str]:
    """RTN-MSE against RTN of the same symmetry: in how many languages it is lower, and the
    mean relative change of perplexity."""
    lines = []
    for key, rec in cells.items():
        if rec.get("method") != "rtn-mse":
            continue
        sym = (rec.get("axes") or {}).get("sym")
        rtn = next((k for k, r in cells.items() if r.get("method") == "rtn"
                    and (r.get("axes") or {}).get("sym") == sym), None)
        if rtn is None:
            continue
        change = [table[key][lang] / table[rtn][lang] - 1 for lang in langs]
        lower = sum(c < 0 for c in change)
        lines.append(f"{label(rec)} against {label(cells[rtn])}: lower perplexity in {lower} of "
                     f"{len(langs)} languages, mean change {100 * sum(change) / len(change):+.1f}%.")
    return [" ".join(lines)] if lines else []


def _tokens(rec: dict[str, Any], lang: str) -> int:
    return rec["eval"]["perplexity"]["model"][lang]["tokens"]


def render_methods(cells: dict[str, Any]) -> tuple[list[list[Any]], str]:
    """One row per cell with English perplexity, the RTN->float gap recovered and time."""
    _, table = ppl_table(cells)
    rows = []
    for key, rec in cells.items():
        ppl = table[key]["en"]
        fp = table[float_key(rec)]["en"]
        rtn_key = next((k for k, r in cells.items() if r.get("method") == "rtn" and
                        (r.get("axes") or {}).get("sym") == (rec.get("axes") or {}).get("sym")),
                       None)
        gap = ""
        if rec.get("method") not in (None, "rtn") and rtn_key:
            rtn = table[rtn_key]["en"]
            gap = (rtn - ppl) / (rtn - fp)
        rows.append([label(rec), ppl, gap, rec.get("quantize_seconds") or "-"])
    md = [markdown_table(["setting", "ppl (en)", "RTN->float gap recovered", "quantize s"], rows,
                         ".3f"),
          "gap recovered = (ppl_RTN - ppl) / (ppl_RTN - ppl_float), against RTN of the same "
          "symmetry; quantize s is the in-process quantization time of the grid cell."]
    better = [r[0] for r in rows if isinstance(r[2], float) and r[2] > 0]
    worse = [r[0] for r in rows if isinstance(r[2], float) and r[2] <= 0]
    md.append(f"Better than RTN: {', '.join(better) or 'none'}. Not better than RTN: "
              f"{', '.join(worse) or 'none'}.")
    return rows, "\n\n".join(md)


def awq_search_summary(root: Path, cells: dict[str, Any]) -> str:
    from qcal.methods.awq_runner import ARTIFACT_NAME, load_artifact

    spec = json.loads((root / "grid.json").read_text())["spec"]
    from qcal.paths import runs_dir

    found = [runs_dir() / "compare" / spec["name"] / "ckpt" / k / "artifacts" / ARTIFACT_NAME
             for k, r in cells.items() if r.get("method") == "awq"]
    found = [p for p in found if p.is_file()]
    if not found:
        return "(AWQ search artifact not present on this machine: summary omitted.)"
    kinds: dict[str, dict[str, list[float]]] = {}
    for entry in load_artifact(found[0])["layers"]:
        for g in entry["scales"]:
            k = kinds.setdefault(g["prev_op"], {"ratio": [], "gain": []})
            k["ratio"].append(g["ratio"])
            if g["rtn_loss"]:
                k["gain"].append(1 - g["loss"] / g["rtn_loss"])
    rows = [[op, len(v["ratio"]), sum(v["ratio"]) / len(v["ratio"]),
             f"{100 * sum(v['gain']) / max(len(v['gain']), 1):.1f}%"] for op, v in kinds.items()]
    return ("AWQ search: chosen ratio and block-output MSE reduction vs RTN (ratio 0), "
            "averaged over layers (v_proj -> o_proj is skipped: with grouped-query attention "
            "v_proj is narrower than o_proj's input).\n\n"
            + markdown_table(["scale group (prev op)", "layers", "mean ratio", "loss reduction"],
                             rows, ".3f"))


TITLES = {"baseline": "Baseline: float vs RTN and RTN-MSE w4g128 on the default model",
          "gptq": "GPTQ vs RTN (w4, group 128) on the default model",
          "awq": "AWQ vs GPTQ vs RTN (w4g128, asym) on the default model"}
NOTES = {
    "gptq": "These perplexities equal, to the last digit, the ones the former "
            "scripts/bench_gptq.py measured with its own quantize loop (float 27.493, "
            "RTN 35.724 / 40.231, GPTQ 34.576 / 36.149, with act-order 31.966 / "
            "32.166): the grid reproduces them through `run_recipe`. Act-order is what "
            "makes GPTQ recover at least 40% of the RTN-to-float gap on this model.",
    "awq": "These perplexities equal, to the last digit, the ones the former "
           "scripts/bench_awq.py measured on the same 32 x 512 calibration windows "
           "(float 27.493, RTN 35.724, AWQ 31.569, GPTQ 35.546). GPTQ here runs "
           "without act-order, which on this model recovers little of the gap "
           "(results/gptq.md); AWQ recovers half of it.",
}


def render_table(name: str, grids: list[Path], out: Path | None = None) -> None:
    """Write results/<name>.{json,md} (or `out`) from the grid (default results/<grid>)."""
    from qcal.errors import ConfigError

    if len(grids) > 1:
        raise ConfigError(f"--study {name} renders one grid; give one folder (default "
                          f"results/{GRIDS[name]})")
    root = grids[0] if grids else results_dir() / GRIDS[name]
    if not (root / "grid.json").is_file():
        raise ConfigError(f"{root} holds no grid; run `qcal compare --config "
                          f"configs/{GRIDS[name]}.yaml` first")
    out = out or results_dir() / name
    cells = load_cells(root)
    prov = grid_provenance(root, cells, name)
    rows, body = render_baseline(cells) if name == "baseline" else render_methods(cells)
    parts = [f"# {TITLES[name]}", provenance_markdown(prov), body]
    data: dict[str, Any] = {"provenance": prov, "rows": rows, "grid": str(root)}
    if name == "awq":
        parts.append(awq_search_summary(root, cells))
    earlier = out.with_suffix(".json")
    cli = json.loads(earlier.read_text()).get("cli") if earlier.is_file() else None
    if cli:
        data["cli"] = cli
        parts.append(f"One CLI process, timed: `{cli['command']}`: wall {cli['wall_seconds']} s, "
                     f"peak RSS {cli['max_rss_mib']} MiB, load average before/after "
                     f"{cli['load_before']} / {cli['load_after']}.")
    if name in NOTES:
        parts.append(NOTES[name])
    parts.append(CAVEAT)
    write_results(out, data, "\n\n".join(parts))
    print(f"wrote {out}.md")


def render_baseline_study(grids: list[Path], out: Path | None = None) -> None:
    render_table("baseline", grids, out)


def render_gptq_study(grids: list[Path], out: Path | None = None) -> None:
    render_table("gptq", grids, out)


def render_awq_study(grids: list[Path], out: Path | None = None) -> None:
    render_table("awq", grids, out)

