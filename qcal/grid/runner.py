"""The comparison grid: calibration settings x quantization methods -> results/.

Each cell = (calibration setting, method). Running a cell builds (or reuses by
recipe hash) its calibration set, quantizes the model, evaluates the checkpoint
and writes `<results>/cells/<cell>.json` atomically. A cell whose JSON exists is
never recomputed; a cell interrupted after its checkpoint was written only
re-runs the evaluation, and an interrupted GPTQ/AWQ run resumes from its last
finished layer. RTN ignores calibration data, so it forms a single cell, and the
float model is evaluated once as the reference ("float").

With `jobs > 1` cells run in that many spawned worker processes, each with its share
of the CPU threads; calibration sets are built up front in the parent (so workers
never race on a cache entry) and only the parent writes cell files.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from qcal.cache import StepCache
from qcal.devices import resolve_device
from qcal.errors import ConfigError
from qcal.fsio import atomic_write_text, clean_stale_tree
from qcal.grid.executors import run_here, run_in_processes
from qcal.grid.spec import RECIPE_ONLY_FIELDS, Cell, GridSpec, grid_from_dict, plan_cells
from qcal.locking import exclusive_lock
from qcal.results import provenance


class GridRunner:
    """Runs a grid under `results_root` (tables) and `work_root` (calib sets, checkpoints)."""

    def __init__(self, spec: GridSpec, results_root: Path, work_root: Path,
                 progress: bool = True, jobs: int = 1, device: str = "auto",
                 shard: tuple[int, int] | None = None, executor: str = "local",
                 address: str | None = None, keep_checkpoints: bool = True) -> None:
        if executor not in ("local", "ray"):
            raise ConfigError(f"--executor {executor!r} is unknown; use local (default) or ray")
        self.executor, self.address = executor, address
        if jobs < 1:
            raise ConfigError(f"--jobs must be >= 1, got {jobs}")
        if shard is not None and not 0 <= shard[0] < shard[1]:
            raise ConfigError(f"--shard {shard[0]}/{shard[1]} is out of range: use I/N with "
                              "0 <= I < N")
        self.shard = shard
        self.keep_checkpoints = keep_checkpoints
        self.spec, self.progress, self.jobs = spec, progress, jobs
        self.device = resolve_device(device)
        self.results_root, self.work_root = Path(results_root), Path(work_root)
        self.cells_dir = self.results_root / "cells"
        self.cache = StepCache(self.work_root)

    def cell_path(self, cell: Cell) -> Path:
        return self.cells_dir / f"{cell.key}.json"

    def mine(self) -> list[Cell]:
        """This runner's cells: all, or with --shard I/N every N-th cell from the I-th."""
        cells = plan_cells(self.spec)
        if self.shard is None:
            return cells
        index, count = self.shard
        return cells[index::count]

    def pending(self) -> list[Cell]:
        todo = []
        for cell in self.mine():
            if self.is_current(cell):  # reads the cell's file: once per cell
                continue
            if self.cell_path(cell).is_file():
                print(f"qcal compare: {cell.key} was computed with other method or selector settings "
                      "or code (its recipe changed); computing it again", file=sys.stderr)
            todo.append(cell)
        return todo

    def recipe_key(self, cell: Cell) -> str | None:
        """What the cell's checkpoint depends on (model, method config, calibration, format)."""
        if cell.method is None:
            return None
        from qcal.model.loading import resolve_model_dir

        recipe = self.spec.recipe(cell, self.work_root / "ckpt" / cell.key, self.device)
        return recipe.checkpoint_key(resolve_model_dir(recipe.model))

    def is_current(self, cell: Cell) -> bool:
        """A finished cell whose recipe is today's. Cells written before recipe keys were
        recorded carry none and are kept as they are."""
        path = self.cell_path(cell)
        if not path.is_file():
            return False
        if cell.method is None:
            return True
        try:
            saved = json.loads(path.read_text()).get("recipe_key")
        except (OSError, ValueError):
            return False
        return saved is None or saved == self.recipe_key(cell)

    def _clean_stale(self) -> None:
        # A kill during an atomic write leaves only qcal's hidden temp siblings behind;
        # clean_stale_tree removes nothing else.
        for root in (self.work_root, self.results_root):
            clean_stale_tree(root)

    def _write_spec(self) -> None:
        spec_file = self.results_root / "grid.json"
        current = dataclasses.asdict(self.spec)
        saved_file = json.loads(spec_file.read_text()) if spec_file.is_file() else {}
        kept = {k: v for k, v in saved_file.items() if k != "spec"}  # e.g. dropped_tasks
        if saved_file:
            # Compared as specs, so a field added since (with its default) or renamed is no change.
            raw = saved_file["spec"]
            # Grids saved before the field existed allowed ragged groups implicitly.
            raw.setdefault("allow_ragged_groups", True)
            saved = grid_from_dict(raw)
            if saved == self.spec:
                return
            dropped = self._dropped_tasks(saved)
            if dropped:
                finished = len(list(self.cells_dir.glob("*.json")))
                kept["dropped_tasks"] = [*kept.get("dropped_tasks", []),
                                         {"tasks": dropped, "cells_finished": finished}]
                print(f"{self.spec.name}: tasks {', '.join(dropped)} dropped from the grid; "
                      f"its {finished} finished cells keep their scores on them, reports show "
                      "only the grid's tasks", file=sys.stderr)
            elif self._added_methods(saved):
                print(f"{self.spec.name}: methods {', '.join(self._added_methods(saved))} added; "
                      "the finished cells stay as they are", file=sys.stderr)
            # Options only change cells' recipes, and recipe keys tell which cells are stale
            # (they rerun); any other change would mix two grids in one directory.
            elif dataclasses.replace(saved, **RECIPE_ONLY_FIELDS) != dataclasses.replace(
                    self.spec, **RECIPE_ONLY_FIELDS):
                raise ConfigError(
                    f"{self.results_root} holds a different grid; choose another --name "
                    "or delete that directory"
                )
            else:
                print(f"{self.spec.name}: method/selector options changed; cells made with the "
                      "old ones are recomputed", file=sys.stderr)
        atomic_write_text(spec_file, json.dumps({"spec": current, **kept}, indent=2))

    def _added_methods(self, saved: GridSpec) -> list[str]:
        """The methods this spec adds to the saved one, when that (with method or selector
        options) is its only change: a cell's key and recipe do not depend on the other
        methods, so finished cells stay valid (and recipe keys rerun any an option changed)."""
        added = [m for m in self.spec.methods if m not in saved.methods]
        if not added or not set(saved.methods) < set(self.spec.methods):
            return []
        same_otherwise = dataclasses.replace(saved, methods=self.spec.methods,
                                             **RECIPE_ONLY_FIELDS) == dataclasses.replace(
                                                 self.spec, **RECIPE_ONLY_FIELDS)
        return added if same_otherwise else []

    def _dropped_tasks(self, saved: GridSpec) -> list[str]:
        """The evaluation tasks this spec drops from the saved one, when that is its only
        change (a task whose data is no longer to be had, or too slow to keep): finished
        cells stay valid, they were only evaluated on more. Empty for any other change."""
        if not set(self.spec.tasks) < set(saved.tasks):
            return []
        dropped = [t for t in saved.tasks if t not in self.spec.tasks]

        def kept_limits(spec: GridSpec) -> dict[str, int]:
            # A dropped task's limit may stay or go; every other limit must be as it was.
            return {t: n for t, n in spec.task_limits.items() if t not in dropped}

        narrowed = dataclasses.replace(saved, tasks=self.spec.tasks,
                                       task_limits=kept_limits(saved))
        same_otherwise = narrowed == dataclasses.replace(self.spec,
                                                         task_limits=kept_limits(self.spec))
        return dropped if same_otherwise else []

    def prepare_calibration(self, cell: Cell) -> Any:
        """Build (or reuse from the step cache) the calibration set of a calibrated cell."""
        from qcal.model.loading import load_tokenizer, resolve_model_dir
        from qcal.run import calibrate

        recipe = self.spec.recipe(cell, self.work_root / "unused", self.device)
        return calibrate(recipe, load_tokenizer(resolve_model_dir(recipe.model)), self.cache,
                         resolve_device(self.device))

    def run_cell(self, cell: Cell) -> dict[str, Any]:
        from qcal.eval.job import run_evaluation
        from qcal.model.loading import resolve_model_dir

        record: dict[str, Any] = {"cell": cell.key, "selector": cell.selector,
                                  "method": cell.method, "axes": dict(cell.axes),
                                  "float_cell": self.spec.float_cell(cell).key}
        target = resolve_model_dir(self.spec.setting(cell, "model"))
        if cell.method is not None:
            target = self.work_root / "ckpt" / cell.key
            log = self._quantize(self.spec.recipe(cell, target, self.device))
            record["quantize_seconds"] = log.get("quantize_seconds")
            record["recipe_key"] = log.get("recipe_key")
            record["calibration"] = log.get("calibration")
        text_file = Path(self.spec.eval_text_file) if self.spec.eval_text_file else None
        outcome = run_evaluation(target, self.spec.eval_config(), text_file=text_file,
                                 progress=self.progress, device=self.device,
                                 score_file=self.score_file(cell))
        record["eval"] = outcome.data
        record["items"] = {task: [dataclasses.asdict(it) for it in its]
                           for task, its in outcome.items.get("model", {}).items()}
        return record

    def score_file(self, cell: Cell) -> Path:
        """Where a cell's lm-eval scores are kept: a cell killed during its evaluation
        resumes its scoring from there. Kept after the cell is recorded (a few hundred KB),
        so a cell withdrawn and rerun on an unchanged model (the float cell) reuses its
        scores; a rebuilt checkpoint has a new identity and never does."""
        return self.work_root / "scores" / f"{cell.key}.jsonl"

    def _quantize(self, recipe: Any) -> dict[str, Any]:
        """The cell's checkpoint through `run_recipe`: reused when this exact recipe made it,
        resumed after a kill, restarted when its resume state is damaged."""
        from qcal.model.sequential import ResumeStateError
        from qcal.output import OutputPolicy
        from qcal.run import run_recipe

        try:
            return run_recipe(recipe, cache=self.cache, policy=OutputPolicy(resume=True),
                              reuse=True, progress=self.progress).log
        except ResumeStateError as err:
            # The grid owns this state: a damaged file costs a restart, never a stuck grid.
            print(f"qcal compare: {Path(str(recipe.output)).name}: {err}; starting this cell over",
                  file=sys.stderr)
            return run_recipe(recipe, cache=self.cache, policy=OutputPolicy(overwrite=True),
                              progress=self.progress).log

    def run(self) -> dict[str, Any]:
        """Run every pending cell; returns {cell key: record} for the whole grid.

        The whole grid is validated first, so a rejected grid creates nothing. Its tasks'
        data is checked only when a cell is left to run: a finished grid whose task data
        this machine lacks (a withdrawn source) still re-renders."""
        from qcal.grid.checks import check_grid_tasks, validate_grid

        validate_grid(self.spec, check_tasks=False)
        if any(not self.is_current(cell) for cell in self.mine()):
            check_grid_tasks(self.spec)
        self.results_root.mkdir(parents=True, exist_ok=True)
        with self._exclusive():
            return self._run_locked()

    def _exclusive(self) -> contextlib.AbstractContextManager[None]:
        """One runner per grid (per shard): two would compute the same cells into the same files."""
        suffix = f"-shard{self.shard[0]}of{self.shard[1]}" if self.shard else ""
        return exclusive_lock(
            self.results_root / f".lock{suffix}",
            f"another `qcal compare` is running the grid in {self.results_root}"
            f"{' (this shard)' if self.shard else ''}; wait for it to finish (the lock goes away "
            "with its process), or use another --name")

    def check_leakage(self, todo: list[Cell]) -> None:
        """Refuse a cell whose calibration set holds the data the grid evaluates on (1% of an
        evaluation split's word 13-grams or more; qcal.calib.leakage), unless the grid says
        `allow_leakage: true`. Calibration sets are built (and cached) for this first."""
        calibrated = [c for c in todo if c.selector is not None]
        if self.spec.allow_leakage or not calibrated:
            return
        from qcal.calib.diagnose import evaluation_splits, leakage_report
        from qcal.data.sources import read_user_text
        from qcal.model.loading import load_tokenizer, resolve_model_dir

        if self.spec.eval_text_file:
            splits = {"eval text file": [read_user_text(Path(self.spec.eval_text_file))]}
        else:
            splits = evaluation_splits(self.spec.eval_langs, tasks=self.spec.tasks)
        tokenizers: dict[Any, Any] = {}  # one per model, not per cell
        for cell in calibrated:
            model = self.spec.setting(cell, "model")
            if model not in tokenizers:
                tokenizers[model] = load_tokenizer(resolve_model_dir(model))
            report = leakage_report(self.prepare_calibration(cell), tokenizers[model], splits)
            if report["flagged"]:
                split = report["flagged"][0]
                share = report["splits"][split]["set_share"]
                raise ConfigError(f"cell {cell.key}: its calibration set contains evaluation data "
                                  f"({split} holds {share:.1%} of its word 13-grams); calibrate on "
                                  "other data, or set allow_leakage: true in the grid to "
                                  "measure it anyway")

    def _run_locked(self) -> dict[str, Any]:
        self._clean_stale()
        self._write_spec()
        todo = self.pending()
        self.check_leakage(todo)
        cells = self.mine()
        bar = tqdm(total=len(cells), initial=len(cells) - len(todo), desc="grid",
                   disable=not self.progress)
        work = CellWorker(self.spec, self.results_root, self.work_root, self.device)
        if self.executor == "ray" and todo:
            from qcal.grid.ray_executor import run_on_ray

            self._prepare_calibrations(todo)
            run_on_ray(todo, work, self._record_unless_current, bar, self.address)
        elif self.jobs > 1 and len(todo) > 1:
            self._prepare_calibrations(todo)
            run_in_processes(todo, work, self.record, bar, self.jobs)
        run_here(todo, self.run_cell, self.record, bar, self.is_current)  # what is left
        bar.close()
        return load_cells(self.results_root)

    def _prepare_calibrations(self, todo: list[Cell]) -> None:
        # Workers never race on a cache entry: every calibration set is built once, here.
        for cell in todo:
            if cell.selector is not None:
                self.prepare_calibration(cell)

    def _record_unless_current(self, cell: Cell, record: dict[str, Any]) -> None:
        if not self.is_current(cell):  # another driver may have finished it
            self.record(cell, record)

    def record(self, cell: Cell, record: dict[str, Any]) -> None:
        """Write a finished cell's file (with provenance), the only writer of cell files."""
        record["provenance"] = provenance()
        atomic_write_text(self.cell_path(cell), json.dumps(record, indent=1, default=str))
        if not self.keep_checkpoints and cell.method is not None:
            self.discard_checkpoint(cell)

    def discard_checkpoint(self, cell: Cell) -> None:
        """Delete a recorded cell's checkpoint: a finished cell never reads it again (a
        withdrawn one rebuilds it), and a grid of many cells would otherwise keep a model's
        worth of disk per cell. Only the grid's own folder for that cell is touched."""
        target = self.work_root / "ckpt" / cell.key
        if target.is_dir():
            shutil.rmtree(target)


