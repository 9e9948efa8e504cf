"""The comparison grid (`qcal compare`): calibration settings x methods x models, cached
and resumable, with reports. Not to be confused with the integer grid of
`qcal.quant.intgrid` (the quantization levels of one weight group)."""

from qcal.grid.runner import GridRunner, load_cells
from qcal.grid.spec import (
    FLOAT_CELL,
    Cell,
    GridSpec,
    grid_from_dict,
    load_grid_config,
    plan_cells,
)

__all__ = ["FLOAT_CELL", "Cell", "GridRunner", "GridSpec", "grid_from_dict", "load_cells",
           "load_grid_config", "plan_cells"]
