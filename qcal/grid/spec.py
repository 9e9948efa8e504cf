"""What a comparison grid is: its spec (the YAML schema of `qcal compare --config`),
its cells, and the cache keys of their inputs. No computation here."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from qcal.config import QuantScheme
from qcal.errors import ConfigError
from qcal.fsio import plain_name
from qcal.run_config import CalibConfig, EvalConfig

if TYPE_CHECKING:
    from qcal.recipe import QuantRecipe

FLOAT_CELL = "float"


@dataclasses.dataclass(frozen=True)
class GridSpec:
    """What to compare; also the schema of `qcal compare --config grid.yaml`.

    Besides selectors x methods, the axes `model`, `seed` (independent calibration draws),
    `nsamples`, `bits`, `group_size`, `sym` and `desc_act` take one value or a list (YAML
    also accepts the plural spellings `models` and `seeds`). Cells are keyed by every
    axis that varies in the grid, so a one-valued axis leaves the keys as they were.
    """

    name: str = "grid"
    model: str | None | tuple[str | None, ...] = None
    selectors: tuple[str, ...] = ("random", "zipf")
    methods: tuple[str, ...] = ("rtn", "gptq")
    bits: int | tuple[int, ...] = 4
    # "auto": per model, the largest of 128/64/32 that divides every quantized in_features.
    group_size: int | str | tuple[int | str, ...] = "auto"
    allow_ragged_groups: bool = False  # a group size that does not divide: smaller last group
    sym: bool | tuple[bool, ...] = False
    desc_act: bool | tuple[bool, ...] = False  # GPTQ act-order; ignored by the other methods
    # --rotate of every quantized cell ("hadamard:0"); None: no rotation. A list is an axis.
    rotate: str | None | tuple[str | None, ...] = None
    # Further config fields per method, e.g. {"gptq": {"damp_percent": 0.02}}: every field
    # of the method's config can be set, and an unknown one is an error.
    method_options: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict, hash=False)
    # Options per selector, e.g. {"perplexity": {"max_candidates": 256}}; they join the
    # calibration recipe (its selector string) but not the cell keys.
    selector_options: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict,
                                                                     hash=False)
    source: str = "debian-handbook"
    nsamples: int | tuple[int, ...] = 128
    seqlen: int = 512
    seed: int | tuple[int, ...] = 0
    eval_langs: tuple[str, ...] = ("en",)
    eval_seqlen: int = 512
    max_windows: int | None = None
    tasks: tuple[str, ...] = ()
    confidence: bool = False  # confidence metrics on the tasks (not the calibration set)
    limit: int | None = None
    task_limits: dict[str, int] = dataclasses.field(default_factory=dict, hash=False)  # {task: n}
    eval_text_file: str | None = None  # evaluate on this file instead of held-out corpora
    # Per-module schemes of every quantized cell, as --scheme-override writes them.
    scheme_overrides: tuple[str, ...] = ()
    # Run cells whose calibration set holds evaluation data (refused by default).
    allow_leakage: bool = False

    def __post_init__(self) -> None:
        from qcal.schema import validate_grid_keys

        # The same schema as a YAML's keys, so a grid built in Python is checked alike.
        validate_grid_keys({f.name: getattr(self, f.name) for f in dataclasses.fields(self)})
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
        for sel in self.selector_options:
            if sel not in self.selectors:
                raise ConfigError(f"selector_options names {sel!r}, which is not in selectors "
                                  f"{list(self.selectors)}")
            self.calib_config(sel)  # unknown option names and bad values fail here
        if self.confidence and not self.tasks:
            raise ConfigError("confidence metrics need multiple-choice --tasks")
        for axis in AXES:
            if not self.values(axis):
                raise ConfigError(f"grid axis {axis} is an empty list; give at least one value")
        for bits in self.values("bits"):
            for group in self.values("group_size"):
                if group != "auto":
                    QuantScheme(bits, group)  # an unusable width or group size fails here
        if any(n < 1 for n in self.values("nsamples")):
            raise ConfigError(f"nsamples {self.values('nsamples')} must all be >= 1")

    def values(self, axis: str) -> tuple[Any, ...]:
        """The values of one axis (a one-valued axis gives a 1-tuple)."""
        value = getattr(self, axis)
        return tuple(value) if isinstance(value, (list, tuple)) else (value,)

    def varying(self) -> tuple[str, ...]:
        return tuple(a for a in AXES if len(self.values(a)) > 1)

    def setting(self, cell: Cell, axis: str) -> Any:
        """`axis`'s value for `cell`: its own where the axis varies, else the one value."""
        return dict(cell.axes).get(axis, self.values(axis)[0])

    def cell_scheme(self, cell: Cell) -> QuantScheme:
        group = self.setting(cell, "group_size")
        if group == "auto":
            from qcal.model.loading import resolve_model_dir
            from qcal.model.shapes import default_group_size

            group = default_group_size(resolve_model_dir(self.setting(cell, "model")))[0]
        return QuantScheme(self.setting(cell, "bits"), group, self.setting(cell, "sym"),
                           allow_ragged=self.allow_ragged_groups)

    @property
    def scheme(self) -> QuantScheme:
        """The scheme of a grid whose scheme axes each have one value."""
        return self.cell_scheme(Cell(None, None))

    def eval_config(self) -> EvalConfig:
        return EvalConfig(seqlen=self.eval_seqlen, max_windows=self.max_windows,
                          langs=self.eval_langs, tasks=self.tasks, confidence=self.confidence,
                          limit=self.limit, task_limits=tuple(sorted(self.task_limits.items())))

    def method_config(self, method: str, cell: Cell | None = None) -> Any:
        """`method`'s config for `cell`: its scheme, the grid's act-order where the method has
        one (GPTQ), method_options."""
        from qcal.methods import METHODS
        from qcal.recipe import method_config

        cell = cell or Cell(None, method)
        METHODS.get(method)  # an unknown name's error lists the known ones
        options = dict(self.method_options.get(method, {}))
        if axis_applies("desc_act", method):
            options.setdefault("desc_act", self.setting(cell, "desc_act"))  # the grid's axis
        return method_config(method, self.cell_scheme(cell), **options)

    def calib_config(self, selector: str, cell: Cell | None = None) -> CalibConfig:
        cell = cell or Cell(selector, None)
        from qcal.calib.build import selector_spec

        return CalibConfig(selector=selector_spec(selector, self.selector_options.get(selector)),
                           source=self.source,
                           nsamples=self.setting(cell, "nsamples"), seqlen=self.seqlen,
                           seed=self.setting(cell, "seed"))

    def recipe(self, cell: Cell, output: Path | str, device: str = "auto") -> QuantRecipe:
        """The recipe that makes `cell`'s checkpoint (the float cell has none)."""
        from qcal.recipe import QuantRecipe

        if cell.method is None:
            raise ConfigError("the float cell quantizes nothing; it has no recipe")
        calib = self.calib_config(cell.selector, cell) if cell.selector is not None else None
        # Grid checkpoints stay in the GPTQ layout: its g_idx act-order is what the committed
        # studies measured, and their cached cells keep their keys (qcal reads any format).
        from qcal.config import ModuleSelection, parse_scheme_override

        modules = ModuleSelection(schemes=tuple(map(parse_scheme_override, self.scheme_overrides)))
        from qcal.run_config import Rotation

        rotate = self.setting(cell, "rotate")
        return QuantRecipe(method=self.method_config(cell.method, cell), calib=calib,
                           model=self.setting(cell, "model"), output=str(output), device=device,
                           format="gptq", modules=modules,
                           rotation=Rotation.parse(rotate) if rotate else None)

    def float_cell(self, cell: Cell) -> Cell:
        """The float reference that `cell` is compared with (same model)."""
        return Cell(None, None, tuple((a, v) for a, v in cell.axes if a == "model"))


