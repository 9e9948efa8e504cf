"""Moved: qcal.packing.format is now qcal_kernels.format."""

raise ImportError(
    "qcal.packing.format moved to qcal_kernels.format in the redesign (issue 18); "
    "import it from there"
)
