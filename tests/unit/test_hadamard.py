"""Hadamard matrices for the hidden sizes models have: +-1 entries and H H^T = n I at every
order the constructions reach (Sylvester, Paley I and II, doubled), a refusal at the
orders they do not, and an orthogonal randomized rotation that differs per seed."""

from __future__ import annotations

import pytest
import torch

from qcal.errors import ConfigError
from qcal.quant.hadamard import hadamard, random_hadamard
from qcal.run_config import Rotation

pytestmark = pytest.mark.unit

# 2^k, Paley I (12, 20, 44), Paley II (28, 36), and the hidden sizes of the models qcal
# runs: SmolLM2-135M 576, Gemma-3-270M 640, Qwen2.5-0.5B 896, Qwen2.5-1.5B 1536, 7B 3584.
ORDERS = [1, 2, 8, 12, 20, 28, 36, 44, 64, 576, 640, 896, 1536, 3584]


@pytest.mark.parametrize("n", ORDERS)
def test_hadamard_orders(n: int) -> None:
    h = hadamard(n)
    assert h.shape == (n, n) and bool((h.abs() == 1).all())
    assert torch.equal(h @ h.T, n * torch.eye(n, dtype=torch.float64))


@pytest.mark.parametrize("n", [7, 15, 30])
def test_unreachable_orders_are_refused(n: int) -> None:
    with pytest.raises(ConfigError, match=f"order {n}"):
        hadamard(n)


def test_random_rotation_is_orthogonal_and_seeded() -> None:
    a, b, c = random_hadamard(576, 0), random_hadamard(576, 0), random_hadamard(576, 1)
    torch.testing.assert_close(a @ a.T, torch.eye(576, dtype=torch.float64), atol=1e-12, rtol=0)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_rotation_option_parses() -> None:
    assert Rotation.parse("hadamard") == Rotation("hadamard", 0)
    assert Rotation.parse("hadamard:7").spec() == "hadamard:7"
    for bad in ("givens", "hadamard:x", "hadamard:-1"):
        with pytest.raises(ConfigError, match="--rotate"):
            Rotation.parse(bad)
