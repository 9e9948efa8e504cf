"""Moved: qcal.compare_report is now qcal.grid.report."""

raise ImportError(
    "qcal.compare_report moved to qcal.grid.report in the redesign (issue 18); "
    "import it from there"
)
