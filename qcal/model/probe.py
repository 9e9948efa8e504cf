"""One instrumented forward pass of a decoder layer: who read what, who produced what.

The architecture resolver (qcal.model.resolve) runs a random-weight copy of decoder
layer 0 once with hooks on every submodule and reads the data flow from it: which
linears are fed the very same tensor (a true-sequential step), which module produced
that tensor (the op an AWQ scale folds into), in which order modules ran. Tensors are
compared by what they hold, not by Python identity: a `view` of a norm's output (as an
MoE block hands its experts) is the same data, so two tensors match when they share
storage, offset, element count and dtype and both are contiguous.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

TensorKey = tuple[int, int, int, torch.dtype]


def tensor_key(t: torch.Tensor) -> TensorKey | None:
    if not isinstance(t, torch.Tensor) or not t.is_contiguous():
        return None
    return (t.untyped_storage().data_ptr(), t.storage_offset(), t.numel(), t.dtype)


def first_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)) and value and isinstance(value[0], torch.Tensor):
        return value[0]
    return None


@dataclasses.dataclass
class Call:
    """One forward call of a submodule: its name, input key and output key."""

    name: str
    order: int
    input: TensorKey | None
    output: TensorKey | None = None


@dataclasses.dataclass
class Trace:
    """Every submodule call of one layer forward, in call order (first call per module)."""

    calls: dict[str, Call]
    output: torch.Tensor
    keep: list[torch.Tensor]  # holds every traced tensor so no storage address is reused

    def producer_of(self, key: TensorKey | None) -> str | None:
        """The first module whose output is `key`'s data (None: made by a plain op)."""
        if key is None:
            return None
        found = [c for c in self.calls.values() if c.output == key]
        return min(found, key=lambda c: c.order).name if found else None

    def readers_of(self, key: TensorKey | None) -> list[str]:
        return [c.name for c in sorted(self.calls.values(), key=lambda c: c.order)
                if key is not None and c.input == key]


def layer_output(layer: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
    out = layer(*args, **kwargs)
    tensor = first_tensor(out)
    assert tensor is not None, "a decoder layer returns its hidden states"
    return tensor


@torch.no_grad()
def trace_layer(layer: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Trace:
    """Run `layer(*args, **kwargs)` once, recording each submodule's first call."""
    calls: dict[str, Call] = {}
    keep: list[torch.Tensor] = []
    handles = []

    def pre(name: str):
        def hook(module: nn.Module, a: tuple[Any, ...], kw: dict[str, Any]) -> None:
            if name in calls:
                return
            x = a[0] if a and isinstance(a[0], torch.Tensor) else kw.get("hidden_states")
            if isinstance(x, torch.Tensor):
                keep.append(x)
            calls[name] = Call(name, len(calls), tensor_key(x) if isinstance(x, torch.Tensor)
                               else None)
        return hook

    def post(name: str):
        def hook(module: nn.Module, a: Any, kw: Any, out: Any) -> None:
            call = calls.get(name)
            y = first_tensor(out)
            if call is not None and call.output is None and y is not None:
                keep.append(y)
                call.output = tensor_key(y)
        return hook

    for name, module in layer.named_modules():
        if name:
            handles.append(module.register_forward_pre_hook(pre(name), with_kwargs=True))
            handles.append(module.register_forward_hook(post(name), with_kwargs=True))
    try:
        output = layer_output(layer, args, kwargs)
    finally:
        for h in handles:
            h.remove()
    return Trace(calls, output, keep)


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp(min=1e-30))
