"""What a comparison grid is: its spec (the YAML schema of `qcal compare --config`),
its cells, and the cache keys of their inputs. No computation here."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from qcal.config import CalibConfig, EvalConfig, QuantScheme
from qcal.errors import ConfigError
from qcal.fsio import plain_name

if TYPE_CHECKING:
    from qcal.recipe import QuantRecipe

FLOAT_CELL = "float"


@dataclasses.dataclass(frozen=True)
class GridSpec:
    """What to compare; also the schema of `qcal compare --config grid.yaml`."""

    name: str = "grid"
    model: str | None = None
    selectors: tuple[str, ...] = ("random", "zipf")
    methods: tuple[str, ...] = ("rtn", "gptq")
    bits: int = 4
    group_size: int = 128
    sym: bool = False
    desc_act: bool = False  # GPTQ act-order; ignored by the other methods
    # Further config fields per method, e.g. {"gptq": {"damp_percent": 0.02}}: every field
    # of the method's config can be set, and an unknown one is an error.
    method_options: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict, hash=False)
    source: str = "debian-handbook"
    nsamples: int = 128
    seqlen: int = 512
    seed: int = 0
    eval_langs: tuple[str, ...] = ("en",)
    eval_seqlen: int = 512
    max_windows: int | None = None
    tasks: tuple[str, ...] = ()
    confidence: bool = False  # confidence metrics on the tasks (not the calibration set)
    limit: int | None = None
    eval_text_file: str | None = None  # evaluate on this file instead of held-out corpora

    def __post_init__(self) -> None:
        plain_name(self.name, "grid name")
        if not self.selectors or not self.methods:
            raise ConfigError("a grid needs at least one selector and one method")
        from qcal.methods import METHODS

        for m in self.methods:
            METHODS.get(m)  # an unknown method's error lists the known ones
        for m in self.method_options:
            if m not in self.methods:
                raise ConfigError(f"method_options names {m!r}, which is not in methods "
                                  f"{list(self.methods)}")
        for m in self.methods:
            self.method_config(m)  # unknown option names fail here, before any cell runs
        if self.confidence and not self.tasks:
            raise ConfigError("confidence metrics need multiple-choice --tasks")

    @property
    def scheme(self) -> QuantScheme:
        return QuantScheme(self.bits, self.group_size, self.sym)

    def eval_config(self) -> EvalConfig:
        return EvalConfig(seqlen=self.eval_seqlen, max_windows=self.max_windows,
                          langs=self.eval_langs, tasks=self.tasks, confidence=self.confidence,
                          limit=self.limit)

    def method_config(self, method: str) -> Any:
        """`method`'s config for this grid: the scheme, act-order for GPTQ, method_options."""
        from qcal.recipe import method_config

        options = dict(self.method_options.get(method, {}))
        if method == "gptq":
            options.setdefault("desc_act", self.desc_act)
        return method_config(method, self.scheme, **options)

    def calib_config(self, selector: str) -> CalibConfig:
        return CalibConfig(selector=selector, source=self.source, nsamples=self.nsamples,
                           seqlen=self.seqlen, seed=self.seed)

    def recipe(self, cell: Cell, output: Path | str, device: str = "auto") -> QuantRecipe:
        """The recipe that makes `cell`'s checkpoint (the float cell has none)."""
        from qcal.recipe import QuantRecipe

        if cell.method is None:
            raise ConfigError("the float cell quantizes nothing; it has no recipe")
        calib = self.calib_config(cell.selector) if cell.selector is not None else None
        return QuantRecipe(method=self.method_config(cell.method), calib=calib, model=self.model,
                           output=str(output), device=device)


def load_grid_config(path: Path, overrides: dict[str, Any] | None = None) -> GridSpec:
    if not Path(path).is_file():
        raise ConfigError(f"grid config {path} does not exist")
    raw = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"grid config {path} must be a mapping of GridSpec fields")
    raw.update({k: v for k, v in (overrides or {}).items() if v is not None})
    return grid_from_dict(raw)


# Renamed fields: old grid files (and grid.json of finished grids) still load.
RENAMED_FIELDS = {"calibration": "confidence"}


def grid_from_dict(raw: dict[str, Any]) -> GridSpec:
    raw = {RENAMED_FIELDS.get(k, k): v for k, v in raw.items()}
    fields = {f.name for f in dataclasses.fields(GridSpec)}
    unknown = set(raw) - fields
    if unknown:
        raise ConfigError(f"unknown grid fields {sorted(unknown)}; known: {sorted(fields)}")
    clean = {}
    for key, value in raw.items():
        if key in {"selectors", "methods", "eval_langs", "tasks"} and isinstance(value, str):
            value = [v for v in value.split(",") if v]
        if key == "method_options":
            if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
                raise ConfigError("method_options must map a method to its fields, e.g. "
                                  "{gptq: {damp_percent: 0.02}}")
            clean[key] = {m: dict(v) for m, v in value.items()}
            continue
        clean[key] = tuple(value) if isinstance(value, list) else value
    return GridSpec(**clean)


def safe_name(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in text).strip("-")


@dataclasses.dataclass(frozen=True)
class Cell:
    selector: str | None  # None: no calibration data (float, RTN)
    method: str | None  # None: the float reference

    @property
    def key(self) -> str:
        if self.method is None:
            return FLOAT_CELL
        return f"{safe_name(self.selector or 'none')}__{self.method}"


def plan_cells(spec: GridSpec) -> list[Cell]:
    from qcal.methods import METHODS

    cells = [Cell(None, None)]
    for method in spec.methods:
        if not METHODS.get(method).needs_calibration:
            cells.append(Cell(None, method))
            continue
        cells.extend(Cell(sel, method) for sel in spec.selectors)
    return cells
