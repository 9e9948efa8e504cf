"""AWQ over a model: per-layer search on the shared sequential driver, a replayable
search artifact, and registration as the "awq" method.

Per decoder layer: capture the inputs of every linear from the layer as it stands,
then for each `ScaleGroup` of the ArchSpec whose shapes allow it (with grouped-query
attention v_proj's output is narrower than o_proj's input, so that pair is skipped)
search the scale on the group's block and fold it into the previous op; then search
per-group clip thresholds (skipping `awq_clip_skip`), clamp, and RTN-quantize every
linear into a packed `QuantLinear`. The driver then runs the quantized layer to make
the next layer's inputs.

Checkpoint layout: AWQ's result is an ordinary min/max integer grid per group, so
it is packed into the same GPTQ layout (`quant_method: "gptq"`, qzeros/scales/g_idx)
as RTN and GPTQ, and loads with qcal's `QuantLinear` and GPTQ-layout loaders. The
AWQ GEMM layout (AutoAWQ's interleaved packing) is not written.

The search artifact (`awq_search.safetensors`: tensors + JSON metadata, no pickle;
written into the checkpoint and RunOptions.work_dir, or returned by
`awq_quantize_model`) holds, per layer, the folded scales and the clip thresholds;
`apply_awq_artifact` replays it on a float model without calibration data and
yields the same quantized weights.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import torch
from pydantic import Field
from torch import nn

from qcal.config import AWQConfig, ModuleSelection, QuantScheme, from_dict, to_dict
from qcal.errors import CheckpointError, ConfigError
from qcal.methods.awq_artifact import (
    ARTIFACT_FORMAT,
    ARTIFACT_NAME,
    ARTIFACT_VERSION,
    entry_path,
    load_artifact,
    read_entry,
    save_artifact,
    write_entry,
)
from qcal.methods.awq_inputs import InputDigest, InputPlan, search_batches
from qcal.methods.registry import (
    MethodFlag,
    QuantMethod,
    RunOptions,
    apply_result,
    layer_spec,
    selection_tag,
)
from qcal.model.adapters import calibrate_experts, finish_experts
from qcal.model.arch import ArchSpec, ScaleGroup, decoder_layers, get_module
from qcal.model.capture import LayerInputs, feed_linear_inputs
from qcal.model.distributed import SINGLE, DistContext
from qcal.model.fold import fold_into
from qcal.model.offload import DiskWeights
from qcal.model.resolve import arch_for, shared_input_of
from qcal.model.sequential import layer_linear, resume_fingerprint, sequential_quantize
from qcal.packing.qlinear import QuantLinear
from qcal.quant import awq
from qcal.quant.base import rtn_quantize

ALL_LINEARS = ModuleSelection()  # the default selection: every linear at the base scheme

__all__ = ["ARTIFACT_NAME", "apply_awq_artifact", "awq_quantize_model", "call_block",
           "fold_scale", "group_applies", "load_artifact", "save_artifact", "search_layer"]


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


def _fingerprint(model: nn.Module, cfg: AWQConfig, calib: torch.Tensor) -> str:
    return resume_fingerprint("awq", model, cfg, calib, True)


def awq_quantize_model(model: nn.Module, cfg: AWQConfig, calib_ids: torch.Tensor,
                       opts: RunOptions | None = None) -> tuple[dict[str, float | None], dict[str, Any]]:
    """Search and quantize every decoder layer in place; returns (losses, search artifact)."""
    opts = opts or RunOptions()
    if calib_ids is None or calib_ids.numel() == 0:
        raise ConfigError("AWQ needs calibration data; pass --calib (and --nsamples > 0)")
    dist = opts.dist
    if calib_ids.shape[0] < dist.world:
        raise ConfigError(f"{calib_ids.shape[0]} calibration windows cannot be shared by "
                          f"{dist.world} processes; use --nsamples >= {dist.world}")
    arch = arch_for(model)
    entries: dict[int, dict[str, Any]] = {}
    losses: dict[str, float | None] = {}

    def quantize_layer(index: int, layer: nn.Module, inputs: LayerInputs) -> dict[str, Any]:
        prefix = f"{arch.layers_path}.{index}."
        calibrate_experts(layer, opts.selection.moe_all_experts)
        entry, layer_losses = search_layer(layer, layer_spec(arch, index, opts.selection), inputs,
                                           cfg, opts.device, prefix, dist, opts.selection)
        finish_experts(layer)
        entries[index] = entry
        if opts.work_dir is not None and dist.is_main:
            write_entry(entry, entry_path(Path(opts.work_dir), index))
        losses.update(layer_losses)
        return {"losses": layer_losses,
                "ratios": {g["prev_op"]: g["ratio"] for g in entry["scales"]}}

    logs = sequential_quantize(
        model, arch, dist.shard(calib_ids), quantize_layer, device=opts.device,
        progress=opts.progress and dist.is_main, desc="awq", work_dir=opts.work_dir,
        resume=opts.resume, fingerprint=(_fingerprint(model, cfg, calib_ids) + f"-x{dist.world}"
                                         + selection_tag(opts.selection)),
        # Each layer's float weights from a short-lived mapping: the memory-mapped float
        # model would otherwise become resident layer by layer beside the packed one.
        weights=DiskWeights(opts.weights_dir) if opts.weights_dir is not None else None,
        dist=dist, max_memory=opts.max_memory,  # issue 36: activation budget
    )
    n_layers = len(decoder_layers(model, arch))
    for index in range(n_layers):
        if index not in entries:  # finished by an earlier, resumed run
            entries[index] = read_entry(entry_path(Path(opts.work_dir), index))
            losses.update(logs.get(str(index), {}).get("losses", {}))
    artifact = {"format": ARTIFACT_FORMAT, "version": ARTIFACT_VERSION, "config": to_dict(cfg),
                **({} if opts.selection.is_default() else {"selection": to_dict(opts.selection)}),
                "layers_path": arch.layers_path, "norm_offset": arch.norm_offset,
                "layers": [entries[i] for i in range(n_layers)]}
    if opts.work_dir is not None and dist.is_main:
        path = save_artifact(artifact, Path(opts.work_dir) / ARTIFACT_NAME)
        opts.log(f"AWQ search artifact (scales and clips per layer): {path}")
    return losses, artifact


@torch.no_grad()
def apply_awq_artifact(model: nn.Module, artifact: Mapping[str, Any] | str | Path,
                       packed: bool = True) -> None:
    """Replay a search artifact on a float model: fold scales, clamp, RTN; no calibration data."""
    art = load_artifact(artifact) if isinstance(artifact, (str, Path)) else artifact
    if art.get("format") != ARTIFACT_FORMAT or art.get("version") != ARTIFACT_VERSION:
        raise CheckpointError("not a qcal AWQ search artifact of version "
                              f"{ARTIFACT_VERSION}; re-run the AWQ search")
    cfg = from_dict(AWQConfig, art["config"])
    arch = arch_for(model)
    layers = decoder_layers(model, arch)
    if len(art["layers"]) != len(layers) or art["layers_path"] != arch.layers_path:
        raise CheckpointError(
            f"the AWQ artifact covers {len(art['layers'])} layers at {art['layers_path']!r}, the model "
            f"has {len(layers)} at {arch.layers_path!r}; use the artifact made for this model"
        )
    selection = from_dict(ModuleSelection, art["selection"]) if "selection" in art \
        else ModuleSelection()
    for index, (layer, entry) in enumerate(zip(layers, art["layers"], strict=True)):
        spec = layer_spec(arch, index, selection)
        for g in entry["scales"]:
            group = ScaleGroup(g["prev_op"], tuple(g["linears"]), "")
            fold_scale(layer, group, g["scale"].to(next(layer.parameters()).device),
                       float(art["norm_offset"]))
        quantize_layer_weights(layer, spec, cfg.scheme, entry["clips"], packed,
                               f"{arch.layers_path}.{index}.", selection)


def run_awq(model: nn.Module, cfg: AWQConfig, calib: torch.Tensor | None,
            opts: RunOptions) -> dict[str, float | None]:
    if calib is None:
        raise ConfigError("AWQ needs calibration data; pass --calib")
    if not opts.packed:
        raise ConfigError("AWQ always packs into QuantLinear; drop the fake-quant option")
    losses, _ = awq_quantize_model(model, cfg, calib, opts)
    return losses


FLAGS = (
    MethodFlag("no_clip", "clip_search", "AWQ: skip the clip search", invert=True),
    MethodFlag("search_tokens", "search_tokens",
               "AWQ: calibration tokens the scale search scores each candidate on "
               "(default 4096; 0: all, as the reference does)", value_type=int, default=None,
               schema=Annotated[int, Field(ge=0, description="an integer >= 0")] | None),
    MethodFlag("full_ratio_grid", "coarse_to_fine", "AWQ: score all 20 ratios (default: every "
               "other one, then the best's neighbours)", invert=True),
)

METHOD = QuantMethod("awq", AWQConfig, True, run_awq, flags=FLAGS)
