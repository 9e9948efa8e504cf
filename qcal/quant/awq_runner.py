"""Moved: qcal.quant.awq_runner is now qcal.methods.awq_runner."""

raise ImportError(
    "qcal.quant.awq_runner moved to qcal.methods.awq_runner in the redesign (issue 18); "
    "import it from there"
)
