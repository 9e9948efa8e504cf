"""AWQ's pure functions: scales, folding (float function unchanged), scale and clip search."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from qcal.config import AWQConfig, QuantScheme, from_json, to_json
from qcal.errors import CheckpointError, ConfigError
from qcal.methods.awq_search import call_block, fold_scale, group_applies
from qcal.model.arch import LLAMA_LIKE, ScaleGroup
from qcal.quant import awq
from qcal.quant.base import rtn_quantize

pytestmark = pytest.mark.unit


class RMSNorm(nn.Module):
    """Llama's RMSNorm (offset 0) or Gemma's (offset 1: weight acts as 1 + w)."""

    def __init__(self, dim: int, offset: float = 0.0) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(dim) * 0.3 + (0.0 if offset else 1.0))
        self.offset = offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return x * (self.offset + self.weight)


class Pair(nn.Module):
    """prev -> (a, b) and up -> down, named like a decoder layer's scale groups."""

    def __init__(self, norm: nn.Module, dim: int = 64, hidden: int = 96) -> None:
        super().__init__()
        self.norm = norm
        self.a = nn.Linear(dim, 32, bias=True)
        self.b = nn.Linear(dim, 48, bias=False)
        self.up = nn.Linear(dim, hidden, bias=True)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        return torch.cat([self.a(h), self.b(h), self.down(torch.relu(self.up(h)))], dim=-1)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).detach().norm() / b.detach().norm())


@pytest.mark.parametrize("norm_kind", ["rms", "gemma", "layernorm"])
def test_folding_into_norm_and_linear_leaves_float_output_unchanged(norm_kind: str) -> None:
    torch.manual_seed(0)
    dim = 64
    offset = 1.0 if norm_kind == "gemma" else 0.0
    norm = nn.LayerNorm(dim) if norm_kind == "layernorm" else RMSNorm(dim, offset)
    if norm_kind == "layernorm":
        with torch.no_grad():
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.normal_()
    model = Pair(norm, dim).double()
    x = torch.randn(4, 10, dim, dtype=torch.float64) * 3
    before = model(x).detach()
    a_before = model.a.weight.detach().clone()
    s1 = torch.rand(dim, dtype=torch.float64) * 4 + 0.05
    s2 = torch.rand(96, dtype=torch.float64) * 4 + 0.05
    fold_scale(model, ScaleGroup("norm", ("a", "b", "up"), ""), s1, offset)
    fold_scale(model, ScaleGroup("up", ("down",), ""), s2)
    after = model(x).detach()
    assert _rel(after, before) < 1e-5
    # The fold really moved the weights (a no-op fold would also pass the check above).
    assert torch.allclose(model.a.weight, a_before * s1)


def test_folding_in_float32_stays_within_1e5_relative() -> None:
    torch.manual_seed(1)
    model = Pair(RMSNorm(64))
    x = torch.randn(2, 16, 64)
    before = model(x)
    s = awq.candidate_scale(torch.rand(64) * 10 + 0.01, 0.5)
    fold_scale(model, ScaleGroup("norm", ("a", "b", "up"), ""), s)
    assert _rel(model(x), before) < 1e-5


def test_fold_rejects_a_scale_of_the_wrong_width() -> None:
    model = Pair(RMSNorm(64))
    with pytest.raises(CheckpointError, match="different model"):
        fold_scale(model, ScaleGroup("norm", ("a",), ""), torch.ones(10))


def test_group_applies_only_when_widths_match() -> None:
    class Attn(nn.Module):
        def __init__(self, kv: int) -> None:
            super().__init__()
            self.v_proj = nn.Linear(64, kv)
            self.o_proj = nn.Linear(64, 64)

    grouped = ScaleGroup("v_proj", ("o_proj",), "o_proj")
    assert not group_applies(Attn(kv=16), grouped)  # GQA: v out 16 != o in 64
    assert group_applies(Attn(kv=64), grouped)
    with pytest.raises(ConfigError, match="ArchSpec"):
        group_applies(Attn(64), ScaleGroup("missing_norm", ("o_proj",), "o_proj"))


