"""The probes that resolve one decoder layer: `LayerResolver` traces layer 0 of the model's
random-weight twin once (qcal.model.probe) and reads from the trace which linears are
quantized, which share an input (true-sequential steps), which norm or linear an AWQ scale
folds into, and which block is the attention GPTQ may replay. Every fold and replay
candidate is tried on a copy of the layer and kept only if the layer's output is unchanged.

Assembling the model's `ArchSpec` from these answers (decoder layers, adapters, overrides)
is qcal.model.resolve.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import torch
from torch import nn

from qcal.errors import ConfigError
from qcal.model.adapters import LinearizedExperts
from qcal.model.arch import ScaleGroup
from qcal.model.fold import fold_into
from qcal.model.probe import Trace, layer_output, relative_error, trace_layer
from qcal.module_tree import get_module


class UnsupportedArchitecture(ConfigError):
    """The model's structure cannot be quantized exactly by qcal."""


# Linear -> linear pairs an AWQ scale may fold across (same parent module), which hooks
# cannot see because an op (the attention core, act(gate) * up) lies between them. Each is
# kept only if the fold probe finds it exact.
PAIRS = (("v_proj", "o_proj"), ("up_proj", "down_proj"), ("w3", "w2"))
EXACT = 1e-4  # relative output change a fold may cause by rounding alone (float64 probe)


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


class LayerResolver:
    """Decoder layer 0 of the twin, traced once on its real inputs: its linears, sequential
    steps, AWQ scale groups and attention block, each fold or replay kept only when probing
    the twin shows it exact; what is left out is recorded in `skipped` with its reason."""

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
