"""Architectures found, not listed: an `ArchSpec` resolved from the model itself.

From the model's config, a one-layer twin with random weights is built (never the real
weights: resolution costs one layer of memory, whatever the depth) and its decoder layer
is run once with hooks (qcal.model.probe). From that trace:

- the decoder layers are the `ModuleList` of the model's `_no_split_modules` blocks;
- the quantizable linears are the layer's `nn.Linear`s, transformers' `Conv1D`s and the
  experts of fused MoE modules (both re-expressed as linears, qcal.model.adapters, and
  checked to compute the same function); routers and 1-wide gates stay float;
- true-sequential steps are the linears fed the very same tensor, in first-use order
  (every expert's linears of one kind form one step);
- AWQ scale groups are a norm and the linears reading its output (found by data flow), and
  linear -> linear pairs that hooks cannot see (v -> o, up -> down: `PAIRS`, data). Each
  candidate is *folded on the twin with a random scale* and kept only if the layer's output
  is unchanged: a post-norm, a parallel-residual block or a nonlinearity in between cannot
  absorb a scale exactly, and is skipped with the reason instead of folded wrongly;
- a norm multiplies by (1 + w) (Gemma) when a zero weight does not zero its output;
- the attention block, its output linear (GPTQ replays the attention core) and the norm
  only it reads are taken only when replaying them gives the same layer output;
- the prelude is what ran before layer 0 (embeddings, rotary tables).

Anything that cannot be resolved exactly raises `UnsupportedArchitecture` (one line naming
the module and the model type). Per-`model_type` overrides (`OVERRIDES`) replace resolved
fields, as data.

This file builds the twin, finds the decoder layers, re-expresses and checks the adapted
modules and assembles the `ArchSpec`; the probes of layer 0 (linears, steps, scale groups,
attention) are `LayerResolver` in qcal.model.layer_resolver.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import re
from typing import Any

import torch
from torch import nn

from qcal.model.adapters import (
    LinearizedExperts,
    adapt_modules,
    is_conv1d,
    is_fused_experts,
    iter_adaptable,
)
from qcal.model.arch import ArchSpec
from qcal.model.layer_resolver import LayerResolver, UnsupportedArchitecture
from qcal.model.probe import relative_error
from qcal.model.twin import build_twin, layer0_inputs
from qcal.module_tree import get_module
from qcal.packing.qlinear import QuantLinear

# Linears whose outputs meet in the softmax: AWQ leaves them unclipped, as the reference does.
CLIP_SKIP_LEAVES = ("q_proj", "k_proj", "query", "key", "qkv_proj", "query_key_value", "Wqkv",
                    "c_attn")


def _layers_path(model: nn.Module, model_type: str) -> str:
    blocks = set(getattr(model, "_no_split_modules", None) or ())
    lists = [(name, m) for name, m in model.named_modules()
             if isinstance(m, nn.ModuleList) and len(m) > 0]
    chosen = [name for name, m in lists if blocks and all(type(c).__name__ in blocks for c in m)]
    if len(chosen) != 1:
        raise UnsupportedArchitecture(
            f"cannot find the decoder layers of model type {model_type!r}: "
            f"{len(chosen)} module lists hold its blocks {sorted(blocks)}; add an override "
            "to qcal.model.resolve.OVERRIDES")
    return chosen[0]


def _signature(layer: nn.Module) -> tuple[Any, ...]:
    """A layer's structure, with re-expressed modules (qcal.model.adapters) described as the
    originals they compute, so an adapted layer matches one not adapted yet."""
    out: list[Any] = []
    skip: tuple[str, ...] = ()
    for name, m in layer.named_modules():
        if skip and name.startswith(skip):
            continue
        if is_conv1d(m) or isinstance(m, (nn.Linear, QuantLinear)):
            # A quantized layer matches a float one: resolution may run mid-quantization.
            shape = ((m.nf, m.nx) if is_conv1d(m) else (m.out_features, m.in_features))
            out.append((name, "linear", shape, getattr(m, "bias", None) is not None))
        elif is_fused_experts(m):
            out.append((name, "experts", tuple(m.gate_up_proj.shape)))
            skip = tuple(f"{name}.{p}" for p in ("gate_up_proj", "down_proj"))
        elif isinstance(m, LinearizedExperts):
            e = m[0]
            out.append((name, "experts", (len(m), 2 * e.gate_proj.out_features,
                                          e.gate_proj.in_features)))
            skip = (name + ".",)
        else:
            out.append((name, type(m).__name__,
                        tuple(tuple(p.shape) for p in m.parameters(recurse=False))))
    return tuple(out)


@functools.lru_cache(maxsize=16)
def _resolve_cached(config_json: str, config_cls: type) -> ArchSpec:
    # A config class outside transformers comes from the model's own code, which already ran
    # (with the user's --trust-remote-code) to build the model being resolved.
    from transformers import CONFIG_MAPPING

    config = config_cls.from_dict(json.loads(config_json))
    builtin = getattr(config, "model_type", None) in CONFIG_MAPPING
    return _resolve(config, trust_remote_code=not builtin)


def _resolve(config: Any, trust_remote_code: bool, shrink: bool = True) -> ArchSpec:
    model_type = str(getattr(config, "model_type", "?"))
    try:
        twin = build_twin(config, trust_remote_code, shrink)
    except Exception as err:  # transformers cannot build this class at all
        raise UnsupportedArchitecture(
            f"cannot build model type {model_type!r} to resolve its architecture "
            f"({type(err).__name__}: {str(err).splitlines()[0][:120]})") from None
    path = _layers_path(twin, model_type)
    layers = get_module(twin, path)
    originals = {name: copy.deepcopy(m) for name, m in iter_adaptable(layers[0])}
    adapted = tuple(adapt_modules(layers[0]))
    _check_adapters(layers[0], originals, model_type)
    reached = layer0_inputs(twin, layers)
    if reached is None:
        raise UnsupportedArchitecture("the model's forward never reached its first decoder layer")
    args, kwargs, prelude = reached
    r = LayerResolver(layers[0], args, kwargs, model_type)
    linears, ignored = r.linears()
    if not linears:
        raise UnsupportedArchitecture(f"decoder layers of model type {model_type!r} hold no "
                                      "linear qcal can quantize")
    steps = r.steps(linears)
    groups, offset = r.scale_groups(steps, linears)
    attention, attention_norm = r.attention(steps)
    clip_skip = tuple(n for n in linears if n.rsplit(".", 1)[-1] in CLIP_SKIP_LEAVES
                      and attention is not None and n.startswith(attention[0] + "."))
    return ArchSpec(
        layers_path=path, sequential=steps, scale_groups=groups, norm_offset=offset,
        awq_clip_skip=clip_skip, attention=attention, attention_norm=attention_norm,
        prelude_modules=tuple(prelude), model_type=model_type, adapted=adapted,
        float_linears=tuple(ignored), skipped=tuple(r.skipped))


@torch.no_grad()
def _check_adapters(layer: nn.Module, originals: dict[str, nn.Module], model_type: str) -> None:
    """Each re-expressed module of `layer` computes what its original (a copy taken before
    the re-expression) did."""
    for name, original in originals.items():
        new = get_module(layer, name)
        gen = torch.Generator().manual_seed(3)
        if is_fused_experts(original):
            n, _, hidden = original.gate_up_proj.shape
            x = torch.randn(12, hidden, dtype=torch.float64, generator=gen)
            idx = torch.stack([torch.randperm(n, generator=gen)[:min(2, n)] for _ in range(12)])
            w = torch.rand(12, idx.shape[1], dtype=torch.float64, generator=gen)
            same = relative_error(new(x, idx, w), original(x, idx, w)) < 1e-9
        else:
            x = torch.randn(3, 5, new.in_features, dtype=torch.float64, generator=gen)
            same = relative_error(new(x), original(x)) < 1e-9
        if not same:
            raise UnsupportedArchitecture(
                f"{name} ({type(original).__name__}) of model type {model_type!r} cannot be "
                "re-expressed as linears exactly")


OVERRIDES: dict[str, dict[str, Any]] = {}


def resolve_arch(model: nn.Module) -> ArchSpec:
    """The ArchSpec of `model` (resolved once per config, keyed by its JSON; `OVERRIDES`
    applied), after checking that every decoder layer has layer 0's structure."""
    config = model.config
    # Keyed by the architecture alone: the same config read from another folder (a skeleton,
    # then the loaded model; a checkpoint's source) is not resolved again.
    raw = config.to_dict()
    raw.pop("_name_or_path", None)
    spec = _resolve_cached(json.dumps(raw, sort_keys=True, default=str), type(config))
    layers = get_module(model, spec.layers_path)
    first = _signature(layers[0])
    for index, layer in enumerate(layers):
        if _signature(layer) != first:
            raise UnsupportedArchitecture(
                f"decoder layer {index} of model type {spec.model_type!r} is built differently "
                "from layer 0; qcal quantizes models whose layers share one structure")
    override = OVERRIDES.get(spec.model_type)
    return dataclasses.replace(spec, **override) if override else spec


def shared_input_of(spec: ArchSpec) -> dict[str, str]:
    """Linear -> the first linear of its step that reads the same input: a step's linears
    share one input, except MoE experts, which each read their own routed tokens."""
    out: dict[str, str] = {}
    for step in spec.sequential:
        first: dict[str | None, str] = {}
        for name in step:
            expert = re.search(r"experts\.(\d+)\.", name)
            out[name] = first.setdefault(expert.group(1) if expert else None, name)
    return out


def arch_for(model: nn.Module) -> ArchSpec:
    """The model's resolved ArchSpec, with the layer modules it names re-expressed as linears
    in place (Conv1D, fused experts: the same function, qcal.model.adapters), so that every
    quantizer and loader sees the linears the spec lists. Idempotent."""
    spec = resolve_arch(model)
    if spec.adapted:
        for layer in get_module(model, spec.layers_path):
            adapt_modules(layer, spec.adapted)
    return spec
