"""AWQ's search on one decoder layer: scale search, fold, clip search, rounding.

For each `ScaleGroup` of the ArchSpec whose shapes allow it (with grouped-query attention
v_proj's output is narrower than o_proj's input, so that pair is skipped) the scale is
searched on the group's block, scored by the block's output error on what
`qcal.methods.awq_inputs` kept of its inputs, and folded into the previous op; then
per-group clip thresholds are searched (skipping `awq_clip_skip`), the weights clamped and
every linear RTN-quantized into a packed `QuantLinear`. `fold_scale` and
`quantize_layer_weights` are also what replaying a saved search does
(qcal.methods.awq_runner); the pure math is qcal.quant.awq.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from qcal.config import AWQConfig, ModuleSelection, QuantScheme
from qcal.errors import CheckpointError, ConfigError
from qcal.methods.awq_inputs import InputDigest, InputPlan, search_batches
from qcal.methods.registry import apply_result
from qcal.model.arch import ArchSpec, ScaleGroup, get_module
from qcal.model.capture import LayerInputs, feed_linear_inputs
from qcal.model.distributed import SINGLE, DistContext
from qcal.model.fold import fold_into
from qcal.model.resolve import shared_input_of
from qcal.model.sequential import layer_linear
from qcal.packing.qlinear import QuantLinear
from qcal.quant import awq
from qcal.quant.base import rtn_quantize

ALL_LINEARS = ModuleSelection()  # the default selection: every linear at the base scheme


def _kwargs_to(kwargs: Mapping[str, Any], device: torch.device | str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in kwargs.items():
        if isinstance(value, torch.Tensor):
            value = value.to(device)
        elif isinstance(value, tuple) and all(isinstance(v, torch.Tensor) for v in value):
            value = tuple(v.to(device) for v in value)
        out[key] = value
    return out


def call_block(block: nn.Module, x: torch.Tensor, kwargs: Mapping[str, Any]) -> torch.Tensor:
    """Run a block the way its decoder layer does: attention needs the rotary embeddings and
    mask the layer received, an MLP or a linear takes only x."""
    params = inspect.signature(block.forward).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        kw = dict(kwargs)
    else:
        kw = {k: v for k, v in kwargs.items() if k in params}
    out = block(x, **kw)
    return out[0] if isinstance(out, tuple) else out


def _prev_width(prev: nn.Module, name: str) -> int:
    if isinstance(prev, nn.Linear):
        return prev.out_features
    weight = getattr(prev, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 1:
        raise ConfigError(
            f"AWQ cannot fold a scale into {name} ({type(prev).__name__}): it is neither a linear "
            "nor a norm with a 1-d weight; fix the ArchSpec's scale_groups for this model"
        )
    return weight.shape[0]


def group_applies(layer: nn.Module, group: ScaleGroup) -> bool:
    """Whether the prev op's output width matches the linears' input (false for GQA v->o)."""
    try:
        prev = get_module(layer, group.prev_op)
    except AttributeError:
        raise ConfigError(
            f"the layer has no module {group.prev_op!r} named by the ArchSpec's AWQ scale group; "
            "add an override for this model type (qcal.model.resolve.OVERRIDES)"
        ) from None
    width = _prev_width(prev, group.prev_op)
    return all(layer_linear(layer, n).in_features == width for n in group.linears)


@torch.no_grad()
def fold_scale(layer: nn.Module, group: ScaleGroup, s: torch.Tensor, norm_offset: float = 0.0) -> None:
    """prev_op's output becomes x / s and each linear's columns W * s: the float function is kept."""
    prev = get_module(layer, group.prev_op)
    width = _prev_width(prev, group.prev_op)
    if s.numel() != width:
        raise CheckpointError(
            f"AWQ scale for {group.prev_op} has {s.numel()} entries but the op is {width} wide; "
            "the artifact was made for a different model"
        )
    fold_into(prev, [layer_linear(layer, n) for n in group.linears], s, norm_offset)


@torch.no_grad()
def quantize_layer_weights(layer: nn.Module, arch: ArchSpec, scheme: QuantScheme,
                           clips: Mapping[str, torch.Tensor], packed: bool = True,
                           prefix: str = "", selection: ModuleSelection = ALL_LINEARS,
                           ) -> dict[str, torch.Tensor]:
    """Clamp by the clip thresholds, RTN every linear (each at its own scheme:
    `selection.scheme_of`), swap in QuantLinears; returns the float weights each linear held
    just before rounding (clipped, scaled)."""
    before: dict[str, torch.Tensor] = {}
    for name in arch.linear_names:
        lin = layer_linear(layer, name)
        w = lin.weight.detach()
        own = selection.scheme_of(prefix + name, scheme)
        if name in clips:
            w = awq.apply_clip(w, clips[name].to(w.device), own.effective_group(w.shape[1]))
        before[name] = w
        apply_result(layer, name, rtn_quantize(w, own, name=prefix + name), packed)
    return before


def _shared_inputs(arch: ArchSpec) -> dict[str, str]:
    """Linear -> the linear whose captured input it shares (a step's linears share one input,
    one per expert in a step of MoE experts)."""
    return shared_input_of(arch)


def _block_loss(block: nn.Module, linears: dict[str, nn.Linear], xs: list[torch.Tensor],
                kwargs: list[dict[str, Any]], dist: DistContext) -> awq.BlockLoss:
    """MSE of the block's output with fake weights swapped in against the float block, on
    `xs` (summed over ranks, so every rank scores every rank's tokens alike)."""
    refs = [call_block(block, x, kw) for x, kw in zip(xs, kwargs, strict=True)]

    def loss(fake: Mapping[str, torch.Tensor]) -> float:
        originals = {n: m.weight.data for n, m in linears.items()}
        total, count = 0.0, 0
        try:
            for n, m in linears.items():
                m.weight.data = fake[n]
            for x, kw, ref in zip(xs, kwargs, refs, strict=True):
                out = call_block(block, x, kw)
                total += float((out.float() - ref.float()).pow(2).sum())
                count += ref.numel()
        finally:
            for n, m in linears.items():
                m.weight.data = originals[n]
        total, count = dist.sum_numbers(total, count)
        return total / max(count, 1.0)

    return loss


def _linear_loss(name: str, linear: nn.Linear, gram: torch.Tensor, count: int,
                 dist: DistContext) -> awq.BlockLoss:
    """A block that is one linear: its output MSE from the Gram matrix of every token (exact;
    the weight difference is all that changes between ratios)."""
    gram = gram.clone()
    dist.all_reduce_sum(gram)
    tokens = int(dist.sum_numbers(count)[0])
    weight = linear.weight.detach().float()
    return lambda fake: awq.gram_output_loss(fake[name].float() - weight, gram, tokens)


def _linears_loss(linears: dict[str, nn.Linear], gram: torch.Tensor | None, count: int,
                  dist: DistContext) -> awq.BlockLoss:
    """Output MSE of several linears reading one input, from its Gram matrix (exact)."""
    assert gram is not None, "a linears-only scale group keeps its input's Gram matrix"
    gram = gram.clone()
    dist.all_reduce_sum(gram)
    tokens = int(dist.sum_numbers(count)[0])
    weights = {n: m.weight.detach().float() for n, m in linears.items()}
    return lambda fake: awq.gram_output_loss(
        torch.cat([fake[n].float() - w for n, w in weights.items()]), gram, tokens)


def _input_plans(layer: nn.Module, arch: ArchSpec, groups: list[ScaleGroup],
                 inputs: LayerInputs, cfg: AWQConfig, dist: DistContext) -> dict[str, InputPlan]:
    """For each shared linear input, what the scale groups reading it and the clip search
    need kept (see `qcal.methods.awq_inputs`)."""
    shared = _shared_inputs(arch)
    per_batch = [h.shape[0] * h.shape[1] for h in inputs.hidden]
    total = sum(per_batch)
    budget = math.ceil(cfg.search_tokens / dist.world) if cfg.search_tokens else 0
    plans = {rep: InputPlan(total, math.ceil(cfg.clip_tokens / dist.world))
             for rep in sorted(set(shared.values()))}
    for group in groups:
        rep = shared[group.linears[0]]
        plan = plans[rep]
        block = get_module(layer, group.block) if group.block else None
        if not group.block or (group.linears == (group.block,) and isinstance(block, nn.Linear)):
            plan = dataclasses.replace(plan, gram=True)
        elif not budget or budget >= total:
            plan = dataclasses.replace(plan, keep=None)
        elif group.token_wise:
            plan = dataclasses.replace(plan, sample_tokens=budget)
        elif plan.keep is not None:
            chosen = search_batches(len(per_batch), per_batch[0], budget)
            plan = dataclasses.replace(plan, keep=plan.keep | frozenset(chosen))
        plans[rep] = plan
    return plans


def _group_loss(layer: nn.Module, group: ScaleGroup, digest: InputDigest,
                kwargs: list[dict[str, Any]], dist: DistContext) -> awq.BlockLoss:
    """The loss that scores a scale for `group`, on what its input's plan kept: the Gram
    matrix (a lone linear, exact), a token sample (token-wise blocks) or whole batches."""
    linears = {n: layer_linear(layer, n) for n in group.linears}
    if not group.block:  # no module takes exactly this input: the linears' own output error
        return _linears_loss(linears, digest.gram, digest.count, dist)
    block = get_module(layer, group.block)
    if group.linears == (group.block,) and isinstance(block, nn.Linear) and digest.gram is not None:
        return _linear_loss(group.block, block, digest.gram, digest.count, dist)
    if group.token_wise and digest.search is not None:  # one evenly spread sample, one sequence
        sample = digest.search.sample().to(digest.search.pieces[0].dtype)
        return _block_loss(block, linears, [sample[None]], [{}], dist)
    order, xs = digest.kept()
    return _block_loss(block, linears, xs, [kwargs[i] for i in order], dist)


@torch.no_grad()
def search_layer(layer: nn.Module, arch: ArchSpec, inputs: LayerInputs, cfg: AWQConfig,
                 device: str = "cpu", prefix: str = "", dist: DistContext = SINGLE,
                 selection: ModuleSelection = ALL_LINEARS,
                 ) -> tuple[dict[str, Any], dict[str, float | None]]:
    """Search, fold and quantize one decoder layer in place; returns (artifact entry, losses).

    Under torchrun each rank holds its own calibration shard: activation statistics, block
    losses and clip errors are summed across ranks, and rank 0's choices are broadcast, so
    every rank folds and rounds the same weights. Scale and clip searches score each
    linear at its own scheme (`selection.scheme_of`, --scheme-override)."""
    schemes = {n: selection.scheme_of(prefix + n, cfg.scheme) for n in arch.linear_names}
    kwargs = [_kwargs_to(kw, device) for kw in inputs.kwargs]
    shared = _shared_inputs(arch)
    groups = [g for g in arch.scale_groups if group_applies(layer, g)]
    plans = _input_plans(layer, arch, groups, inputs, cfg, dist)
    digests = {rep: InputDigest(plan) for rep, plan in plans.items()}
    feed_linear_inputs(layer, inputs, list(digests), lambda n, x: digests[n].add(x), device)
    hidden = {h.untyped_storage().data_ptr() for h in inputs.hidden}
    scales: list[dict[str, Any]] = []
    for group in groups:
        linears = {n: layer_linear(layer, n) for n in group.linears}
        digest = digests[shared[group.linears[0]]]
        count = int(dist.sum_numbers(digest.count)[0])
        if count == 0:  # an expert no calibration token was routed to: plain RTN below
            continue
        abs_sum = digest.abs_sum.clone()
        dist.all_reduce_sum(abs_sum)
        weights = {n: m.weight.detach().clone() for n, m in linears.items()}
        w_mean = (awq.weight_channel_mean(weights.values(), [schemes[n] for n in weights])
                  if cfg.duo_scaling else None)
        found = awq.search_scale(abs_sum / count, weights,
                                 _group_loss(layer, group, digest, kwargs, dist),
                                 {n: schemes[n] for n in weights}, cfg.grid_points, w_mean,
                                 cfg.coarse_to_fine)
        dist.broadcast(found.scale, 0)
        fold_scale(layer, group, found.scale, arch.norm_offset)
        for rep in {shared[n] for n in group.linears}:
            digests[rep].scale_down(found.scale, hidden)
        scales.append({"prev_op": group.prev_op, "linears": list(group.linears),
                       "scale": found.scale.cpu(), "ratio": found.ratio, "loss": found.loss,
                       "rtn_loss": found.rtn_loss})
    samples = {rep: d.clip.sample() for rep, d in digests.items()}
    digests.clear()  # the clip samples are all that is needed from here on
    clips: dict[str, torch.Tensor] = {}
    if cfg.clip_search:
        for name in arch.linear_names:
            if name in arch.awq_clip_skip:
                continue
            w = layer_linear(layer, name).weight.detach()
            x = samples[shared[name]]
            tokens = int(dist.sum_numbers(x.shape[0])[0])
            if tokens == 0:
                continue
            reduce = dist.all_reduce_sum if dist.active else None
            clip = awq.search_clip(w, x, schemes[name], cfg.clip_grid, cfg.max_shrink,
                                   reduce=reduce, total_tokens=tokens)
            clips[name] = dist.broadcast(clip.contiguous(), 0).cpu()
    floats = {n: layer_linear(layer, n).weight.detach().float().clone() for n in arch.linear_names}
    quantize_layer_weights(layer, arch, cfg.scheme, clips, True, prefix, selection)
    losses: dict[str, float | None] = {}
    for name, w in floats.items():
        x = samples[shared[name]]
        if x.shape[0] == 0:
            losses[prefix + name] = None  # no calibration tokens: RTN, no loss to score
            continue
        module = get_module(layer, name)
        wq = (module.dequantized_weight(torch.float32) if isinstance(module, QuantLinear)
              else module.weight.detach().float())
        losses[prefix + name] = float((x @ (wq - w).T).pow(2).mean())
    return {"scales": scales, "clips": clips}, losses
