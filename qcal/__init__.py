"""qcal: calibration-aware post-training quantization for Hugging Face causal LMs."""

__version__ = "0.1.0"
