"""Moved: qcal.quant.grid is now qcal.quant.intgrid."""

raise ImportError(
    "qcal.quant.grid moved to qcal.quant.intgrid in the redesign (issue 18); "
    "import it from there"
)
