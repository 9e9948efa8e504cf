"""What the method tests (GPTAQ, AutoRound) share: calibration ids from the tiny models'
text, state snapshots and their comparison, and the codes of two quantized models."""

from __future__ import annotations

from pathlib import Path

import torch

from qcal.model.loading import load_tokenizer
from qcal.model.tiny import stdlib_text
from qcal.packing.checkpoint import quant_modules
from qcal.packing.formats import codes_of

PROMPTS = torch.tensor([[5, 17, 99, 240, 3, 77, 12, 8, 150, 42, 9, 300]])


def token_ids(model_dir: Path, rows: int, seqlen: int) -> torch.Tensor:
    """`rows` windows of `seqlen` tokens of the stdlib text, in the model's tokenizer."""
    ids = load_tokenizer(model_dir)("\n\n".join(stdlib_text()), return_tensors="pt")["input_ids"][0]
    return ids[: rows * seqlen].view(rows, seqlen)


def state(net: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in net.state_dict().items()}


def equal_states(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def assert_same_codes(a: torch.nn.Module, b: torch.nn.Module) -> None:
    qa, qb = quant_modules(a), quant_modules(b)
    assert qa.keys() == qb.keys() and len(qa) > 0
    for name in qa:
        assert torch.equal(codes_of(qa[name]).codes, codes_of(qb[name]).codes), name
