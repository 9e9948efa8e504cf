"""AWQ (activation-aware weight quantization) as pure tensor functions.

The method, as the reference code runs it: for a group of linears fed by one op,
s_x = mean |x| per input channel; for ratio in {0, 1/n, ..., (n-1)/n} the candidate
scale is s = s_x^ratio (or, with duo scaling, s_x^ratio / s_w^(1 - ratio)),
normalised by sqrt(max(s) * min(s)); the weights become Q(W * s) / s and the
candidate's loss is the MSE of the block's output against the float block. The
best s is folded into the preceding op (x / s) and the linears' columns (W * s),
which leaves the float function unchanged. A clip search then shrinks each
group's |w| threshold to max * (1 - i/n) for i < max_shrink * n, scored on the
output of the linear over a subsample of tokens; the final weights are RTN of
the clipped, scaled weights on the usual min/max grid.

Ratio 0 is s = 1, plain RTN, so the chosen scale never scores worse than RTN on
the block loss. Nothing here knows about models: the block is a callable.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence

import torch

from qcal.config import QuantScheme
from qcal.errors import NumericalError
from qcal.quant import intgrid as grid

# Floor on candidate scales so a dead input channel cannot produce 0 or inf.
MIN_SCALE = 1e-4

BlockLoss = Callable[[Mapping[str, torch.Tensor]], float]


def channel_abs_sum(xs: Iterable[torch.Tensor]) -> tuple[torch.Tensor, int]:
    """Sum of |x| per input channel (last dim) and the token count: what ranks add up."""
    total: torch.Tensor | None = None
    count = 0
    for x in xs:
        flat = x.reshape(-1, x.shape[-1]).float()
        part = flat.abs().sum(dim=0)
        total = part if total is None else total + part.to(total.device)
        count += flat.shape[0]
    if total is None or count == 0:
        raise NumericalError("no activations to compute AWQ statistics from; pass calibration data")
    return total, count


def channel_abs_mean(xs: Iterable[torch.Tensor]) -> torch.Tensor:
    """s_x: mean |x| per input channel (last dim) over every token of every batch."""
    total, count = channel_abs_sum(xs)
    return total / count


def input_gram(xs: Iterable[torch.Tensor]) -> tuple[torch.Tensor, int]:
    """G = sum over tokens of x x^T (float32, [in, in]) and the token count."""
    gram: torch.Tensor | None = None
    count = 0
    for x in xs:
        flat = x.reshape(-1, x.shape[-1]).float()
        part = flat.T @ flat
        gram = part if gram is None else gram.add_(part.to(gram.device))
        count += flat.shape[0]
    if gram is None or count == 0:
        raise NumericalError("no activations to compute the AWQ block loss from")
    return gram, count


def gram_output_loss(delta: torch.Tensor, gram: torch.Tensor, tokens: int) -> float:
    """Mean squared output error of a linear whose weight is off by `delta` [out, in], over
    the tokens whose Gram matrix is `gram`: sum((delta x)^2) = trace(delta G delta^T).

    Same value as running the linear on every token, at out*in^2 instead of tokens*out*in
    per call: the ratio search calls it 20 times on one G.
    """
    d = delta.float()
    return float(((d @ gram) * d).sum()) / (tokens * d.shape[0])


def weight_channel_mean(weights: Iterable[torch.Tensor],
                        scheme: QuantScheme | Sequence[QuantScheme]) -> torch.Tensor:
    """s_w for duo scaling: |W| relative to its group's max, averaged per input channel.
    `scheme` is one for all weights or one per weight (per-module schemes)."""
    rows = []
    weights = list(weights)
    schemes = [scheme] * len(weights) if isinstance(scheme, QuantScheme) else list(scheme)
    for w, own in zip(weights, schemes, strict=True):
        out_f, in_f = w.shape
        g = own.effective_group(in_f)
        groups = -(-in_f // g)
        wp = torch.nn.functional.pad(w.float().abs(), (0, groups * g - in_f)).reshape(out_f, groups, g)
        rel = wp / wp.amax(dim=-1, keepdim=True).clamp(min=1e-12)
        rows.append(rel.reshape(out_f, groups * g)[:, :in_f])
    return torch.cat(rows, dim=0).mean(dim=0)


def ratio_grid(points: int) -> list[float]:
    """{0, 1/n, ..., (n-1)/n}: the exponents tried for s_x."""
    return [i / points for i in range(points)]


def candidate_scale(x_mean: torch.Tensor, ratio: float,
                    w_mean: torch.Tensor | None = None) -> torch.Tensor:
    """s = s_x^ratio (/ s_w^(1-ratio) with duo scaling), normalised by sqrt(max * min)."""
    s = x_mean.float().pow(ratio)
    if w_mean is not None:
        s = s / w_mean.float().pow(1 - ratio).clamp(min=MIN_SCALE)
    s = s.clamp(min=MIN_SCALE)
    s = s / torch.sqrt(s.max() * s.min())
    if not torch.isfinite(s).all():
        raise NumericalError("AWQ produced non-finite scales; the activations contain NaN or inf")
    return s


def fake_quant(w: torch.Tensor, scheme: QuantScheme) -> torch.Tensor:
    """RTN quantize-dequantize on the per-group min/max grid (float32 result).

    Same values as `rtn_quantize(w).dequantize()`, computed on the grouped view
    without gathering per-element scales: this runs 20 times per scale group.
    """
    out_f, in_f = w.shape
    q = _fake_quant_groups(_grouped(w.float(), scheme.effective_group(in_f)), scheme)
    return q.reshape(out_f, -1)[:, :in_f]


def scaled_fake_quant(w: torch.Tensor, s: torch.Tensor, scheme: QuantScheme) -> torch.Tensor:
    """Q(W * s) / s: what the linear computes on the unscaled input once s is folded."""
    return fake_quant(w.float() * s, scheme) / s


@dataclasses.dataclass
class ScaleSearch:
    """The chosen scale and the loss curve over the ratio grid (losses[0] is plain RTN;
    None where a coarse-to-fine search did not evaluate the ratio)."""

    scale: torch.Tensor
    ratio: float
    loss: float
    losses: list[float | None]

    @property
    def rtn_loss(self) -> float:
        assert self.losses[0] is not None  # ratio 0 is always evaluated
        return self.losses[0]


def search_order(grid_points: int, coarse_to_fine: bool) -> tuple[list[int], bool]:
    """Grid indices evaluated first, and whether the neighbours of the best follow.

    Coarse to fine scores every other ratio, then the two between which the best lies on
    either side: 12 of 20 block losses. It returns the full grid's choice whenever the loss
    is unimodal at the coarse spacing (on the default model a one-off check, since removed,
    found it agreeing with the full grid; git history keeps scripts/awq_search_check.py).
    """
    if not coarse_to_fine or grid_points < 4:
        return list(range(grid_points)), False
    return list(range(0, grid_points, 2)), True


def search_scale(
    x_mean: torch.Tensor, weights: Mapping[str, torch.Tensor], block_loss: BlockLoss,
    scheme: QuantScheme | Mapping[str, QuantScheme], grid_points: int = 20,
    w_mean: torch.Tensor | None = None, coarse_to_fine: bool = False,
) -> ScaleSearch:
    """Try the ratios; `block_loss(fake_weights)` scores the block with those weights swapped in.
    `scheme`: one for every weight, or each weight's own by name (per-module schemes)."""
    schemes = {name: scheme if isinstance(scheme, QuantScheme) else scheme[name]
               for name in weights}
    ratios = ratio_grid(grid_points)
    losses: list[float | None] = [None] * grid_points
    best: ScaleSearch | None = None

    def evaluate(index: int) -> None:
        nonlocal best
        s = candidate_scale(x_mean, ratios[index], w_mean)
        fake = {name: scaled_fake_quant(w, s.to(w.device), schemes[name]).to(w.dtype)
                for name, w in weights.items()}
        loss = float(block_loss(fake))
        if not math.isfinite(loss):
            raise NumericalError(f"AWQ block loss is {loss} at ratio {ratios[index]}; check the inputs")
        losses[index] = loss
        # Ties go to the smaller ratio, as in a plain left-to-right scan of the grid.
        if best is None or loss < best.loss or (loss == best.loss and ratios[index] < best.ratio):
            best = ScaleSearch(s, ratios[index], loss, losses)

    first, refine = search_order(grid_points, coarse_to_fine)
    for index in first:
        evaluate(index)
    if refine:
        assert best is not None
        centre = ratios.index(best.ratio)
        for index in (centre - 1, centre + 1):
            if 0 <= index < grid_points and losses[index] is None:
                evaluate(index)
    assert best is not None
    best.losses = losses
    return best


