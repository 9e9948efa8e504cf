"""GPTQ over a whole model: Hessians from hooks, layer by layer, in true-sequential order.

Per decoder layer and per step of the ArchSpec's `sequential` order (q/k/v, o,
gate/up, down): feed the layer's calibration inputs through the partly quantized
layer, accumulate one Hessian per distinct linear input, quantize the step's
linears, swap them for `QuantLinear`s. The layer-wise driver then runs the
quantized layer to make the next layer's inputs.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable
from typing import Annotated, Any

import torch
from pydantic import Field
from qcal_kernels.dispatch import prime_reference
from torch import nn

from qcal.config import GPTQConfig, QuantScheme
from qcal.errors import ConfigError
from qcal.methods.registry import (
    MethodFlag,
    QuantMethod,
    RunOptions,
    apply_result,
    layer_spec,
    selection_tag,
)
from qcal.model.adapters import calibrate_experts, finish_experts
from qcal.model.arch import ArchSpec
from qcal.model.capture import LayerInputs, feed_linear_inputs
from qcal.model.distributed import SINGLE, DistContext
from qcal.model.loading import DTYPES
from qcal.model.offload import DiskWeights
from qcal.model.replay import AttentionReplay
from qcal.model.resolve import arch_for
from qcal.model.sequential import layer_linear, resume_fingerprint, sequential_quantize
from qcal.packing.qlinear import QuantLinear
from qcal.quant import intgrid as grid
from qcal.quant.base import QuantResult, rtn_quantize
from qcal.quant.gptq import gptq_quantize
from qcal.quant.hessian import SYMMETRIC_FROM, accumulate_hessian, hessian_loss, mirror_upper_

CALIB_BATCH = 8
# A quantized linear with fewer weights than this (64 MiB in float32) keeps its dequantized
# float weight for the layer's later calibration passes (saves unpacking it at each one);
# bigger ones (8B-class q/o/MLP) do not: together they would be most of a float layer.
PRIME_BELOW = 2**24


class HessianSink:
    """Accumulates one Hessian per *distinct* input tensor: q/k/v (and gate/up) read the
    same normed hidden states, so they share one Hessian instead of computing it 3x."""

    def __init__(self, names: list[str] | tuple[str, ...]) -> None:
        self.names = tuple(names)
        self.hessians: dict[str, torch.Tensor] = {}
        self.counts: dict[str, int] = {}
        self.alias: dict[str, str] = {}
        # Held until every name was seen in this forward, so a freed tensor's address
        # cannot be reused by a different input and be mistaken for a shared one.
        self._batch: dict[tuple[Any, ...], tuple[str, torch.Tensor]] = {}
        self._seen: set[str] = set()
        self._upper: set[str] = set()  # Hessians holding only their upper triangle so far

    def __call__(self, name: str, x: torch.Tensor) -> None:
        key = (x.data_ptr(), tuple(x.shape), tuple(x.stride()))
        owner = self._batch.get(key)
        if owner is not None:
            self.alias[name] = owner[0]
        else:
            self._batch[key] = (name, x)
            # Wide inputs (an MLP's down_proj) accumulate the upper triangle only, half the
            # work; `hessian` completes it when it is first read. One that was already read
            # (complete) keeps accumulating whole.
            upper = x.shape[-1] >= SYMMETRIC_FROM and (name in self._upper
                                                       or name not in self.hessians)
            if upper:
                self._upper.add(name)
            self.hessians[name], self.counts[name] = accumulate_hessian(
                x, self.hessians.get(name), self.counts.get(name, 0), upper_only=upper)
        self._seen.add(name)
        if self._seen >= set(self.names):
            self._batch.clear()
            self._seen.clear()

    def feed(self, layer: nn.Module, inputs: LayerInputs, device: str) -> None:
        """Run the calibration batches through `layer`, collecting this step's inputs."""
        feed_linear_inputs(layer, inputs, self.names, self, device)

    def owner(self, name: str) -> str:
        """The linear whose input statistics `name` shares (itself if none)."""
        return self.alias.get(name, name)

    def asymmetry(self, name: str) -> tuple[torch.Tensor, float] | None:
        """What `gptq_quantize` takes as `asymmetry` for `name`: None for plain GPTQ."""
        return None

    def statistics(self) -> tuple[dict[str, torch.Tensor], ...]:
        """The running means kept per input, summed across ranks under torchrun."""
        return (self.hessians,)

    def release(self, owner: str) -> None:
        """Free the statistics of input `owner` (the last batch that reads them is done)."""
        for stats in self.statistics():
            stats.pop(owner, None)

    def hessian(self, name: str) -> torch.Tensor:
        owner = self.alias.get(name, name)
        if owner not in self.hessians:
            raise ConfigError(
                f"{name} received no calibration inputs; is it used in the layer's forward "
                "pass? Fix the ArchSpec's `sequential` names for this architecture"
            )
        if owner in self._upper:
            mirror_upper_(self.hessians[owner])
            self._upper.discard(owner)
        return self.hessians[owner]


