"""Moved: qcal.quant.gptq_runner is now qcal.methods.gptq_runner."""

raise ImportError(
    "qcal.quant.gptq_runner moved to qcal.methods.gptq_runner in the redesign (issue 18); "
    "import it from there"
)
