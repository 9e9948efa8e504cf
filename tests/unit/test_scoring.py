"""Next-token NLL: the flattened cross-entropy's exact numbers, without its copy."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from qcal.scoring import next_token_nll

pytestmark = pytest.mark.unit


def test_next_token_nll_equals_the_flattened_cross_entropy_exactly() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 17, 5000, generator=gen) * 4
    ids = torch.randint(0, 5000, (3, 17), generator=gen)
    flat = F.cross_entropy(logits[:, :-1].reshape(-1, 5000), ids[:, 1:].reshape(-1),
                           reduction="none").view(3, -1)
    got = next_token_nll(logits, ids)
    # Bitwise: evaluation results computed before this function existed stay comparable.
    assert got.shape == (3, 16) and got.dtype == torch.float32 and torch.equal(got, flat)
    exact = -torch.log_softmax(logits.double(), -1)[:, :-1].gather(-1, ids[:, 1:, None])[..., 0]
    assert torch.allclose(got.double(), exact, atol=1e-4)


def test_next_token_nll_scores_half_precision_logits_in_float32() -> None:
    logits = torch.randn(2, 5, 50).to(torch.bfloat16)
    ids = torch.randint(0, 50, (2, 5))
    assert torch.equal(next_token_nll(logits, ids), next_token_nll(logits.float(), ids))


@pytest.mark.parametrize(("logits", "ids"), [
    (torch.zeros(2, 5), torch.zeros(2, 5, dtype=torch.long)),          # no vocab axis
    (torch.zeros(2, 5, 7), torch.zeros(2, 4, dtype=torch.long)),       # lengths differ
    (torch.zeros(2, 1, 7), torch.zeros(2, 1, dtype=torch.long)),       # nothing to predict
])
def test_next_token_nll_refuses_mismatched_shapes(logits, ids) -> None:
    with pytest.raises(ValueError, match="need logits"):
        next_token_nll(logits, ids)
