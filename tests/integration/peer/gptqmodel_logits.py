"""Run by GPTQModel's own venv: load a GPTQ-layout checkpoint with GPTQModel (torch
kernel, bf16 on CPU) and write its logits for the given ids: `python this.py CKPT IDS OUT`."""

import sys

import torch
from gptqmodel import BACKEND, GPTQModel
from safetensors.torch import load_file, save_file

ids = load_file(sys.argv[2])["ids"]
model = GPTQModel.load(sys.argv[1], device="cpu", dtype=torch.bfloat16, backend=BACKEND.TORCH).model
with torch.no_grad():
    logits = model(input_ids=ids).logits.float().contiguous()
save_file({"logits": logits}, sys.argv[3])