def _attention_replay(layer: nn.Module, steps: tuple[tuple[str, ...], ...],
                      attention: tuple[str, str] | None, n_batches: int,
                      norm: str | None = None) -> AttentionReplay | None:
    """A replay of the attention block when every linear inside it is quantized in a step
    before its output linear's (true-sequential order), else None."""
    if attention is None:
        return None
    block, out = attention
    step_of = {name: i for i, step in enumerate(steps) for name in step}
    inside = [n for n in step_of if n.startswith(block + ".") and n != out]
    if out not in step_of or not inside or any(step_of[n] >= step_of[out] for n in inside):
        return None
    return AttentionReplay(layer, block, out, n_batches, norm)


def quantize_layer_gptq(
    layer: nn.Module, inputs: LayerInputs, steps: tuple[tuple[str, ...], ...], cfg: GPTQConfig,
    prefix: str = "", device: str = "cpu", packed: bool = True, dist: DistContext = SINGLE,
    attention: tuple[str, str] | None = None, attention_norm: str | None = None,
    scheme_of: Callable[[str], QuantScheme] | None = None,
    new_sink: Callable[[tuple[str, ...]], HessianSink] = HessianSink,
) -> dict[str, float | None]:
    """Quantize one decoder layer in place; returns {linear name: hessian loss}.

    Under torchrun each rank feeds its own calibration shard; the Hessians are summed
    across ranks, each linear is quantized by its owner rank and broadcast to the others.
    With `attention` (ArchSpec.attention) the attention core is run once after q/k/v are
    final and replayed for the later steps and the layer's final pass (qcal.model.replay;
    the caller releases it with `release_replay` after that pass), skipping
    `attention_norm` (ArchSpec.attention_norm) while it does. `scheme_of(name)` gives a
    linear its own scheme (--scheme-override; default: `cfg.scheme` for all). `new_sink(step)`
    collects a step's statistics (GPTAQ's sink adds the float stream's, qcal.methods.gptaq)."""
    losses: dict[str, float | None] = {}

    def cfg_of(name: str) -> GPTQConfig:
        scheme = scheme_of(name) if scheme_of is not None else cfg.scheme
        return cfg if scheme == cfg.scheme else dataclasses.replace(cfg, scheme=scheme)

    for name in (n for step in steps for n in step):
        layer_linear(layer, name)  # fail early on a wrong ArchSpec
    replay = _attention_replay(layer, steps, attention, len(inputs.hidden), attention_norm)
    for step in steps:
        sink = new_sink(step)
        records = replay is not None and replay.out_name in step
        if records:
            replay.record()
        sink.feed(layer, inputs, device)
        if records:
            replay.replay()
        _reduce_hessians(sink, dist)
        # Linears that read the same input (q/k/v, gate/up) share H and its act-order
        # permutation, and GPTQ treats weight rows independently: one column loop over
        # their stacked rows gives each the result it would get alone, at a fraction of
        # the Python iterations.
        # Rows stack only when they share a scheme too (--scheme-override may split q/k/v).
        shared: dict[tuple[str, QuantScheme], list[str]] = {}
        for name in step:
            if sink.alias.get(name, name) not in sink.hessians:
                # An expert the router sent no calibration token: round to nearest.
                apply_result(layer, name, rtn_quantize(layer_linear(layer, name).weight.data,
                                                       cfg_of(name).scheme, name=prefix + name),
                             packed)
                losses[name] = None
                continue
            shared.setdefault((sink.alias.get(name, name), cfg_of(name).scheme), []).append(name)
        batches = list(shared.values())
        left = Counter(input_owner for input_owner, _ in shared)  # batches per Hessian
        linears = {n: layer_linear(layer, n) for b in batches for n in b}
        owners = dist.owners([linears[b[0]].in_features ** 2 * sum(linears[n].out_features
                                                                    for n in b) for b in batches])
        for (input_owner, _), names, owner in zip(shared, batches, owners, strict=True):
            stacked = torch.cat([linears[n].weight.data for n in names]) if len(names) > 1 \
                else linears[names[0]].weight.data
            result = None
            batch_cfg = cfg_of(names[0])
            if owner == dist.rank:
                result = gptq_quantize(stacked, sink.hessian(names[0]), batch_cfg,
                                       name=f"{prefix}{'+'.join(names)}", with_loss=False,
                                       asymmetry=sink.asymmetry(names[0]))
            result = _share_result(result, stacked, batch_cfg, owner, dist)
            start = 0
            for name in names:
                rows = linears[name].out_features
                part = _rows(result, start, start + rows)
                float_weight = linears[name].weight.data
                new = apply_result(layer, name, part, packed)
                # The weight the layer now computes with (a packed layer's scales are float16):
                # it scores the loss, and the packed layer's forward reuses it for the next
                # steps' calibration passes instead of unpacking its codes again.
                dense = grid.dequantize_grouped(
                    part.codes, part.scales.to(new.scales.dtype) if isinstance(new, QuantLinear)
                    else part.scales, part.zeros, part.g_idx).to(float_weight.dtype)
                if isinstance(new, QuantLinear):
                    if float_weight.numel() < PRIME_BELOW:
                        prime_reference(new, dense)
                    else:
                        # issue 36: a float copy per big linear would add up to the layer's
                        # float weights again while its later Hessians are factorised; it
                        # dequantizes its codes (the same values) at each later pass instead.
                        new.cache_dequantized = False
                part.loss = hessian_loss(float_weight, dense, sink.hessian(name).float())
                losses[name] = part.loss
                start += rows
            # issue 36: this Hessian (in_features^2 floats) is done once no batch of another
            # scheme still reads it; free it before the next.
            left[input_owner] -= 1
            if not left[input_owner]:
                sink.release(input_owner)
            del stacked, result
        del sink
    return losses


