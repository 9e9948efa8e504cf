"""What the study reports (`qcal report --study NAME`) share: a section heading that says
how far a grid has run, and the rendering of one report from one or more grids (one per
model) with the command that made it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from qcal.errors import ConfigError
from qcal.paths import qcal_home, results_dir
from qcal.results import provenance, provenance_markdown, write_results

DEFAULT_MODEL = "SmolLM2-135M-Instruct (default model)"


def shown(path: Path, root: Path) -> str:
    """`path` relative to the repository `root` where it lies inside it, else absolute (a
    report rendered from or into a folder elsewhere still names it)."""
    path = Path(path).resolve()
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def model_label(spec: dict[str, Any]) -> str:
    """The model a grid ran, as the study reports name it."""
    return spec.get("model") or DEFAULT_MODEL


def grid_heading(run: Path, root: Path, spec: dict[str, Any], done: int, missing: list[str],
                 extra: str = "") -> list[str]:
    """The model's heading and a line with the grid's command and how many cells are done
    (PARTIAL and the missing cells, if any); `extra` is appended to that line."""
    return [f"## {model_label(spec)} (`{shown(run, root)}`)",
            f"Grid: `qcal compare --config configs/{run.name}.yaml`; cells finished: "
            f"{done} of {done + len(missing)}"
            + (f" (PARTIAL; not yet run: {', '.join(missing)})" if missing else "")
            + extra + "." + dropped_tasks_text(run)]


def dropped_tasks_text(run: Path) -> str:
    """A sentence naming the tasks dropped from a grid after some cells had run (recorded
    in its grid.json by `qcal compare`), or "" when none were."""
    grid_file = run / "grid.json"
    history = json.loads(grid_file.read_text()).get("dropped_tasks", []) if grid_file.is_file() else []
    return "".join(f" Tasks {', '.join(h['tasks'])} were dropped from this grid after "
                   f"{h['cells_finished']} cell(s) had run: they are not reported here."
                   for h in history)


def report_root() -> Path:
    """The folder a report names its grids and outputs relative to: qcal's home (in a
    checkout, the repository)."""
    return qcal_home().resolve()


def chart_path(out: Path, run: Path) -> Path:
    """The PNG beside report `out` (a path without suffix) for grid `run`: <out>_<grid>.png,
    linked from the report by its bare name."""
    return out.with_name(f"{out.name}_{run.name}.png")


def chart_link(chart: Path, caption: str) -> str:
    return f"![{caption}]({chart.name})"


def write_report(out: Path, data: dict[str, Any], markdown: str, charts: list[Path]) -> None:
    """Write report `out` (.md and .json) and record in its JSON the charts it links. A chart
    an earlier render of this report recorded and this one no longer links (its source grid
    changed) is removed, so no stale chart outlives its table. Only names this report gave
    (<out>_*.png beside it) are ever removed: a file the report did not write is never touched."""
    out = Path(out)
    linked = [c for c in charts if c.exists() and f"]({c.name})" in markdown]
    before = _recorded_charts(out.with_suffix(".json"))
    write_results(out, {**data, "charts": [c.name for c in linked]}, markdown)
    keep = {c.name for c in linked}
    for name in before - keep:
        if name.startswith(f"{out.name}_") and name.endswith(".png") and "/" not in name:
            (out.parent / name).unlink(missing_ok=True)


def _recorded_charts(report_json: Path) -> set[str]:
    """The chart names an earlier render recorded in `report_json`; none if it is missing or
    not such a report (then nothing is pruned)."""
    try:
        recorded = json.loads(report_json.read_text()).get("charts")
    except (OSError, ValueError, AttributeError):
        return set()
    return {n for n in recorded if isinstance(n, str)} if isinstance(recorded, list) else set()


def render_study(study: str, grids: list[Path], out: Path | None, grid_name: str, out_name: str,
                 section: Callable[[Path, Path], tuple[str, dict[str, Any]]], title: str,
                 intro: list[str], caveat: str) -> None:
    """Render `section(grid, chart)` for every grid (default results/<grid_name>) between
    `title` + `intro` and `caveat`, and write <out>.md and <out>.json (default
    results/<out_name>) with the command that made them. `chart` is where the section may
    write its interval chart: `chart_path(out, grid)`."""
    root = report_root()
    out = Path(out) if out is not None else results_dir() / out_name
    grids = [Path(g).resolve() for g in (grids or [results_dir() / grid_name])]
    sections, data, charts = [], {}, []
    for run in grids:
        if not (run / "cells").is_dir():
            raise ConfigError(f"{run} has no cells yet; run its `qcal compare --config` first")
        charts.append(chart_path(out.resolve(), run))
        md, data[run.name] = section(run, charts[-1])
        sections.append(md)
    prov = provenance(command="qcal report " + " ".join(shown(g, root) for g in grids)
                      + f" --study {study} --out {shown(out, root)}")
    md = "\n\n".join([title, provenance_markdown(prov), *intro, *sections, caveat])
    write_report(out.resolve(), {"provenance": prov, "grids": data}, md, charts)
    print(f"wrote {out}.md")