def test_candidate_scale_is_normalised_and_ratio_zero_is_identity() -> None:
    x_mean = torch.rand(32) * 10 + 1e-3
    assert torch.equal(awq.candidate_scale(x_mean, 0.0), torch.ones(32))
    s = awq.candidate_scale(x_mean, 0.7)
    assert math.isclose(float(s.max() * s.min()), 1.0, rel_tol=1e-5)
    assert torch.all(torch.argsort(s) == torch.argsort(x_mean))  # monotone in s_x
    assert awq.ratio_grid(20)[:3] == [0.0, 0.05, 0.1] and len(awq.ratio_grid(20)) == 20


def test_channel_and_weight_statistics() -> None:
    xs = [torch.randn(2, 5, 8), torch.randn(3, 5, 8)]
    expected = torch.cat([x.reshape(-1, 8) for x in xs]).abs().mean(0)
    assert torch.allclose(awq.channel_abs_mean(xs), expected)
    w = torch.randn(6, 20)
    sw = awq.weight_channel_mean([w, w], QuantScheme(4, 8))  # ragged: 8 + 8 + 4
    assert sw.shape == (20,) and float(sw.max()) <= 1.0
    # Each group's largest |w| is 1 after normalisation.
    assert torch.allclose(awq.weight_channel_mean([torch.ones(1, 4)], QuantScheme(4, 2)), torch.ones(4))


@pytest.mark.parametrize("group", [32, 48, -1])
def test_fake_quant_matches_rtn(group: int) -> None:
    w = torch.randn(16, 96) * 2
    scheme = QuantScheme(4, group)
    assert torch.equal(awq.fake_quant(w, scheme), rtn_quantize(w, scheme).dequantize())