class _DuplicateKey(ValueError):
    pass


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key given twice in one mapping is an error (the
    safe loader keeps the last silently: `methods:` twice ran only the second list)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            if isinstance(key, str | int | float | bool) and key in seen:
                raise _DuplicateKey(f"key {str(key)[:60]!r} is given twice (lines {seen[key]} and "
                                    f"{line})")
            if isinstance(key, str | int | float | bool):
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


def load_grid_config(path: Path, overrides: dict[str, Any] | None = None) -> GridSpec:
    """A grid YAML, checked key by key (qcal.schema.grid) before anything runs."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"grid config {path} does not exist; give the path of a grid YAML "
                          "(see configs/ for examples)")
    try:
        raw = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)  # noqa: S506
    except _DuplicateKey as err:
        raise ConfigError(f"grid config {path}: {err}; keep one of them") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(f"grid config {path} is not valid YAML{where}: {problem}; fix the "
                          "syntax (indentation, colons, quotes)") from None
    except UnicodeDecodeError:
        raise ConfigError(f"grid config {path} is not UTF-8 text; save it as UTF-8") from None
    if raw is None or raw == {}:
        raise ConfigError(f"grid config {path} is empty; name at least the methods and "
                          "selectors to compare (see configs/ for examples)")
    if not isinstance(raw, dict):
        raise ConfigError(f"grid config {path} must be a mapping of grid keys (name: ..., "
                          f"methods: [...]), not a {type(raw).__name__}")
    raw.update({k: v for k, v in (overrides or {}).items() if v is not None})
    return grid_from_dict(raw, where=f"grid config {path.name}")


# Fields that change only the cells' recipes (their keys tell stale cells), not the grid.
RECIPE_ONLY_FIELDS = {"method_options": {}, "selector_options": {}, "scheme_overrides": (),
                      "allow_leakage": False}

# Renamed fields: old grid files (and grid.json of finished grids) still load.
RENAMED_FIELDS = {"calibration": "confidence", "models": "model", "seeds": "seed"}


def grid_from_dict(raw: dict[str, Any], where: str = "grid") -> GridSpec:
    from qcal.schema import validate_grid_keys

    raw = {RENAMED_FIELDS.get(str(k), str(k)): v for k, v in raw.items()}
    clean = validate_grid_keys(raw, where)  # types, ranges, unknown keys: one line each
    for key in ("task_limits", "method_options", "selector_options"):
        if key in clean:
            clean[key] = {m: dict(v) if isinstance(v, dict) else v for m, v in clean[key].items()}
    return GridSpec(**clean)


def safe_name(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in text).strip("-")


# Axes beyond selector x method, in key order, and the cells they apply to.
AXES = ("model", "seed", "nsamples", "bits", "group_size", "sym", "desc_act", "rotate")
FLOAT_AXES = ("model",)
NO_CALIB_AXES = ("model", "bits", "group_size", "sym", "rotate")
# Axes that are a method config's own field (act-order): they apply to the methods whose
# config has that field (GPTQ), found in the registry.
METHOD_FIELD_AXES = ("desc_act",)


def axis_applies(axis: str, method: str | None) -> bool:
    if axis not in METHOD_FIELD_AXES:
        return True
    from qcal.methods import METHODS

    return method is not None and axis in {
        f.name for f in dataclasses.fields(METHODS.get(method).config_cls)}


def axis_label(axis: str, value: Any) -> str:
    if axis == "model":
        return "m-" + safe_name(Path(str(value)).name if value else "default")
    if axis == "rotate":
        return "rot-" + safe_name(str(value)) if value else "norot"
    if axis in ("sym", "desc_act"):
        return {"sym": ("asym", "sym"), "desc_act": ("noact", "act")}[axis][bool(value)]
    return {"seed": "s", "nsamples": "n", "bits": "w", "group_size": "g"}[axis] + str(value)


@dataclasses.dataclass(frozen=True)
class Cell:
    selector: str | None  # None: no calibration data (float, RTN)
    method: str | None  # None: the float reference
    axes: tuple[tuple[str, Any], ...] = ()  # values of the grid's varying axes that apply

    @property
    def key(self) -> str:
        base = FLOAT_CELL if self.method is None else f"{safe_name(self.selector or 'none')}__{self.method}"
        return base + "".join(f"__{axis_label(a, v)}" for a, v in self.axes)


def plan_cells(spec: GridSpec) -> list[Cell]:
    """Every cell of the grid: per model a float reference, then each method over the
    axes that apply to it (RTN has no calibration axes; act-order is GPTQ's alone)."""
    import itertools

    from qcal.methods import METHODS

    varying = spec.varying()

    def combos(applicable: tuple[str, ...], method: str | None) -> list[tuple[tuple[str, Any], ...]]:
        axes = [a for a in varying if a in applicable and axis_applies(a, method)]
        return [tuple(zip(axes, vals, strict=True))
                for vals in itertools.product(*(spec.values(a) for a in axes))]

    cells = [Cell(None, None, c) for c in combos(FLOAT_AXES, None)]
    for method in spec.methods:
        if not METHODS.get(method).needs_calibration:
            cells.extend(Cell(None, method, c) for c in combos(NO_CALIB_AXES, method))
            continue
        cells.extend(Cell(sel, method, c) for sel in spec.selectors for c in combos(AXES, method))
    return cells


def count_cells(spec: GridSpec) -> int:
    """How many cells `plan_cells(spec)` lists, by arithmetic (a grid of a million cells is
    counted, not built)."""
    import math

    from qcal.methods import METHODS

    varying = spec.varying()

    def combos(applicable: tuple[str, ...], method: str | None) -> int:
        return math.prod(len(spec.values(a)) for a in varying
                         if a in applicable and axis_applies(a, method))

    total = combos(FLOAT_AXES, None)
    for method in spec.methods:
        if METHODS.get(method).needs_calibration:
            total += len(spec.selectors) * combos(AXES, method)
        else:
            total += combos(NO_CALIB_AXES, method)
    return total
