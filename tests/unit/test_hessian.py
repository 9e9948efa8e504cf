"""The Hessian's memory- and time-saving paths equal the plain ones: the upper-triangle
accumulation of wide inputs, and the inverse Cholesky that builds H's permuted form in its
own working matrix instead of a copy beside it."""

from __future__ import annotations

import pytest
import torch

from qcal.methods.gptq_runner import HessianSink
from qcal.quant.hessian import (
    SYMMETRIC_FROM,
    accumulate_hessian,
    inverse_cholesky,
    mirror_upper_,
)

pytestmark = pytest.mark.unit


def _batches(width: int, sizes: tuple[int, ...], seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    scales = 0.2 + 4 * torch.rand(width, generator=gen)  # outlier channels, as real inputs
    return [torch.randn(n, width, generator=gen) * scales for n in sizes]


@pytest.mark.parametrize("width", [1100, 512, 37])
def test_upper_triangle_accumulation_mirrors_to_the_full_hessian(width: int) -> None:
    """Widths that are and are not a multiple of the 512-column block; batches of unequal
    size so the running-mean rescaling is exercised."""
    full, upper, n_full, n_upper = None, None, 0, 0
    for x in _batches(width, (300, 41, 129), seed=1):
        full, n_full = accumulate_hessian(x, full, n_full)
        upper, n_upper = accumulate_hessian(x, upper, n_upper, upper_only=True)
    assert n_full == n_upper == 470
    # Below the 512-wide diagonal blocks nothing was computed: half the work.
    assert not upper[512:, :512].any()
    mirror_upper_(upper)
    assert torch.equal(upper, upper.T)
    torch.testing.assert_close(upper, full, rtol=1e-5, atol=1e-4)


def test_a_wide_input_sink_hands_out_a_complete_hessian() -> None:
    """HessianSink accumulates a down_proj-wide input as a triangle and completes it once,
    when the Hessian is first read; inputs arriving after that are added whole."""
    x1, x2, x3 = _batches(SYMMETRIC_FROM, (24, 40, 16), seed=2)
    sink = HessianSink(["down"])
    sink("down", x1)
    sink("down", x2)
    want, n = accumulate_hessian(x2, accumulate_hessian(x1, None, 0)[0], 24)
    got = sink.hessian("down")
    assert torch.equal(got, got.T)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
    sink("down", x3)
    want, _ = accumulate_hessian(x3, want, n)
    torch.testing.assert_close(sink.hessian("down"), want, rtol=1e-5, atol=1e-4)


def _explicit(h: torch.Tensor, perm: torch.Tensor, dead: torch.Tensor) -> torch.Tensor:
    """The copy GPTQ used to make: H permuted, dead diagonal set to 1."""
    copy = h[perm][:, perm]
    copy[dead, dead] = 1.0
    return copy


@pytest.mark.parametrize("indefinite", [False, True])
def test_permuted_inverse_cholesky_equals_factoring_a_permuted_copy(indefinite: bool) -> None:
    """Bit for bit the factor of the explicit permuted, dead-fixed copy, also when the first
    damping fails and the working matrix is filled again; the caller's H is not written."""
    width = 700  # two column blocks, the second one partial
    gen = torch.Generator().manual_seed(3)
    if indefinite:
        q, _ = torch.linalg.qr(torch.randn(width, width, generator=gen))
        eig = torch.ones(width)
        eig[0] = -0.05  # 1% damping fails, 10% succeeds
        h = q @ torch.diag(eig) @ q.T
    else:
        x = _batches(width, (900,), seed=4)[0]
        x[:, ::50] = 0.0
        h = accumulate_hessian(x, None, 0)[0]
    perm = torch.randperm(width, generator=gen)
    dead = (h.diagonal() == 0)[perm]
    before = h.clone()
    got, damp = inverse_cholesky(h, 0.01, perm=perm, dead=dead)
    want, want_damp = inverse_cholesky(_explicit(before, perm, dead), 0.01)
    assert damp == want_damp == pytest.approx(0.1 if indefinite else 0.01)
    assert torch.equal(got, want)
    assert torch.equal(h, before)
