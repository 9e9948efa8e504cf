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

from qcal.errors import ConfigError
from qcal.model.adapters import (
    LinearizedExperts,
    adapt_modules,
    is_conv1d,
    is_fused_experts,
    iter_adaptable,
)
from qcal.model.arch import ArchSpec, ScaleGroup
from qcal.model.fold import fold_into
from qcal.model.probe import Trace, layer_output, relative_error, trace_layer
from qcal.model.twin import build_twin, layer0_inputs
from qcal.module_tree import get_module
from qcal.packing.qlinear import QuantLinear


class UnsupportedArchitecture(ConfigError):
    """The model's structure cannot be quantized exactly by qcal."""


# Linear -> linear pairs an AWQ scale may fold across (same parent module), which hooks
# cannot see because an op (the attention core, act(gate) * up) lies between them. Each is
# kept only if the fold probe finds it exact.
PAIRS = (("v_proj", "o_proj"), ("up_proj", "down_proj"), ("w3", "w2"))
# Linears whose outputs meet in the softmax: AWQ leaves them unclipped, as the reference does.
CLIP_SKIP_LEAVES = ("q_proj", "k_proj", "query", "key", "qkv_proj", "query_key_value", "Wqkv",
                    "c_attn")
EXACT = 1e-4  # relative output change a fold may cause by rounding alone (float64 probe)


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


def _is_norm(module: nn.Module) -> bool:
    weight = getattr(module, "weight", None)
    return (not isinstance(module, nn.Linear) and isinstance(weight, torch.Tensor)
            and weight.dim() == 1 and all(p.dim() == 1 for p in module.parameters()))


@torch.no_grad()
def _norm_offset(norm: nn.Module) -> float | None:
    """0 for y = w * n(x), 1 for y = (1 + w) * n(x), None for anything else."""
    probe = copy.deepcopy(norm).double()
    x = torch.randn(2, 3, probe.weight.shape[0], dtype=torch.float64, generator=torch.Generator()
                    .manual_seed(1))
    if getattr(probe, "bias", None) is not None:
        probe.bias.zero_()
    probe.weight.zero_()
    zero = probe(x)
    probe.weight.fill_(1.0)
    one = probe(x)
    if float(zero.abs().max()) < 1e-12 and float(one.abs().max()) > 0:
        return 0.0
    if relative_error(one, 2 * zero) < 1e-9:
        return 1.0
    return None


def _is_attention(module: nn.Module) -> bool:
    name = type(module).__name__
    return "Attention" in name or "Attn" in name


def _parent(name: str) -> str:
    return name.rpartition(".")[0]


def _common_parent(names: tuple[str, ...]) -> str:
    parts = [_parent(n).split(".") for n in names]
    common: list[str] = []
    for level in zip(*parts, strict=False):
        if len(set(level)) != 1:
            break
        common.append(level[0])
    return ".".join(common)


def _normalize_expert(name: str) -> str:
    return re.sub(r"experts\.\d+\.", "experts.*.", name)


