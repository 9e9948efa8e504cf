"""`qcal compare` (run the calibration x method grid) and `qcal report` (render it)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

DEFAULT_MAX_CELLS = 200  # a 1,000,001-cell grid (an ETA of 1,069 h) used to just start


def add_parser(sub: Any) -> None:
    p = sub.add_parser("compare", help="run a calibration-set x method grid (cached, resumable)")
    p.add_argument("--config", type=Path, default=None, help="grid YAML (GridSpec fields)")
    p.add_argument("--name", default=None, help="run name: results/<name>, runs/compare/<name>")
    p.add_argument("--model", default=None, help="model dir (default: the grid's, else embedded)")
    p.add_argument("--selectors", default=None,
                   help="e.g. random,zipf,perplexity,ml:en,ml:de,mix:uniform")
    p.add_argument("--methods", default=None, help="e.g. rtn,gptq,awq")
    p.add_argument("--bits", type=int, default=None, help="bits per weight (default: grid's, else 4)")
    p.add_argument("--group-size", type=int, default=None,
                   help="group size, -1 per channel (default: grid's, else auto)")
    p.add_argument("--sym", action="store_true", default=None,
                   help="symmetric grid (default: grid's, else asymmetric)")
    p.add_argument("--desc-act", action="store_true", default=None,
                   help="GPTQ act-order (columns by descending Hessian diagonal)")
    p.add_argument("--source", default=None, help="calibration source (default debian-handbook)")
    p.add_argument("--nsamples", type=int, default=None,
                   help="calibration windows (default: grid's, else 128)")
    p.add_argument("--seqlen", type=int, default=None,
                   help="calibration window tokens (default: grid's, else 512)")
    p.add_argument("--seed", type=int, default=None, help="calibration seed >= 0 (default: grid's, else 0)")
    p.add_argument("--eval", default=None,
                   help="comma list: ppl, confidence (metrics on the tasks) and task names "
                        "(e.g. ppl,confidence,qcal_nextsent_en)")
    p.add_argument("--eval-langs", default=None, help="perplexity languages, e.g. en,de,ja")
    p.add_argument("--eval-seqlen", type=int, default=None,
                   help="evaluation window tokens (default: grid's, else 512)")
    p.add_argument("--max-windows", type=int, default=None,
                   help="evaluation windows per language, >= 1 (default: grid's, else all)")
    p.add_argument("--limit", type=int, default=None, help="items per task")
    p.add_argument("--results-dir", type=Path, default=None,
                   help="parent of results/<name> (default: $QCAL_RESULTS_DIR or results/)")
    p.add_argument("--device", default="auto",
                   help="cpu, cuda, cuda:N or auto (default: CUDA when present)")
    p.add_argument("--shard", default=None, metavar="I/N",
                   help="run only every N-th cell from the I-th (0-based), e.g. one task of a "
                        "SLURM array: --shard $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT")
    p.add_argument("--executor", default="local", choices=("local", "ray"),
                   help="local: this process (and --jobs workers); ray: each cell a Ray task "
                        "(pip install qcal[ray]); cells are cached either way")
    p.add_argument("--address", default=None,
                   help="with --executor ray: the cluster to join (default: start a local one)")
    p.add_argument("--jobs", type=int, default=1,
                   help="cells run at once, in worker processes sharing the CPU threads")
    p.add_argument("--discard-checkpoints", action="store_true",
                   help="delete each quantized cell's checkpoint once its results are written "
                        "(a grid otherwise keeps one model's worth of disk per cell; a cell "
                        "that is run again rebuilds it)")
    p.add_argument("--max-cells", type=int, default=DEFAULT_MAX_CELLS,
                   help="refuse a grid of more cells than this, before running any "
                        "(default %(default)s; raise it for a grid you mean to run)")
    p.set_defaults(handler=run_compare)
    r = sub.add_parser("report", help="render tables and plots of comparison grids, or a "
                                      "study's report from its grids (--study)")
    r.add_argument("run_dir", type=Path, nargs="*",
                   help="results/<run> folders written by `qcal compare` (a study has defaults)")
    r.add_argument("--title", default=None, help="report title (default: the run's name)")
    r.add_argument("--study", default=None,
                   help="render a study's report or a benchmark's table: zipcal, "
                        "multilingual, confidence (with benchmarks), selection; the method "
                        "tables baseline, gptq, awq; architectures and reliability (run their "
                        "checks); lambada-items (completes older benchmark cells); from a "
                        "benchmark's JSON: peers, gptq-vs-peer, kernels, big-model, window-nll, "
                        "shared-context, selection-cost, scaling, selectors, interop, peers-scale, "
                        "scale-1p5b, gptq-phase-split")
    r.add_argument("--out", type=Path, default=None,
                   help="with --study: the report's path without suffix (default under results/)")
    r.add_argument("--bench-grid", type=Path, action="append", default=None,
                   help="with --study confidence: a benchmark grid (repeatable; default "
                        "results/study_benchmarks*)")
    r.add_argument("--out-benchmarks", type=Path, default=None,
                   help="with --study confidence: the benchmarks report's path without suffix")
    r.set_defaults(handler=run_report)


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": args.name, "model": args.model, "selectors": args.selectors,
        "methods": args.methods, "bits": args.bits, "group_size": args.group_size,
        "sym": args.sym, "desc_act": args.desc_act, "source": args.source, "nsamples": args.nsamples,
        "seqlen": args.seqlen, "seed": args.seed, "eval_langs": args.eval_langs,
        "eval_seqlen": args.eval_seqlen, "max_windows": args.max_windows, "limit": args.limit,
    }
    if args.eval:
        parts = [p for p in args.eval.split(",") if p]
        # "calibration" is the old name of "confidence"; both switch the metrics on.
        out["confidence"] = bool({"confidence", "calibration"} & set(parts))
        out["tasks"] = [p for p in parts if p not in {"ppl", "confidence", "calibration"}]
    return {k: v for k, v in out.items() if v is not None}


def _shard(text: str | None) -> tuple[int, int] | None:
    from qcal.errors import ConfigError

    if text is None:
        return None
    index, _, count = text.partition("/")
    if not (index.strip().isdigit() and count.strip().isdigit()):
        raise ConfigError(f"--shard {text!r} is not I/N (e.g. 0/4)")
    return int(index), int(count)


def run_compare(args: argparse.Namespace) -> int:
    from qcal.errors import ConfigError, ModelNotFoundError, RemoteCodeError
    from qcal.grid import GridRunner, grid_from_dict, load_grid_config
    from qcal.grid.report import render_report
    from qcal.grid.spec import count_cells
    from qcal.paths import results_dir, runs_dir

    overrides = _overrides(args)
    spec = (load_grid_config(args.config, overrides) if args.config
            else grid_from_dict(overrides))
    results_root = (args.results_dir or results_dir()) / spec.name
    cells = count_cells(spec)
    if cells > args.max_cells:
        raise ConfigError(f"grid {spec.name} has {cells:,} cells ({_cell_count_parts(spec)}), "
                          f"more than --max-cells {args.max_cells}; shrink an axis, or pass "
                          f"--max-cells {cells} to run them all")
    try:
        runner = GridRunner(spec, results_root, runs_dir() / "compare" / spec.name,
                            jobs=args.jobs, device=args.device, shard=_shard(args.shard),
                            executor=args.executor, address=args.address,
                            keep_checkpoints=not args.discard_checkpoints)
        runner.run()
    except RemoteCodeError as err:  # the generic fix names a flag compare does not have
        raise ModelNotFoundError(
            f"{err.what}; `qcal compare` never runs a model's own code (it has no "
            "--trust-remote-code): compare models whose architecture transformers knows") from None
    render_report(results_root)
    print(f"grid {spec.name}: results in {results_root} (report.md)")
    return 0


def _cell_count_parts(spec: Any) -> str:
    """The sizes that multiply into a grid's cell count, for its refusal line."""
    parts = [f"{len(spec.methods)} methods", f"{len(spec.selectors)} selectors"]
    parts += [f"{len(spec.values(a))} {a}" for a in spec.varying()]
    return " x ".join(parts)


