"""`qcal report`: tables and plots from a finished (or partial) comparison grid.

Per-language perplexity for every cell and its change against the float model;
a heatmap of that change by calibration setting x evaluation language per method;
and, when the grid ran multiple-choice tasks, accuracy / ECE / gold-answer
confidence with their drift from the float model (bar chart).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from qcal.errors import ConfigError
from qcal.grid import FLOAT_CELL, load_cells
from qcal.grid.evidence import model_ppl
from qcal.results import markdown_table, provenance, provenance_markdown, write_results


def ppl_table(cells: dict[str, dict[str, Any]]) -> tuple[list[str], dict[str, dict[str, float]]]:
    langs: list[str] = []
    table: dict[str, dict[str, float]] = {}
    for key, rec in cells.items():
        row = {}
        for lang, res in model_ppl(rec).items():
            row[lang] = float(res["ppl"])
            if lang not in langs:
                langs.append(lang)
        table[key] = row
    return langs, table


def _check_renderable(results_root: Path, cells: dict[str, dict[str, Any]]) -> None:
    """Before anything is written: every perplexity a real number >= 1 (a NaN or negative one
    is an edited or broken cell, never a finding), and report.md/json qcal's own to replace."""
    import math

    from qcal.fsio import wrote_result_file

    for key, rec in cells.items():
        for lang, res in model_ppl(rec).items():
            value = res.get("ppl") if isinstance(res, dict) else None
            if isinstance(value, bool) or not isinstance(value, int | float) \
                    or not math.isfinite(value) or value < 1:
                raise ConfigError(f"{results_root}/cells/{key}.json holds perplexity {value!r} "
                                  f"for {lang}, not a number >= 1; delete the cell and run the "
                                  "same `qcal compare` again to redo it")
    for name in ("report.md", "report.json"):
        path = results_root / name
        if path.is_symlink() or path.is_dir() or (path.exists() and not wrote_result_file(path)):
            raise ConfigError(f"{path} exists and qcal did not write it; move it out of the "
                              "folder (qcal writes the grid's report there)")


def float_key(record: dict[str, Any]) -> str:
    """The float cell a cell is compared with (its own model's, in multi-model grids)."""
    return record.get("float_cell") or FLOAT_CELL


