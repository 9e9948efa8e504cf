"""Moved: qcal.study is now qcal.grid.study."""

raise ImportError(
    "qcal.study moved to qcal.grid.study in the redesign (issue 18); "
    "import it from there"
)