def check_run_dir(run_dir: Path) -> None:
    """Every JSON file a report reads parses: a truncated cell (a kill mid-copy, a full disk
    elsewhere) is named with its fix instead of failing inside the renderer."""
    import json

    from qcal.errors import ConfigError

    if not run_dir.is_dir():
        raise ConfigError(f"{run_dir} does not exist; give a folder that `qcal compare` wrote "
                          "(results/<name>)")
    for path in [run_dir / "grid.json", *sorted((run_dir / "cells").glob("*.json"))]:
        if not path.is_file():
            continue
        try:
            json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as err:
            raise ConfigError(f"{path} is truncated or not JSON ({str(err).splitlines()[0]}); "
                              "delete it and run the same `qcal compare` again to redo it"
                              ) from None


def run_report(args: argparse.Namespace) -> int:
    from qcal.errors import ConfigError
    from qcal.grid.report import render_report

    if args.study is not None:
        # The studies live outside the core library: reached here only, lazily.
        from qcal.studies.report import render_study

        render_study(args.study, args.run_dir, args.out, args.bench_grid, args.out_benchmarks)
        return 0
    if not args.run_dir:
        raise ConfigError("qcal report needs a grid folder (results/<run> written by `qcal "
                          "compare`), or --study NAME")
    if args.out is not None or args.bench_grid or args.out_benchmarks is not None:
        raise ConfigError("--out, --bench-grid and --out-benchmarks go with --study; a grid's "
                          "report is written into its folder")
    for run_dir in args.run_dir:
        check_run_dir(run_dir)
        data = render_report(run_dir, args.title)
        print(f"wrote {run_dir}/report.md with {len(data['perplexity'])} cells")
    return 0
