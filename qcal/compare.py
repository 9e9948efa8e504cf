"""Moved: qcal.compare is now qcal.grid (GridSpec, GridRunner, plan_cells, load_cells)."""

raise ImportError(
    "qcal.compare moved to qcal.grid (GridSpec, GridRunner, plan_cells, load_cells) "
    "in the redesign (issue 18); "
    "import it from there"
)