class TokenSampler:
    """Every k-th token (k = total // n) of a stream of batches, about `n` in all, gathered
    batch by batch: concatenating the batches first would copy all of them, and a strided
    view of that copy would keep the whole of it alive with the sample."""

    def __init__(self, total_tokens: int, n_tokens: int) -> None:
        self.n_tokens = n_tokens
        self.step = max(1, total_tokens // max(n_tokens, 1))
        self.offset = 0  # flattened index of the next batch's first token
        self.pieces: list[torch.Tensor] = []

    def add(self, x: torch.Tensor) -> None:
        flat = x.reshape(-1, x.shape[-1])
        idx = torch.arange((-self.offset) % self.step, flat.shape[0], self.step, device=flat.device)
        self.pieces.append(flat.index_select(0, idx))
        self.offset += flat.shape[0]

    def scale_down(self, s: torch.Tensor) -> None:
        """The sample of x / s (in place, in the activations' dtype)."""
        for piece in self.pieces:
            piece.div_(s.to(device=piece.device, dtype=piece.dtype))

    def sample(self) -> torch.Tensor:
        """[n_tokens, channels] float32."""
        return torch.cat(self.pieces)[: self.n_tokens].float()


def subsample_tokens(xs: Iterable[torch.Tensor], n_tokens: int) -> torch.Tensor:
    """Every k-th token of the flattened activations so that about `n_tokens` remain."""
    xs = list(xs)
    sampler = TokenSampler(sum(x.numel() // x.shape[-1] for x in xs), n_tokens)
    for x in xs:
        sampler.add(x)
    return sampler.sample()


def _grouped(w: torch.Tensor, g: int) -> torch.Tensor:
    """[out, in] -> [out, groups, g], zero-padding a ragged last group."""
    out_f, in_f = w.shape
    groups = -(-in_f // g)
    if groups * g != in_f:
        w = torch.nn.functional.pad(w, (0, groups * g - in_f))
    return w.reshape(out_f, groups, g)


def _fake_quant_groups(wg: torch.Tensor, scheme: QuantScheme) -> torch.Tensor:
    """Quantize-dequantize each [.., g] row of a grouped weight on its own min/max grid."""
    rows = wg.reshape(-1, wg.shape[-1])
    scale, zero = grid.find_params(rows, scheme.bits, scheme.sym)
    scale, zero = scale[:, None], zero[:, None]
    # grid.fake_quantize's arithmetic, in place: the searches call this hundreds of times.
    q = rows.div(scale).round_().add_(zero).clamp_(0, scheme.maxq).sub_(zero).mul_(scale)
    return q.reshape(wg.shape)


@torch.no_grad()
def search_clip(
    w: torch.Tensor, x: torch.Tensor, scheme: QuantScheme, grid_points: int = 20,
    max_shrink: float = 0.5, out_batch: int = 256,
    reduce: Callable[[torch.Tensor], torch.Tensor] | None = None, total_tokens: int = 0,
) -> torch.Tensor:
    """Per (output row, group) |w| threshold [out, groups] minimising the output MSE on x [n, in].

    Candidates are max|w| * (1 - i/grid_points) for i < max_shrink * grid_points. With
    `reduce` (data-parallel ranks, each with its own x), the squared errors are summed by
    `reduce` and divided by `total_tokens`, so every rank scores on all ranks' tokens.
    """
    g = scheme.effective_group(w.shape[1])
    xg = _grouped(x.float(), g)  # [n, groups, g]
    steps = int(max_shrink * grid_points)
    best_vals = []
    for start in range(0, w.shape[0], out_batch):
        wg = _grouped(w[start:start + out_batch].float(), g)  # [o, groups, g]
        org_max = wg.abs().amax(dim=-1, keepdim=True)
        org_out = torch.einsum("ogk,ngk->ong", wg, xg)
        best_err = torch.full(wg.shape[:2], float("inf"), device=w.device)
        best_max = org_max.squeeze(-1).clone()
        for i in range(max(1, steps)):
            max_val = org_max * (1 - i / grid_points)
            q = _fake_quant_groups(torch.clamp(wg, -max_val, max_val), scheme)
            sq = (torch.einsum("ogk,ngk->ong", q, xg) - org_out).pow(2)
            err = sq.mean(dim=1) if reduce is None else reduce(sq.sum(dim=1)) / total_tokens
            better = err < best_err
            best_err = torch.where(better, err, best_err)
            best_max = torch.where(better, max_val.squeeze(-1), best_max)
        best_vals.append(best_max)
    return torch.cat(best_vals, dim=0)


def apply_clip(w: torch.Tensor, max_val: torch.Tensor, group_size: int) -> torch.Tensor:
    """Clamp each group of `w` [out, in] to [-max_val, max_val] ([out, groups] thresholds)."""
    g = w.shape[1] if group_size == -1 else group_size
    bound = max_val.to(w.dtype).repeat_interleave(g, dim=1)[:, :w.shape[1]]
    return torch.clamp(w, -bound, bound)


def fold_into_norm(weight: torch.Tensor, bias: torch.Tensor | None, s: torch.Tensor,
                   offset: float = 0.0) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A norm y = x_hat * (offset + w) + b whose output must become y / s."""
    s = s.to(weight.dtype)
    new_w = (offset + weight) / s - offset
    return new_w, None if bias is None else bias / s


def fold_into_linear_out(weight: torch.Tensor, bias: torch.Tensor | None, s: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A linear [out, in] whose output must become y / s (s over out_features)."""
    s = s.to(weight.dtype)
    return weight / s[:, None], None if bias is None else bias / s


def scale_linear_in(weight: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """A consumer linear [out, in] of x / s: columns times s keep its output unchanged."""
    return weight * s.to(weight.dtype)[None, :]