def _rows(result: QuantResult, start: int, stop: int) -> QuantResult:
    """The output rows [start, stop) of a stacked result (scales/zeros are [groups, out])."""
    if start == 0 and stop == result.codes.shape[0]:
        return result  # one linear alone: no copy of its codes
    return QuantResult(result.codes[start:stop].contiguous(),
                       result.scales[:, start:stop].contiguous(),
                       result.zeros[:, start:stop].contiguous(), result.g_idx, result.scheme)


def _reduce_hessians(sink: HessianSink, dist: DistContext) -> None:
    """Running-mean Hessians of every rank's shard -> the Hessian of all windows."""
    if not dist.active:
        return
    for owner in sorted(sink.hessians):
        n = torch.tensor([float(sink.counts[owner])], dtype=torch.float64)
        dist.all_reduce_sum(n)
        for stats in sink.statistics():  # every rank holds the same owners, in this order
            total = stats[owner].mul_(sink.counts[owner])
            dist.all_reduce_sum(total)
            stats[owner] = total.div_(float(n.item()))
        sink.counts[owner] = int(n.item())


def _share_result(result: QuantResult | None, weight: torch.Tensor, cfg: GPTQConfig, owner: int,
                  dist: DistContext) -> QuantResult:
    """The owner's result on every rank (broadcast tensor by tensor, in a fixed protocol)."""
    if not dist.active:
        assert result is not None
        return result
    out_f, in_f = weight.shape
    groups = cfg.scheme.groups_for(in_f)
    shapes = {"codes": (out_f, in_f), "scales": (groups, out_f), "zeros": (groups, out_f),
              "g_idx": (in_f,)}
    dtypes = {"codes": torch.int32, "scales": torch.float32, "zeros": torch.int32,
              "g_idx": torch.int32}
    parts = {}
    for key, shape in shapes.items():
        t = (getattr(result, key).detach().cpu().to(dtypes[key]).contiguous() if result is not None
             else torch.empty(shape, dtype=dtypes[key]))
        parts[key] = dist.broadcast(t, owner).to(weight.device)
    loss = torch.tensor([float("nan") if result is None or result.loss is None else result.loss],
                        dtype=torch.float64)
    dist.broadcast(loss, owner)
    value = float(loss.item())
    return QuantResult(parts["codes"], parts["scales"], parts["zeros"], parts["g_idx"], cfg.scheme,
                       None if value != value else value)


def run_gptq(model: nn.Module, cfg: GPTQConfig, calib: torch.Tensor | None,
             opts: RunOptions) -> dict[str, float | None]:
    """Quantize every linear of the model's ArchSpec with GPTQ; returns per-linear losses."""
    return run_hessian_method("gptq", model, cfg, calib, opts)


