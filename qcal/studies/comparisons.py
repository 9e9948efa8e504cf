"""What the benchmarks compare against: the scorings qcal used before
`qcal.scoring.next_token_nll` (scripts/bench_selection_cost.py and bench_window_nll.py run
the old way beside the new one), lm-eval's and the shared-context scorer's answers item by
item (bench_shared_context.py), and two checkpoints code by code (bench_scaling.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch.nn.functional as F

from qcal.packing.checkpoint import quant_modules
from qcal.packing.checkpoint_load import load_checkpoint
from qcal.packing.formats import codes_of


def transposed_nll(logits: Any, ids: Any) -> Any:
    """The perplexity selector's scoring before qcal.scoring: CE over a transposed view."""
    return F.cross_entropy(logits.float()[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")


def flattened_nll(logits: Any, ids: Any) -> Any:
    """The evaluation's scoring before qcal.scoring (a copy of the logits, then CE)."""
    logits = logits.float()
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1),
                           reduction="none").view(ids.shape[0], -1)


def identical_codes(a: Path, b: Path) -> float:
    """Share of integer codes that two checkpoints of one model hold alike."""
    qa, qb = quant_modules(load_checkpoint(a)), quant_modules(load_checkpoint(b))
    same = total = 0
    for name, layer in qa.items():
        ca, cb = codes_of(layer).codes, codes_of(qb[name]).codes
        same += int((ca == cb).sum())
        total += ca.numel()
    return same / total


def agreement_of_runs(plain: Any, shared: Any, task: str) -> dict[str, Any]:
    """How lm-eval's own run and the shared-context run of `task` agree: items, the largest
    per-choice log-likelihood difference, items whose argmax differs, both accuracies."""
    a, b = plain.items[task], shared.items[task]
    diff = max(abs(x - y) for ra, rb in zip(a, b, strict=True)
               for x, y in zip(ra.lls, rb.lls, strict=True))
    flips = sum(max(range(len(ra.lls)), key=ra.lls.__getitem__)
                != max(range(len(rb.lls)), key=rb.lls.__getitem__)
                for ra, rb in zip(a, b, strict=True))
    return {"items": len(a), "max_abs_ll_diff": diff, "argmax_flips": flips,
            "acc_lm_eval": plain.metrics[task].get("acc,none"),
            "acc_shared": shared.metrics[task].get("acc,none")}
