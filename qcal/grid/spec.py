"""What a comparison grid is: its spec (the YAML schema of `qcal compare --config`),
its cells, and the cache keys of their inputs. No computation here."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

import yaml

from qcal.config import AWQConfig, EvalConfig, GPTQConfig, QuantScheme, RTNConfig
from qcal.errors import ConfigError
from qcal.fsio import plain_name

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
    source: str = "debian-handbook"
    nsamples: int = 128
    seqlen: int = 512
    seed: int = 0
    eval_langs: tuple[str, ...] = ("en",)
    eval_seqlen: int = 512
    max_windows: int | None = None
    tasks: tuple[str, ...] = ()
    calibration: bool = False
    limit: int | None = None
    eval_text_file: str | None = None  # evaluate on this file instead of held-out corpora

    def __post_init__(self) -> None:
        plain_name(self.name, "grid name")
        if not self.selectors or not self.methods:
            raise ConfigError("a grid needs at least one selector and one method")
        from qcal.methods import METHODS

        for m in self.methods:
            METHODS.get(m)  # an unknown method's error lists the known ones
        if self.calibration and not self.tasks:
            raise ConfigError("calibration metrics need multiple-choice --tasks")

    @property
    def scheme(self) -> QuantScheme:
        return QuantScheme(self.bits, self.group_size, self.sym)

    def eval_config(self) -> EvalConfig:
        return EvalConfig(seqlen=self.eval_seqlen, max_windows=self.max_windows,
                          langs=self.eval_langs, tasks=self.tasks, calibration=self.calibration,
                          limit=self.limit)


def load_grid_config(path: Path, overrides: dict[str, Any] | None = None) -> GridSpec:
    if not Path(path).is_file():
        raise ConfigError(f"grid config {path} does not exist")
    raw = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"grid config {path} must be a mapping of GridSpec fields")
    raw.update({k: v for k, v in (overrides or {}).items() if v is not None})
    return grid_from_dict(raw)


def grid_from_dict(raw: dict[str, Any]) -> GridSpec:
    fields = {f.name for f in dataclasses.fields(GridSpec)}
    unknown = set(raw) - fields
    if unknown:
        raise ConfigError(f"unknown grid fields {sorted(unknown)}; known: {sorted(fields)}")
    clean = {}
    for key, value in raw.items():
        if key in {"selectors", "methods", "eval_langs", "tasks"} and isinstance(value, str):
            value = [v for v in value.split(",") if v]
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


def method_config(method: str, spec: GridSpec) -> Any:
    if method == "gptq":
        return GPTQConfig(scheme=spec.scheme, desc_act=spec.desc_act)
    return {"rtn": RTNConfig, "awq": AWQConfig}[method](scheme=spec.scheme)


def calib_recipe_key(spec: GridSpec, selector: str, tokenizer_name: str) -> str:
    recipe = json.dumps([selector, spec.source, spec.nsamples, spec.seqlen, spec.seed,
                         tokenizer_name], sort_keys=True)
    return f"{safe_name(selector)}-{hashlib.sha256(recipe.encode()).hexdigest()[:12]}"


