"""A linear's calibration inputs reduced, batch by batch, to what AWQ's search reads.

Keeping every batch of every scaled linear's input (q/k/v, o, gate/up and the wide
down_proj input) while the layer runs cost ~5x the hidden states (~210 MB on SmolLM2
at 32 x 512), on top of the forward's own temporaries. The search needs far less:
the per-channel mean |x|, and for its loss either the Gram matrix (a block that is one
linear), an evenly spread token sample (token-wise blocks such as the MLP), or a few
whole batches (attention, which needs the layer's mask and rotary inputs); the clip
search needs another token sample. Each is built as the batches stream past, with the
same arithmetic in the same order as on the kept batches, so the results are the same.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from qcal.quant import awq
from qcal.quant.awq import TokenSampler


def search_batches(n_batches: int, tokens_per_batch: int, budget: int) -> list[int]:
    """Evenly spread whole calibration batches holding at least `budget` tokens (0: all)."""
    if budget <= 0:
        return list(range(n_batches))
    take = min(n_batches, math.ceil(budget / max(1, tokens_per_batch)))
    return sorted({round(i * (n_batches - 1) / max(take - 1, 1)) for i in range(take)})


@dataclasses.dataclass(frozen=True)
class InputPlan:
    """What to keep of one linear input: a Gram matrix, a search sample of `sample_tokens`
    (0: none), the whole batches `keep` (None: every batch), and a clip sample."""

    total_tokens: int
    clip_tokens: int
    gram: bool = False
    sample_tokens: int = 0
    keep: frozenset[int] | None = frozenset()


class InputDigest:
    """One linear input, reduced as its batches arrive (`add`, in batch order)."""

    def __init__(self, plan: InputPlan) -> None:
        self.plan = plan
        self.abs_sum: torch.Tensor | None = None
        self.count = 0
        self.gram: torch.Tensor | None = None
        self.batches: dict[int, torch.Tensor] = {}
        self.clip = TokenSampler(plan.total_tokens, plan.clip_tokens)
        self.search = (TokenSampler(plan.total_tokens, plan.sample_tokens)
                       if plan.sample_tokens else None)
        self._seen = 0

    @classmethod
    def of(cls, xs: list[torch.Tensor], plan: InputPlan) -> InputDigest:
        digest = cls(plan)
        for x in xs:
            digest.add(x)
        return digest

    def add(self, x: torch.Tensor) -> None:
        # channel_abs_sum / input_gram one batch at a time: the same sums in the same order.
        part, count = awq.channel_abs_sum([x])
        self.abs_sum = part if self.abs_sum is None else self.abs_sum + part.to(self.abs_sum.device)
        self.count += count
        if self.plan.gram:
            g, _ = awq.input_gram([x])
            self.gram = g if self.gram is None else self.gram.add_(g.to(self.gram.device))
        if self.plan.keep is None or self._seen in self.plan.keep:
            self.batches[self._seen] = x
        if self.search is not None:
            self.search.add(x)
        self.clip.add(x)
        self._seen += 1

    def kept(self) -> tuple[list[int], list[torch.Tensor]]:
        order = sorted(self.batches)
        return order, [self.batches[i] for i in order]

    def scale_down(self, s: torch.Tensor, protected: set[int]) -> None:
        """The input after AWQ folds scale `s`: x / s everywhere it is kept (in place, except
        for tensors whose storage is in `protected`: the layer's own hidden states)."""
        for i, x in self.batches.items():
            scale = s.to(device=x.device, dtype=x.dtype)
            self.batches[i] = (x / scale if x.untyped_storage().data_ptr() in protected
                               else x.div_(scale))
        if self.search is not None:
            self.search.scale_down(s)
        self.clip.scale_down(s)
        # Only read again if a later scale group shares this input: same math, reordered.
        if self.abs_sum is not None:
            self.abs_sum = self.abs_sum / s.to(self.abs_sum.device).float()
        if self.gram is not None:
            inv = 1.0 / s.to(self.gram.device).float()
            self.gram = self.gram * inv[:, None] * inv[None, :]
