"""`qcal report GRID... --study NAME`: a study's report from its grids.

Each study renders in its own module (`render(grids, out, ...)`, defaults under results/,
or the function named after a colon); this table names them. The CLI reaches it lazily, so
the core never imports a study.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from qcal.errors import ConfigError

STUDIES = {
    "zipcal": "qcal.studies.zipcal_report",
    "multilingual": "qcal.studies.multilingual_report",
    "confidence": "qcal.studies.confidence_report",  # and the benchmarks report
    "selection": "qcal.studies.selection_report",  # the issue-8 tables beside their grids
    "baseline": "qcal.studies.method_tables:render_baseline_study",
    "gptq": "qcal.studies.method_tables:render_gptq_study",
    "awq": "qcal.studies.method_tables:render_awq_study",
    "reliability": "qcal.studies.reliability:render",  # runs the bad-input suite first
    "lambada-items": "qcal.studies.lambada_items:render",  # completes cells, renders nothing
    "architectures": "qcal.studies.architectures:render_study",  # quantizes tiny families
    "kernels": "qcal.studies.kernels_report:render_study",  # from scripts/bench_kernels.py
    "big-model": "qcal.studies.big_model:render_study",  # from scripts/bench_big_model.py
    "window-nll": "qcal.studies.bench_tables:window_nll_study",
    "shared-context": "qcal.studies.bench_tables:shared_context_study",
    "selection-cost": "qcal.studies.bench_tables:selection_cost_study",
    "scaling": "qcal.studies.bench_tables:scaling_study",
    "selectors": "qcal.studies.bench_tables:selectors_study",
    "interop": "qcal.studies.bench_tables:interop_study",
    "peers": "qcal.studies.peers_report:render_speed_study",  # from scripts/bench_peers.py
    "gptq-vs-peer": "qcal.studies.peers_report:render_loaders_study",
    "peers-scale": "qcal.studies.peers_scale:render_scale_study",  # bench_peers.py --scale
    "scale-1p5b": "qcal.studies.scale_report:render_journeys_study",
    "gptq-phase-split": "qcal.studies.phase_split:render_study",
}


def render_study(name: str, grids: list[Path], out: Path | None = None,
                 bench_grids: list[Path] | None = None,
                 out_benchmarks: Path | None = None) -> None:
    """Render study `name` from `grids` (its default grids when empty) into `out`."""
    if name not in STUDIES:
        raise ConfigError(f"--study {name!r} is unknown; choose from {', '.join(STUDIES)}")
    module_name, _, function = STUDIES[name].partition(":")
    render = getattr(importlib.import_module(module_name), function or "render")
    if name == "confidence":
        render(grids, out, bench_grids, out_benchmarks)
        return
    if bench_grids or out_benchmarks is not None:
        raise ConfigError(f"--bench-grid and --out-benchmarks belong to --study confidence, "
                          f"not {name}")
    render(grids, out)
