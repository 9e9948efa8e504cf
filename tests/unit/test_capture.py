"""feed_linear_inputs: linears that share their input skip computing unused outputs,
and any sign that a skipped output was read makes the batch run again for real."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from qcal.model.capture import LayerInputs, feed_linear_inputs

pytestmark = pytest.mark.unit


class CountingLinear(nn.Linear):
    """Counts real computations (a skipped linear's class forward never runs)."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__(n_in, n_out)
        self.computed = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.computed += 1
        return super().forward(x)


class SharedInput(nn.Module):
    """q/k/v-like: three linears read one normed tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.q, self.k, self.v = CountingLinear(8, 4), CountingLinear(8, 6), CountingLinear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        return self.q(h).sum(-1) + self.k(h).sum(-1) + self.v(h).sum(-1)


class DataDependent(nn.Module):
    """b reads the shared input on small batches and a's output on large ones."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = CountingLinear(8, 8), CountingLinear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.a(x)
        return self.b(y if x.abs().max() > 10 else x)


def _inputs(*scales: float) -> LayerInputs:
    g = torch.Generator().manual_seed(0)
    hidden = [torch.randn(2, 5, 8, generator=g) * s for s in scales]
    return LayerInputs(hidden=hidden, kwargs=[{} for _ in hidden])


def _feed(layer: nn.Module, inputs: LayerInputs, names: tuple[str, ...]
          ) -> dict[str, list[torch.Tensor]]:
    got: dict[str, list[torch.Tensor]] = {n: [] for n in names}
    feed_linear_inputs(layer, inputs, names, lambda n, x: got[n].append(x.clone()))
    return got


def test_shared_input_is_fed_exactly_and_unused_outputs_are_not_computed() -> None:
    layer, inputs = SharedInput(), _inputs(1, 1, 1, 1)
    got = _feed(layer, inputs, ("q", "k", "v"))
    for name in ("q", "k", "v"):
        assert len(got[name]) == 4
        for x, hidden in zip(got[name], inputs.hidden, strict=True):
            torch.testing.assert_close(x, layer.norm(hidden), rtol=0, atol=0)
    # The first batch proves the input is shared; later ones skip q and k; v's forward
    # never runs because the pass stops once it was fed.
    assert (layer.q.computed, layer.k.computed, layer.v.computed) == (1, 1, 0)
    assert "forward" not in layer.q.__dict__  # the real forward is back
    out = layer(inputs.hidden[0])
    assert out.shape == (2, 5) and layer.q.computed == 2


def test_a_linear_reading_another_ones_output_gets_the_real_output() -> None:
    # Batch 0 shares its input, so batch 1 starts skipping a; b then reads a's (zeros)
    # output instead of the shared tensor, which sends the batch round again for real.
    layer, inputs = DataDependent(), _inputs(1, 100, 1)
    got = _feed(layer, inputs, ("a", "b"))
    assert [len(got["a"]), len(got["b"])] == [3, 3]  # each input fed once per batch
    torch.testing.assert_close(got["a"][1], inputs.hidden[1], rtol=0, atol=0)
    torch.testing.assert_close(got["b"][1], layer.a(inputs.hidden[1]), rtol=0, atol=0)
    torch.testing.assert_close(got["b"][2], inputs.hidden[2], rtol=0, atol=0)
    assert "forward" not in layer.a.__dict__


def test_no_skipping_when_the_first_batch_shows_a_chain() -> None:
    layer, inputs = DataDependent(), _inputs(100, 1)
    got = _feed(layer, inputs, ("a", "b"))
    torch.testing.assert_close(got["b"][0], layer.a(inputs.hidden[0]), rtol=0, atol=0)
    assert layer.a.computed == 3  # both batches computed a for real (+1 for the check)
