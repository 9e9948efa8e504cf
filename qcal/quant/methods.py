"""Moved: qcal.quant.methods is now qcal.methods (METHODS, RunOptions, apply_result)."""

raise ImportError(
    "qcal.quant.methods moved to qcal.methods (METHODS, RunOptions, apply_result) "
    "in the redesign (issue 18); "
    "import it from there"
)
