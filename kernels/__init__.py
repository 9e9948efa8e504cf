"""int4 matmul kernels for the GPTQ packed layout: torch reference, CPU path, Triton."""