def item_probs(record: dict[str, Any]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    from qcal.eval.confidence import stack_probs

    out = {}
    for task, items in (record.get("items") or {}).items():
        if items:
            probs = stack_probs([it["lls"] for it in items])
            out[task] = (probs, np.array([it["gold"] for it in items]))
    return out


def confidence_rows(cells: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    from qcal.eval.confidence import confidence_metrics
    from qcal.eval.drift import item_drift

    floats = {k: item_probs(r) for k, r in cells.items() if r.get("method") is None}
    rows = []
    for key, rec in cells.items():
        base = floats.get(float_key(rec))
        if base is None:
            continue
        for task, (probs, gold) in item_probs(rec).items():
            m = confidence_metrics(probs, gold)
            row = {"cell": key, "task": task, **{k: m[k] for k in ("acc", "conf_true", "ece",
                                                                    "brier", "nll")}}
            if rec.get("method") is not None and task in base and base[task][0].shape == probs.shape:
                d = item_drift(base[task][0], probs, gold)
                bm = confidence_metrics(*base[task])
                row.update({"d_acc": m["acc"] - bm["acc"], "d_conf_true": d["delta_conf_true"],
                            "d_ece": m["ece"] - bm["ece"], "flip_rate": d["flip_rate"],
                            "flips_to_wrong": d["flips_to_wrong"],
                            "flips_to_correct": d["flips_to_correct"],
                            "mcnemar_p": d["mcnemar_p"],
                            "low_conf_quartile_d_conf_true":
                                d["by_base_conf_quantile"][0].get("delta_conf_true")})
            rows.append(row)
    return rows


def _change(row: dict[str, float], base: dict[str, float], lang: str) -> float:
    """Perplexity change vs the float model in percent (NaN where either is missing)."""
    if lang not in base or lang not in row:
        return float("nan")
    return 100 * (row[lang] / base[lang] - 1)


def _heatmaps(cells: dict[str, dict[str, Any]], langs: list[str],
              table: dict[str, dict[str, float]], out_dir: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = sorted({rec.get("method") for rec in cells.values() if rec.get("selector")})
    written = []
    for method in methods:
        keys = [k for k, r in cells.items() if r.get("method") == method and r.get("selector")
                and table.get(float_key(r))]
        if not keys:
            continue
        grid = np.array([[_change(table[k], table[float_key(cells[k])], lang) for lang in langs]
                          for k in keys])
        fig, ax = plt.subplots(figsize=(1.0 + 0.8 * len(langs), 1.2 + 0.45 * len(keys)))
        im = ax.imshow(grid, cmap="RdYlGn_r", aspect="auto")
        ax.set_xticks(range(len(langs)), langs)
        ax.set_yticks(range(len(keys)), [k.removesuffix(f"__{method}").replace(f"__{method}__", " ")
                                         for k in keys])
        for i in range(grid.shape[0]):
            for j in range(grid.shape[1]):
                if np.isfinite(grid[i, j]):
                    ax.text(j, i, f"{grid[i, j]:.1f}", ha="center", va="center", fontsize=7)
        ax.set_xlabel("evaluation language")
        ax.set_ylabel("calibration setting")
        ax.set_title(f"{method}: perplexity change vs float (%)")
        fig.colorbar(im, ax=ax)
        fig.tight_layout()
        name = f"heatmap_{method}.png"
        fig.savefig(out_dir / name, dpi=120)
        plt.close(fig)
        written.append(name)
    return written


def _drift_bars(rows: list[dict[str, Any]], out_dir: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drift = [r for r in rows if "d_conf_true" in r]
    if not drift:
        return []
    fig, axes = plt.subplots(1, 3, figsize=(13, max(2.0, 0.8 + 0.35 * len(drift))), sharey=True)
    labels = [f"{r['cell']} [{r['task']}]" for r in drift]
    for ax, metric in zip(axes, ("d_conf_true", "d_ece", "flip_rate"), strict=True):
        ax.barh(range(len(drift)), [r[metric] for r in drift], color="tab:blue")
        ax.axvline(0, color="black", lw=0.8)
        ax.set_title(metric)
    axes[0].set_yticks(range(len(drift)), labels, fontsize=7)
    fig.tight_layout()
    fig.savefig(out_dir / "drift.png", dpi=120)
    plt.close(fig)
    return ["drift.png"]


def _command_lines(cells: dict[str, dict[str, Any]]) -> list[str]:
    """One line per distinct command that produced cells: a resumed grid may span several
    (cells that a spec change leaves valid, like float and RTN, are kept from the first)."""
    by_command: dict[str, list[str]] = {}
    for key, rec in cells.items():
        cmd = rec.get("provenance", {}).get("command") or "(not recorded)"
        by_command.setdefault(cmd, []).append(key)
    if len(by_command) == 1:
        return [f"- Grid command: `{next(iter(by_command))}`"]
    return [f"- Grid command for {', '.join(keys)}: `{cmd}`"
            for cmd, keys in by_command.items()]


def render_report(results_root: Path, title: str | None = None) -> dict[str, Any]:
    """Write report.{json,md} and PNG plots into `results_root`; returns the report data."""
    results_root = Path(results_root)
    cells = load_cells(results_root)
    if not cells:
        raise ConfigError(f"{results_root}/cells holds no finished cell yet")
    _check_renderable(results_root, cells)
    spec = json.loads((results_root / "grid.json").read_text())["spec"]
    langs, table = ppl_table(cells)
    rows = confidence_rows(cells)
    plots = _heatmaps(cells, langs, table, results_root) + _drift_bars(rows, results_root)
    ppl_rows = []
    for key, row in table.items():
        rec = cells[key]
        ppl_rows.append([key, rec.get("selector") or "-", rec.get("method") or "float",
                         *[row.get(lang, float("nan")) for lang in langs],
                         rec.get("quantize_seconds") or "-"])
    delta_rows = [[key, *[_change(table[key], table[float_key(cells[key])], lang) for lang in langs]]
                  for key in table if cells[key].get("method") is not None
                  and table.get(float_key(cells[key]))]
    prov = provenance(command=f"qcal report {results_root}",
                      model=spec.get("model") or "default (SmolLM2-135M-Instruct)",
                      data=f"calibration from {spec['source']} (calib split), nsamples="
                           f"{spec['nsamples']} x seqlen={spec['seqlen']}, seed={spec['seed']}; "
                           f"evaluation on held-out chapters, {spec['eval_seqlen']}-token "
                           f"windows, max_windows={spec['max_windows']}")
    parts = [f"# {title or 'Calibration-set comparison: ' + spec['name']}",
             provenance_markdown(prov), *_command_lines(cells),
             f"- Scheme: w{spec['bits']} g{spec['group_size']} "
             f"{'sym' if spec['sym'] else 'asym'}"
             f"{', GPTQ act-order' if spec.get('desc_act') else ''}; "
             f"methods {', '.join(spec['methods'])}; "
             f"selectors {', '.join(spec['selectors'])}",
             "## Perplexity per evaluation language",
             markdown_table(["cell", "calibration", "method", *langs, "quantize s"], ppl_rows,
                            ".2f")]
    if delta_rows:
        parts += ["## Perplexity change vs float (%)",
                  markdown_table(["cell", *langs], delta_rows, ".1f")]
    if rows:
        keys = sorted({k for r in rows for k in r} - {"cell", "task"})
        parts += ["## Multiple-choice accuracy, calibration and drift vs float",
                  markdown_table(["cell", "task", *keys],
                                 [[r["cell"], r["task"], *[r.get(k, "-") for k in keys]]
                                  for r in rows], ".4f")]
    if langs and len({(r.get("axes") or {}).get("nsamples") for r in cells.values()} - {None}) > 1:
        from qcal.grid.sample_size import curves, plot, reading

        sizes = curves(cells, table, langs[0], spec["seqlen"])
        if sizes:
            plots.append(plot(sizes, langs[0], results_root / "sample_size.png"))
            parts += [f"## Sample size ({langs[0]} perplexity against calibration tokens, mean "
                      "and 95% t-interval over seeds)",
                      *[f"- {name}: {reading(points)}" for name, points in sizes.items()]]
    from qcal.grid.evidence import evidence_markdown

    evidence_parts, evidence = evidence_markdown(cells, spec["selectors"][0])
    parts += evidence_parts
    parts += [f"![{p}]({p})" for p in plots]
    data = {"provenance": prov, "spec": spec, "perplexity": table, "confidence": rows,
            "plots": plots, "evidence": evidence}
    write_results(results_root / "report", data, "\n\n".join(parts))
    return data
