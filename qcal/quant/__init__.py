"""Quantizers: the integer grid, RTN, GPTQ and AWQ as pure tensor functions."""