def run_hessian_method(
    method: str, model: nn.Module, cfg: GPTQConfig, calib: torch.Tensor | None, opts: RunOptions,
    new_sink: Callable[[tuple[str, ...]], HessianSink] = HessianSink,
    reference_stream: bool = False,
) -> dict[str, float | None]:
    """GPTQ's layer-by-layer run with `new_sink` collecting each step's statistics; with
    `reference_stream` the driver carries the float model's stream beside (GPTAQ)."""
    if calib is None or calib.numel() == 0:
        raise ConfigError(f"{method.upper()} needs calibration token ids; pass --calib with "
                          "--nsamples > 0")
    dist = opts.dist
    if calib.shape[0] < dist.world:
        raise ConfigError(f"{calib.shape[0]} calibration windows cannot be shared by "
                          f"{dist.world} processes; use --nsamples >= {dist.world}")
    arch: ArchSpec = arch_for(model)
    store = DTYPES[cfg.act_dtype]
    model_dtype = next(model.parameters()).dtype

    def one_layer(index: int, layer: nn.Module, inputs: LayerInputs) -> dict[str, Any]:
        spec = layer_spec(arch, index, opts.selection)
        steps = spec.sequential if cfg.true_sequential else (spec.linear_names,)
        calibrate_experts(layer, opts.selection.moe_all_experts)
        if inputs.reference is not None:
            calibrate_experts(inputs.reference.layer, opts.selection.moe_all_experts)
        prefix = f"{arch.layers_path}.{index}."
        losses = quantize_layer_gptq(layer, inputs, steps, cfg, prefix,
                                     opts.device, opts.packed, dist, spec.attention,
                                     spec.attention_norm,
                                     lambda name: opts.selection.scheme_of(prefix + name,
                                                                           cfg.scheme),
                                     new_sink)
        finish_experts(layer)
        if inputs.reference is not None:
            finish_experts(inputs.reference.layer)
        if dist.is_main:
            opts.log(f"{method} layer {index}: " + ", ".join(
                f"{n.rsplit('.', 1)[-1]}={v:.4g}" for n, v in losses.items() if v is not None))
        return losses

    with torch.no_grad():
        logs = sequential_quantize(
            model, arch, dist.shard(calib), one_layer, device=opts.device, batch_size=CALIB_BATCH,
            progress=opts.progress and dist.is_main, desc=method, work_dir=opts.work_dir,
            resume=opts.resume,
            fingerprint=(resume_fingerprint(method, model, cfg, calib, opts.packed)
                         + f"-x{dist.world}" + selection_tag(opts.selection)),
            store_dtype=None if store == model_dtype else store,
            weights=DiskWeights(opts.weights_dir) if opts.weights_dir is not None else None,
            dist=dist, max_memory=opts.max_memory,  # issue 36: activation budget
            reference_stream=reference_stream,
        )
    return {f"{arch.layers_path}.{index}.{name}": loss
            for index, per_layer in logs.items() for name, loss in per_layer.items()}


def checkpoint_fields(cfg: GPTQConfig) -> dict[str, Any]:
    return {"desc_act": cfg.desc_act, "damp_percent": cfg.damp_percent,
            "static_groups": cfg.static_groups, "true_sequential": cfg.true_sequential}


def option_rules(options: Any) -> None:
    if options.desc_act and options.format == "awq":
        raise ValueError("--desc-act (act-order) cannot be stored in --format awq (the AWQ "
                         "layout has no g_idx); drop --desc-act or use --format gptq")


FLAGS = (
    MethodFlag("desc_act", "desc_act", "GPTQ act-order"),
    MethodFlag("static_groups", "static_groups", "GPTQ: precompute group grids"),
    MethodFlag("damp", "damp_percent", "GPTQ damp_percent", value_type=float, default=0.01,
               schema=Annotated[float, Field(gt=0, lt=1, description="a fraction in (0, 1)",
                                             examples=[0.01])]),
    MethodFlag("mse_clip", "mse_clip", "GPTQ: MSE clip search on the grid"),
    MethodFlag("imatrix_clip", "imatrix_clip", "GPTQ: the clip search with each input "
               "channel's error weighted by its calibration energy E[x^2] (diag H; llama.cpp's "
               "imatrix); implies --mse-clip"),
)

METHOD = QuantMethod("gptq", GPTQConfig, True, run_gptq, checkpoint_fields, FLAGS, option_rules)
