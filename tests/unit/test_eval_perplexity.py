"""Perplexity windows, a uniform predictor, token-NLL files, and KL/JS divergences."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from qcal.errors import ConfigError
from qcal.eval.divergence import compare_on_ids, token_divergence
from qcal.eval.perplexity import (
    load_token_nll,
    perplexity_of_ids,
    save_token_nll,
    window_spans,
)

pytestmark = pytest.mark.unit
VOCAB = 37


class Uniform(nn.Module):
    """Predicts the uniform distribution over VOCAB tokens whatever the input."""

    def __init__(self) -> None:
        super().__init__()
        self.dummy = nn.Parameter(torch.zeros(1))

    def forward(self, input_ids: torch.Tensor, use_cache: bool = True) -> SimpleNamespace:
        return SimpleNamespace(logits=torch.zeros(*input_ids.shape, VOCAB) + self.dummy)


class Peaked(nn.Module):
    """Puts logit `bias` on token 0: a fixed, known distribution."""

    def __init__(self, bias: float) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.tensor(bias))

    def forward(self, input_ids: torch.Tensor, use_cache: bool = True) -> SimpleNamespace:
        logits = torch.zeros(*input_ids.shape, VOCAB)
        logits[..., 0] = self.bias
        return SimpleNamespace(logits=logits)


def _ids(n: int = 300) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("stride", [None, 16, 64])
def test_uniform_predictor_has_perplexity_equal_to_vocab_size(stride: int | None) -> None:
    res = perplexity_of_ids(Uniform(), _ids(), seqlen=64, stride=stride, batch_size=3,
                            progress=False)
    assert res.ppl == pytest.approx(VOCAB, rel=1e-5)
    assert res.token_nll.numel() == res.tokens
    assert torch.allclose(res.token_nll, torch.full_like(res.token_nll, math.log(VOCAB)))


def test_fixed_windows_drop_the_tail_and_strided_scores_each_token_once() -> None:
    fixed = window_spans(300, 64, None)
    assert [(s, e) for s, e, _ in fixed] == [(0, 64), (64, 128), (128, 192), (192, 256)]
    res = perplexity_of_ids(Uniform(), _ids(), seqlen=64, progress=False)
    assert res.tokens == 4 * 63 and res.windows == 4
    scored = []
    for s, e, first in window_spans(300, 64, 16):
        scored.extend(range(s + first, e))
    assert scored == list(range(1, 300))
    with pytest.raises(ConfigError, match="stride"):
        window_spans(300, 64, 65)
    with pytest.raises(ConfigError, match="fewer than one window"):
        perplexity_of_ids(Uniform(), _ids(10), seqlen=64, progress=False)


def test_token_nll_round_trip(tmp_path: Path) -> None:
    streams = {"model/en": torch.arange(5.0), "base/en": torch.ones(3)}
    path = save_token_nll(tmp_path / "sub" / "nll.safetensors", streams, {"model": "x"})
    back = load_token_nll(path)
    assert set(back) == set(streams)
    assert torch.equal(back["model/en"], streams["model/en"])
    with pytest.raises(ConfigError, match="does not exist"):
        load_token_nll(tmp_path / "missing.safetensors")


def test_kl_js_by_hand() -> None:
    p = torch.tensor([[0.5, 0.5]]).log()
    q = torch.tensor([[0.9, 0.1]]).log()
    kl, js = token_divergence(p, q)
    assert float(kl) == pytest.approx(0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1))
    m = [0.7, 0.3]
    expect_js = 0.5 * sum(a * math.log(a / b) for a, b in zip([0.5, 0.5], m, strict=True)) + \
        0.5 * sum(a * math.log(a / b) for a, b in zip([0.9, 0.1], m, strict=True))
    assert float(js) == pytest.approx(expect_js)
    assert float(token_divergence(q, p)[1]) == pytest.approx(expect_js)  # JS is symmetric
    same_kl, same_js = token_divergence(p, p)
    assert float(same_kl) == 0.0 and float(same_js) == 0.0
    disjoint = torch.tensor([[1.0, 0.0]]).log(), torch.tensor([[0.0, 1.0]]).log()
    assert float(token_divergence(*disjoint)[1]) == pytest.approx(math.log(2))


def test_compare_on_ids_lines_up_with_perplexity() -> None:
    ids = _ids()
    same = compare_on_ids(Uniform(), Uniform(), ids, seqlen=64, progress=False)
    assert float(same.kl.abs().max()) == 0.0
    assert same.base.ppl == pytest.approx(VOCAB, rel=1e-5)
    drift = compare_on_ids(Uniform(), Peaked(2.0), ids, seqlen=64, stride=32, progress=False)
    alone = perplexity_of_ids(Peaked(2.0), ids, seqlen=64, stride=32, progress=False)
    assert torch.allclose(drift.model.token_nll, alone.token_nll)
    q0 = math.exp(2.0) / (math.exp(2.0) + VOCAB - 1)
    q_rest = 1 / (math.exp(2.0) + VOCAB - 1)
    kl = (1 / VOCAB) * (math.log((1 / VOCAB) / q0) + (VOCAB - 1) * math.log((1 / VOCAB) / q_rest))
    assert float(drift.kl.mean()) == pytest.approx(kl, rel=1e-5)
    s = drift.summary()
    assert s["tokens"] == drift.kl.numel() == alone.tokens