class _Resolver:
    def __init__(self, layer: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                 model_type: str) -> None:
        self.layer, self.args, self.kwargs, self.model_type = layer, args, kwargs, model_type
        for m in layer.modules():
            if isinstance(m, LinearizedExperts):
                m.route_all = True  # the probe must reach every expert
        self.trace: Trace = trace_layer(layer, args, kwargs)
        for m in layer.modules():
            if isinstance(m, LinearizedExperts):
                m.route_all = False
        self.reference = layer_output(layer, args, kwargs)
        self.skipped: list[str] = []

    def linears(self) -> tuple[list[str], list[str]]:
        """(quantizable linears in first-use order, linears kept float: routers, gates)."""
        ordered, ignored = [], []
        experts = {n for n, m in self.layer.named_modules() if isinstance(m, LinearizedExperts)}
        for name, module in self.layer.named_modules():
            if not isinstance(module, nn.Linear):
                continue
            in_moe = any(_parent(e) == _parent(name) for e in experts)
            if module.out_features == 1 or (in_moe and not name.startswith(tuple(experts))):
                ignored.append(name)  # a router or a shared-expert gate: float by default
                continue
            if name not in self.trace.calls:
                raise UnsupportedArchitecture(
                    f"{name} of model type {self.model_type!r} never runs in a forward pass; "
                    "qcal cannot calibrate it (add an override that ignores it)")
            ordered.append(name)
        ordered.sort(key=lambda n: self.trace.calls[n].order)
        return ordered, ignored

    def steps(self, linears: list[str]) -> tuple[tuple[str, ...], ...]:
        by_input: dict[Any, list[str]] = {}
        for name in linears:
            by_input.setdefault(self.trace.calls[name].input or name, []).append(name)
        merged: dict[tuple[str, ...], list[str]] = {}
        for group in by_input.values():
            sig = tuple(sorted({_normalize_expert(n) for n in group}))
            merged.setdefault(sig, []).extend(group)
        return tuple(tuple(step) for step in merged.values())

    def _fold_is_exact(self, group: ScaleGroup, offset: float) -> bool:
        twin = copy.deepcopy(self.layer)
        prev = get_module(twin, group.prev_op)
        width = prev.out_features if isinstance(prev, nn.Linear) else prev.weight.shape[0]
        s = torch.empty(width, dtype=torch.float64).uniform_(
            0.5, 2.0, generator=torch.Generator().manual_seed(2))
        fold_into(prev, [get_module(twin, n) for n in group.linears], s, offset)
        return relative_error(layer_output(twin, self.args, self.kwargs), self.reference) < EXACT

    def _block(self, linears: tuple[str, ...], key: Any) -> tuple[str, bool]:
        """The module whose output error scores a scale: the linears' closest common parent
        if it takes exactly their input, else a lone linear itself, else the linears."""
        parent = _common_parent(linears)
        call = self.trace.calls.get(parent)
        if parent and call is not None and call.input == key:
            return parent, not _is_attention(get_module(self.layer, parent))
        if len(linears) == 1:
            return linears[0], True
        return "", True

    def scale_groups(self, steps: tuple[tuple[str, ...], ...], linears: list[str]
                     ) -> tuple[tuple[ScaleGroup, ...], float]:
        offsets: dict[str, float | None] = {}
        candidates: list[tuple[int, ScaleGroup]] = []
        for step in steps:
            key = self.trace.calls[step[0]].input
            producer = self.trace.producer_of(key)
            if producer is None:
                continue
            prev = get_module(self.layer, producer)
            if not _is_norm(prev):
                continue
            members = tuple(n for n in step if self.trace.calls[n].input == key)
            block, token_wise = self._block(members, key)
            offsets.setdefault(producer, _norm_offset(prev))
            candidates.append((self.trace.calls[members[0]].order,
                               ScaleGroup(producer, members, block, token_wise)))
        known = set(linears)
        for name in linears:
            for prev_leaf, next_leaf in PAIRS:
                if not name.endswith("." + prev_leaf):
                    continue
                nxt = name[: -len(prev_leaf)] + next_leaf
                if nxt not in known:
                    continue
                prev_m, next_m = get_module(self.layer, name), get_module(self.layer, nxt)
                if prev_m.out_features != next_m.in_features:
                    self.skipped.append(f"{name} -> {nxt}: widths differ (grouped-query attention)")
                    continue
                candidates.append((self.trace.calls[nxt].order, ScaleGroup(name, (nxt,), nxt, True)))
        found = [o for o in offsets.values() if o is not None]
        offset = max(set(found), key=found.count) if found else 0.0
        groups = []
        for _, group in sorted(candidates, key=lambda c: c[0]):
            if group.prev_op in offsets and offsets[group.prev_op] != offset:
                self.skipped.append(f"{group.prev_op}: its weight does not scale as w or 1 + w")
            elif not self._fold_is_exact(group, offset):
                self.skipped.append(f"{group.prev_op} -> {', '.join(group.linears)}: folding a "
                                    "scale there changes the layer's output")
            else:
                groups.append(group)
        return tuple(groups), offset

    def attention(self, steps: tuple[tuple[str, ...], ...]
                  ) -> tuple[tuple[str, str] | None, str | None]:
        for name, module in self.layer.named_modules():
            if not name or not _is_attention(module) or name not in self.trace.calls:
                continue
            call = self.trace.calls[name]
            outs = [n for n in self.trace.calls if n.startswith(name + ".")
                    and self.trace.calls[n].output == call.output
                    and isinstance(get_module(self.layer, n), nn.Linear)]
            if not outs:
                return None, None
            norm = self.trace.producer_of(call.input)
            readers = [r for r in self.trace.readers_of(call.input)
                       if r != name and not r.startswith(name + ".")]
            if norm is None or readers or not _is_norm(get_module(self.layer, norm)) \
                    or not self._replay_is_exact(name, norm):
                norm = None
            return (name, outs[0]), norm
        return None, None

    def _replay_is_exact(self, attention: str, norm: str) -> bool:
        """The layer with the norm returning zeros and the attention block returning its
        recorded output computes the same: what AttentionReplay does."""
        twin = copy.deepcopy(self.layer)
        block, norm_m = get_module(twin, attention), get_module(twin, norm)
        recorded: dict[str, Any] = {}
        block.register_forward_hook(lambda m, a, o: recorded.setdefault("out", o))
        layer_output(twin, self.args, self.kwargs)
        block.forward = lambda *a, **k: recorded["out"]
        norm_m.forward = lambda x: torch.zeros_like(x)
        return relative_error(layer_output(twin, self.args, self.kwargs), self.reference) < EXACT


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
    r = _Resolver(layers[0], args, kwargs, model_type)
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