def _outlier_problem(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    x = torch.randn(512, 256)
    x[:, :4] *= 40.0  # a few salient channels, as LLM activations have
    w = torch.randn(128, 256) * 0.05
    return x, w


def test_awq_scale_beats_rtn_on_activations_with_outlier_channels() -> None:
    x, w = _outlier_problem()
    scheme = QuantScheme(4, 64)
    ref = x @ w.T

    def block_loss(fake: dict[str, torch.Tensor]) -> float:
        return float((x @ fake["w"].T - ref).pow(2).mean())

    found = awq.search_scale(awq.channel_abs_mean([x]), {"w": w}, block_loss, scheme)
    rtn_loss = float((x @ rtn_quantize(w, scheme).dequantize().T - ref).pow(2).mean())
    assert math.isclose(found.rtn_loss, rtn_loss, rel_tol=1e-6)
    assert found.ratio > 0 and found.loss < 0.8 * rtn_loss
    assert len(found.losses) == 20 and found.loss == min(found.losses)
    calls: list[float] = []

    def counted(fake: dict[str, torch.Tensor]) -> float:
        calls.append(0.0)
        return block_loss(fake)

    quick = awq.search_scale(awq.channel_abs_mean([x]), {"w": w}, counted, scheme,
                             coarse_to_fine=True)
    assert len(calls) == 12 and quick.losses.count(None) == 8  # 10 coarse + 2 neighbours
    assert quick.ratio == found.ratio and quick.loss == found.loss  # the same choice here
    assert quick.rtn_loss == found.rtn_loss
    # Folded form: quantized (W * s) applied to x / s reproduces the searched loss.
    q = rtn_quantize(w * found.scale, scheme).dequantize()
    assert math.isclose(float(((x / found.scale) @ q.T - ref).pow(2).mean()), found.loss, rel_tol=1e-3)


def test_duo_scaling_also_beats_rtn() -> None:
    x, w = _outlier_problem(1)
    scheme = QuantScheme(4, 64)
    ref = x @ w.T
    found = awq.search_scale(
        awq.channel_abs_mean([x]), {"w": w},
        lambda f: float((x @ f["w"].T - ref).pow(2).mean()), scheme,
        w_mean=awq.weight_channel_mean([w], scheme),
    )
    assert found.loss <= found.rtn_loss


def test_search_scale_rejects_nan_loss() -> None:
    with pytest.raises(Exception, match="block loss"):
        awq.search_scale(torch.ones(8), {"w": torch.randn(4, 8)}, lambda f: float("nan"),
                         QuantScheme(4, 8))


@pytest.mark.parametrize("group", [32, 40])  # 40: ragged last group of 96 inputs
def test_clip_search_never_worse_than_no_clip(group: int) -> None:
    torch.manual_seed(2)
    w = torch.randn(24, 96)
    w[:, 5] *= 8  # an outlier weight per row: worth clipping
    x = torch.randn(256, 96)
    scheme = QuantScheme(3, group, allow_ragged=True)
    max_val = awq.search_clip(w, x, scheme, out_batch=10)
    groups = scheme.groups_for(96)
    assert max_val.shape == (24, groups)
    wg = awq._grouped(w, group).abs().amax(-1)
    assert torch.all(max_val <= wg + 1e-6) and torch.all(max_val >= 0.5 * wg - 1e-6)
    assert bool((max_val < wg - 1e-6).any())  # something was clipped

    def err(weight: torch.Tensor) -> float:
        return float((x @ (awq.fake_quant(weight, scheme) - w).T).pow(2).mean())

    assert err(awq.apply_clip(w, max_val, group)) < err(w)


def test_clip_with_zero_shrink_keeps_the_range() -> None:
    w, x = torch.randn(8, 64), torch.randn(32, 64)
    scheme = QuantScheme(4, 32)
    max_val = awq.search_clip(w, x, scheme, max_shrink=0.0)
    assert torch.allclose(max_val, awq._grouped(w, 32).abs().amax(-1))
    assert torch.equal(awq.apply_clip(w, max_val, 32), w)


def test_subsample_tokens_takes_an_even_stride() -> None:
    xs = [torch.arange(40.0).reshape(2, 10, 2), torch.arange(40.0, 80.0).reshape(2, 10, 2)]
    sub = awq.subsample_tokens(xs, 10)
    assert sub.shape == (10, 2) and torch.equal(sub[:, 0], torch.arange(0.0, 80.0, 8.0))


def test_call_block_passes_only_what_the_block_accepts() -> None:
    class Attn(nn.Module):
        def forward(self, hidden_states, position_embeddings=None, **kwargs):  # noqa: ANN001
            return hidden_states + position_embeddings, None

    class Mlp(nn.Module):
        def forward(self, x):  # noqa: ANN001
            return x * 2

    x = torch.ones(2)
    kw = {"position_embeddings": torch.full((2,), 3.0), "attention_mask": None}
    assert torch.equal(call_block(Attn(), x, kw), torch.full((2,), 4.0))
    assert torch.equal(call_block(Mlp(), x, kw), torch.full((2,), 2.0))
    assert torch.equal(call_block(nn.Identity(), x, kw), x)


def test_awq_config_validates_and_round_trips() -> None:
    cfg = AWQConfig(scheme=QuantScheme(4, 128), duo_scaling=True, clip_search=False)
    assert from_json(AWQConfig, to_json(cfg)) == cfg
    for bad in ({"grid_points": 0}, {"max_shrink": 1.0}, {"clip_grid": 0}, {"clip_tokens": 0}):
        with pytest.raises(ConfigError):
            AWQConfig(**bad)


def test_arch_specs_name_awq_groups() -> None:
    assert LLAMA_LIKE.scale_groups[0].prev_op == "input_layernorm"
    assert "self_attn.q_proj" in LLAMA_LIKE.awq_clip_skip
    # Resolved specs of Gemma and the other families: tests/integration/test_architectures.py


def test_gram_loss_equals_the_direct_output_error() -> None:
    torch.manual_seed(3)
    xs = [torch.randn(2, 7, 24), torch.randn(3, 7, 24)]
    w = torch.randn(10, 24)
    fake = awq.fake_quant(w, QuantScheme(3, 8))
    gram, count = awq.input_gram(xs)
    flat = torch.cat([x.reshape(-1, 24) for x in xs])
    direct = float((flat @ (fake - w).T).pow(2).mean())
    assert count == 35
    assert math.isclose(awq.gram_output_loss(fake - w, gram, count), direct, rel_tol=1e-4)
    total, n = awq.channel_abs_sum(xs)
    assert n == 35 and torch.allclose(total / n, awq.channel_abs_mean(xs))


def test_clip_search_summed_over_two_shards_equals_one_process() -> None:
    """What two data-parallel ranks compute (errors summed across shards, divided by all
    tokens) picks the thresholds one process picks on the concatenated tokens."""
    torch.manual_seed(4)
    w = torch.randn(12, 64)
    w[:, 3] *= 6
    x = torch.randn(128, 64)
    scheme = QuantScheme(4, 32)
    one = awq.search_clip(w, x, scheme, out_batch=5)
    halves = (x[:64], x[64:])
    # A stand-in for all_reduce: each call adds the other shard's partial sum, which is
    # what the shard's twin rank contributes at the same point of the loop.
    partials: list[torch.Tensor] = []
    awq.search_clip(w, halves[1], scheme, out_batch=5,
                    reduce=lambda t: partials.append(t.clone()) or t, total_tokens=128)
    other = iter(partials)
    two = awq.search_clip(w, halves[0], scheme, out_batch=5,
                          reduce=lambda t: t + next(other), total_tokens=128)
    assert torch.allclose(one, two)
    assert not torch.equal(one, awq.search_clip(w, halves[0], scheme, out_batch=5))


def test_coarse_to_fine_refines_around_the_coarse_best() -> None:
    """A loss whose minimum (ratio 0.35, grid index 7) lies between two coarse points."""
    first, refine = awq.search_order(20, True)
    assert first == list(range(0, 20, 2)) and refine
    assert awq.search_order(3, True) == ([0, 1, 2], False)  # too few points to thin out
    # Calls come in a fixed order: the even indices, then the coarse best's neighbours. The
    # coarse losses at 0.3 and 0.4 tie; the smaller ratio wins, so 0.25 and 0.35 follow.
    order = iter([*first, 5, 7])
    ratios = awq.ratio_grid(20)
    seen: list[float] = []

    def block_loss(fake: dict[str, torch.Tensor]) -> float:
        seen.append(ratios[next(order)])
        return (seen[-1] - 0.35) ** 2

    found = awq.search_scale(torch.linspace(0.5, 2.0, 8), {"w": torch.randn(4, 8)}, block_loss,
                             QuantScheme(4, 8), coarse_to_fine=True)
    assert found.ratio == 0.35 and len(seen) == 12


def test_input_digest_equals_the_kept_batches_and_follows_a_fold() -> None:
    from qcal.methods.awq_inputs import InputDigest, InputPlan

    xs = [torch.randn(2, 12, 16) for _ in range(3)]
    plan = InputPlan(total_tokens=72, clip_tokens=9, gram=True, sample_tokens=20,
                     keep=frozenset({0, 2}))
    protected = xs[0].clone()
    digest = InputDigest.of([protected, xs[1].clone(), xs[2].clone()], plan)
    assert torch.equal(digest.abs_sum / digest.count, awq.channel_abs_mean(xs))
    assert torch.equal(digest.gram, awq.input_gram(xs)[0])
    assert torch.equal(digest.search.sample(), awq.subsample_tokens(xs, 20))
    assert torch.equal(digest.clip.sample(), awq.subsample_tokens(xs, 9))
    assert digest.kept()[0] == [0, 2]
    s = torch.rand(16) + 0.5
    digest.scale_down(s, protected={protected.untyped_storage().data_ptr()})
    assert torch.equal(protected, xs[0])  # the layer's own hidden states are left alone
    scaled = [x / s for x in xs]
    assert torch.equal(digest.kept()[1][0], scaled[0]) and torch.equal(digest.kept()[1][1], scaled[2])
    torch.testing.assert_close(digest.search.sample(), awq.subsample_tokens(scaled, 20))
    torch.testing.assert_close(digest.abs_sum / digest.count, awq.channel_abs_mean(scaled))
    torch.testing.assert_close(digest.gram, awq.input_gram(scaled)[0], rtol=1e-4, atol=1e-4)
