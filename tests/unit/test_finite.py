"""all_finite: exact NaN/Inf detection without an elementwise copy of the tensor (an 8B
down_proj Hessian's torch.isfinite built 0.8 GB of temporaries beside it)."""

from __future__ import annotations

import pytest
import torch

from qcal.errors import NumericalError
from qcal.quant import finite
from qcal.quant.finite import all_finite
from qcal.quant.hessian import check_hessian, inverse_cholesky

pytestmark = pytest.mark.unit


@pytest.fixture
def isfinite_sizes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The element counts torch.isfinite is asked about while the test runs."""
    sizes: list[int] = []
    real = torch.isfinite

    def spy(t: torch.Tensor) -> torch.Tensor:
        sizes.append(t.numel())
        return real(t)

    monkeypatch.setattr(torch, "isfinite", spy)
    return sizes


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("where", [(0, 0), (7, 3), (63, 47)])
def test_a_single_bad_element_is_found(dtype: torch.dtype, bad: float,
                                       where: tuple[int, int]) -> None:
    t = torch.randn(64, 48).to(dtype)
    assert all_finite(t)
    t[where] = bad
    assert not all_finite(t)
    assert not all_finite(t, slice_elements=100)  # the sliced element test finds it too


def test_finite_values_whose_sum_overflows_are_finite(isfinite_sizes: list[int]) -> None:
    big = torch.full((40, 30), torch.finfo(torch.float32).max / 4)
    assert not torch.isfinite(big.sum())  # the one-reduction shortcut cannot decide this
    isfinite_sizes.clear()
    assert all_finite(big, slice_elements=300)
    assert max(isfinite_sizes[1:]) <= 300  # decided slice by slice, never on the whole
    big[39, 29] = float("nan")
    assert not all_finite(big, slice_elements=300)


def test_column_major_and_odd_shapes() -> None:
    t = torch.empty_strided((50, 50), (1, 50))
    t.copy_(torch.randn(50, 50))
    assert all_finite(t)
    t[49, 0] = float("inf")
    assert not all_finite(t, slice_elements=64)
    assert all_finite(torch.tensor(1.5)) and not all_finite(torch.tensor(float("nan")))
    assert all_finite(torch.empty(0, 3)) and all_finite(torch.arange(5))


def test_hessian_checks_never_test_the_whole_matrix_at_once(isfinite_sizes: list[int]) -> None:
    n = 256
    x = torch.randn(4 * n, n)
    h = x.T @ x / x.shape[0]
    check_hessian(h)
    inverse_cholesky(h, 0.01)
    assert isfinite_sizes and max(isfinite_sizes) < n * n
    h[5, 9] = float("nan")
    with pytest.raises(NumericalError, match="NaN or Inf"):
        check_hessian(h, "x")
    assert max(isfinite_sizes) <= finite.SLICE_ELEMENTS