@dataclasses.dataclass(frozen=True)
class CellWorker:
    """A grid cell's computation for a worker process or a Ray task (see `CellWork`): it
    pickles as plain data and builds its own quiet runner where it runs."""

    spec: GridSpec
    results_root: Path
    work_root: Path
    device: str

    def _runner(self) -> GridRunner:
        return GridRunner(self.spec, Path(self.results_root), Path(self.work_root), progress=False,
                          device=self.device)

    def finished(self, cell: Cell) -> dict[str, Any] | None:
        runner = self._runner()
        return json.loads(runner.cell_path(cell).read_text()) if runner.is_current(cell) else None

    def __call__(self, cell: Cell, threads: int) -> dict[str, Any]:
        import torch

        torch.set_num_threads(threads)
        return self._runner().run_cell(cell)


def load_cells(results_root: Path) -> dict[str, dict[str, Any]]:
    cells_dir = Path(results_root) / "cells"
    if not cells_dir.is_dir():
        raise ConfigError(f"{results_root} has no cells/; run `qcal compare` first")
    return {p.stem: json.loads(p.read_text()) for p in sorted(cells_dir.glob("*.json"))}


def saved_spec(results_root: Path) -> dict[str, Any]:
    """The grid's spec as `qcal compare` saved it in grid.json (cells are not read)."""
    grid_file = Path(results_root) / "grid.json"
    if not grid_file.is_file():
        raise ConfigError(f"{results_root} has no grid.json; run `qcal compare` first")
    return json.loads(grid_file.read_text())["spec"]


def grid_progress(results_root: Path) -> tuple[dict[str, Any], dict[str, dict[str, Any]],
                                                list[str]]:
    """(the grid's spec as saved in grid.json, its finished cells, the planned cell keys not
    finished yet): what a report of a partly run grid needs to say."""
    spec = saved_spec(results_root)
    cells = load_cells(results_root)
    missing = [c.key for c in plan_cells(grid_from_dict(spec)) if c.key not in cells]
    return spec, cells, missing
