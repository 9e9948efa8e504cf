"""Packed integer formats, the QuantLinear module and GPTQ-layout checkpoints."""
