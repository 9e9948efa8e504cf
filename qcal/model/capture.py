"""Hooks that capture what flows into decoder layers and linears.

Capturing layer-0 inputs runs the model's embedding/rotary prelude once, with every
decoder layer standing in as a recorder that computes nothing, and stops at the last
one: nothing past the prelude is computed. The recorders also collect the keyword inputs
of every layer, because they need not be layer 0's: Gemma3's global layers get their own
causal mask and rotary table (theta 1M), its sliding-window layers a windowed mask and
theta 10k.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

import torch
from torch import nn

from qcal.model.arch import ArchSpec, decoder_layers, get_module


class _StopForward(Exception):
    """Raised inside layer 0's pre-hook to abandon the rest of the forward pass."""


@dataclasses.dataclass
class ReferenceStream:
    """What the *float* model feeds a decoder layer, beside what the partly quantized model
    feeds it (GPTAQ fits the quantized layer to the float one): the layer's float copy,
    taken before the method changes it, and the float model's hidden states per batch.
    The keyword inputs (masks, rotary tables) are the same for both streams."""

    layer: nn.Module
    hidden: list[torch.Tensor]


@dataclasses.dataclass
class LayerInputs:
    """Per-batch hidden states entering a decoder layer, and the keyword arguments
    (rotary embeddings, masks, positions) the model passed alongside them."""

    hidden: list[torch.Tensor]
    kwargs: list[dict[str, Any]]
    # Per decoder layer, then per batch, when layers get different keyword inputs (Gemma3);
    # None when every layer gets `kwargs` (Llama-like models).
    layer_kwargs: list[list[dict[str, Any]]] | None = None
    # The float model's stream, for methods that ask the driver to carry it.
    reference: ReferenceStream | None = None

    def for_layer(self, index: int) -> LayerInputs:
        """These hidden states with the keyword inputs decoder layer `index` receives."""
        if self.layer_kwargs is None:
            return self
        return LayerInputs(self.hidden, self.layer_kwargs[index], self.layer_kwargs,
                           self.reference)

    def batch(self, index: int, reference: bool = False) -> LayerInputs:
        """Batch `index` alone (of the float stream when `reference`)."""
        if reference and self.reference is None:
            raise ValueError("these inputs carry no float reference stream")
        hidden = self.reference.hidden if reference and self.reference else self.hidden
        return LayerInputs([hidden[index]], [self.kwargs[index]])

    @property
    def n_tokens(self) -> int:
        return sum(h.shape[0] * h.shape[1] for h in self.hidden)


def _detach_kwargs(kwargs: dict[str, Any], device: torch.device | str,
                   memo: dict[int, tuple[Any, Any]] | None = None) -> dict[str, Any]:
    """Keyword inputs detached onto `device`; `memo` (by object identity) stores a mask or
    rotary table that several layers share only once."""
    out: dict[str, Any] = {}
    for key, value in kwargs.items():
        if key in {"past_key_values", "past_key_value", "cache", "use_cache", "output_attentions"}:
            continue  # caches would keep growing across calibration batches
        if memo is not None and id(value) in memo:
            out[key] = memo[id(value)][1]
            continue
        original = value
        if isinstance(value, torch.Tensor):
            value = value.detach().to(device)
        elif isinstance(value, tuple) and all(isinstance(v, torch.Tensor) for v in value):
            value = tuple(v.detach().to(device) for v in value)
        if memo is not None:
            memo[id(original)] = (original, value)  # keeps `original` alive: ids stay unique
        out[key] = value
    return out


def _same_inputs(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.keys() == b.keys() and all(a[k] is b[k] for k in a)


@torch.no_grad()
def capture_layer0_inputs(
    model: nn.Module, arch: ArchSpec, calib_ids: torch.Tensor, batch_size: int = 8,
    device: str | torch.device = "cpu", store_dtype: torch.dtype | None = None,
) -> LayerInputs:
    """Inputs of decoder layer 0 for every calibration batch (kept on CPU), with the keyword
    inputs of every layer (`LayerInputs.for_layer`).

    Only the ArchSpec's prelude modules (embeddings, rotary tables) visit `device`, and
    they return to where they were: the decoder layers never leave their home here, and
    never run (their forward is replaced by a recorder for the duration)."""
    layers = decoder_layers(model, arch)
    captured = LayerInputs([], [])
    per_layer: list[list[dict[str, Any]]] = [[] for _ in layers]
    memo: dict[int, tuple[Any, Any]] = {}

    def record(index: int, *args: Any, **kwargs: Any) -> Any:
        hidden = args[0] if args else kwargs.pop("hidden_states")
        if index == 0:
            captured.hidden.append(hidden.detach().to("cpu", store_dtype or hidden.dtype))
        per_layer[index].append(_detach_kwargs(kwargs, "cpu", memo))
        if index == len(layers) - 1:
            raise _StopForward  # the final norm and the LM head are not needed
        return hidden  # later layers only need their keyword inputs recorded

    prelude = prelude_on(model, arch, device)
    try:
        for index, layer in enumerate(layers):
            # An instance attribute shadows the class's forward; the module (and attributes
            # the model reads off it, e.g. attention_type) stays in place.
            layer.forward = functools.partial(record, index)
        for start in range(0, calib_ids.shape[0], batch_size):
            batch = calib_ids[start:start + batch_size].to(device)
            memo.clear()
            with suppress(_StopForward):
                model(input_ids=batch, use_cache=False)
    finally:
        for layer in layers:
            layer.__dict__.pop("forward", None)
        for module, home in prelude:
            module.to(home)
    captured.kwargs = per_layer[0]
    # A layer the model did not call (fewer than len(layers) configured) gets layer 0's.
    per_layer = [kw if len(kw) == len(captured.kwargs) else captured.kwargs for kw in per_layer]
    if any(not _same_inputs(a, b) for kws in per_layer[1:]
           for a, b in zip(kws, captured.kwargs, strict=True)):
        captured.layer_kwargs = per_layer
    return captured


def prelude_on(model: nn.Module, arch: ArchSpec, device: str | torch.device
               ) -> list[tuple[nn.Module, torch.device]]:
    """Move the prelude modules to `device`; returns (module, previous device) to undo it."""
    moved = []
    for name in arch.prelude_modules:
        try:
            module = get_module(model, name)
        except AttributeError:
            continue
        tensors = [*module.parameters(), *module.buffers()]
        home = tensors[0].device if tensors else torch.device("cpu")
        module.to(device)
        moved.append((module, home))
    return moved


def kwargs_on(kwargs: dict[str, Any], device: torch.device | str) -> dict[str, Any]:
    return _detach_kwargs(kwargs, device)


def compute_dtype(layer: nn.Module) -> torch.dtype:
    # A fully quantized layer may hold only buffers (QuantLinear) besides its norms.
    for t in (*layer.parameters(), *layer.buffers()):
        if t.is_floating_point():
            return t.dtype
    return torch.float32


@torch.no_grad()
def run_layer(
    layer: nn.Module, inputs: LayerInputs, device: torch.device | str = "cpu",
    store_dtype: torch.dtype | None = None, inplace: bool = False,
) -> list[torch.Tensor]:
    """Outputs of `layer` for each stored batch (returned on CPU).

    `inplace=True` overwrites `inputs.hidden` batch by batch (and returns that list),
    so inputs and outputs of the whole calibration set never coexist in memory.
    """
    outs: list[torch.Tensor] = inputs.hidden if inplace else []
    dtype = compute_dtype(layer)
    for i, (hidden, kwargs) in enumerate(zip(inputs.hidden, inputs.kwargs, strict=True)):
        h = hidden.to(device=device, dtype=dtype)
        out = layer(h, **kwargs_on(kwargs, device))
        out = out[0] if isinstance(out, tuple) else out
        out = out.detach()
        if inplace and out.shape == hidden.shape and hidden.device.type == "cpu" and (
                store_dtype is None or store_dtype == hidden.dtype):
            hidden.copy_(out)  # reuse the buffer: no new long-lived allocation per layer
        elif inplace:
            outs[i] = out.to("cpu", store_dtype or hidden.dtype)
        else:
            outs.append(out.to("cpu", store_dtype or hidden.dtype))
    return outs


class _Rerun(Exception):
    """A batch fed while outputs were skipped must run again for real (see `_SharedInput`)."""


class _SharedInput:
    """Skips computing the outputs of a step's linears when they all read one tensor.

    q/k/v (gate/up) read the same normed hidden states, and a step's forward stops once
    its last linear was fed, so the outputs of the others are computed only to be thrown
    away. Once a batch has shown every named linear receiving the very same tensor (same
    storage, shape, strides and version: no in-place change in between), later batches
    give them a free all-zeros output instead. Each later batch is checked the same way;
    if a linear then receives anything else it may have been computed from a skipped
    output, so the batch runs again for real, feeding only what was not fed yet.
    """

    def __init__(self, layer: nn.Module, names: tuple[str, ...]) -> None:
        self.modules = [get_module(layer, n) for n in names]
        # Only plain linears, whose output shape is known without running them.
        self.possible = len(names) > 1 and all(
            isinstance(m, nn.Linear) and "forward" not in m.__dict__ for m in self.modules)
        self.skipping = False
        self.first: tuple[torch.Tensor, int] | None = None

    def same_input(self, x: torch.Tensor) -> bool:
        """Called with each fed input in order; False when it is not the batch's first."""
        if self.first is None:
            self.first = (x, x._version)
            return True
        ref, version = self.first
        return (x.data_ptr() == ref.data_ptr() and x.shape == ref.shape
                and x.stride() == ref.stride() and x.dtype == ref.dtype
                and x.device == ref.device and x._version == version)

    def start(self) -> None:
        for module in self.modules:  # an instance attribute shadows the class's forward
            module.forward = functools.partial(_zeros_output, module.out_features)
        self.skipping = True

    def stop(self) -> None:
        if self.skipping:
            for module in self.modules:
                del module.forward
        self.skipping = False


def _zeros_output(out_features: int, x: torch.Tensor) -> torch.Tensor:
    return x.new_zeros(()).expand(*x.shape[:-1], out_features)


@torch.no_grad()
def feed_linear_inputs(
    layer: nn.Module, inputs: LayerInputs, names: list[str] | tuple[str, ...],
    sink: Callable[[str, torch.Tensor], None], device: torch.device | str = "cpu",
) -> None:
    """Run every stored batch through `layer`, sending the inputs of the named linears to
    `sink(name, x)`; each forward stops as soon as all named linears were fed, so
    collecting the inputs of early linears does not pay for the rest of the layer, and
    linears that share their input do not compute outputs nobody reads (`_SharedInput`)."""
    wanted = set(names)
    fed: set[str] = set()
    shared = _SharedInput(layer, tuple(names))
    all_shared = shared.possible

    def collect(name: str, x: torch.Tensor) -> None:
        nonlocal all_shared
        if name not in fed:
            if not shared.same_input(x):
                if shared.skipping:
                    raise _Rerun
                all_shared = False
            sink(name, x)
            fed.add(name)
        if fed >= wanted:
            raise _StopForward

    dtype = compute_dtype(layer)
    try:
        with capture_linear_inputs(layer, names, collect):
            for hidden, kwargs in zip(inputs.hidden, inputs.kwargs, strict=True):
                fed.clear()
                while True:
                    shared.first = None
                    try:
                        layer(hidden.to(device=device, dtype=dtype), **kwargs_on(kwargs, device))
                    except _StopForward:
                        break
                    except Exception:
                        if not shared.skipping:
                            raise
                    else:
                        if not shared.skipping:
                            break
                    # A zeros output was read by an op that failed, by a named linear, or by
                    # the rest of the layer (a name was never reached): run it for real.
                    shared.stop()
                    all_shared = False
                if all_shared and fed >= wanted and not shared.skipping:
                    shared.start()
    finally:
        shared.stop()


@contextmanager
def capture_linear_inputs(
    layer: nn.Module, names: list[str] | tuple[str, ...],
    sink: Callable[[str, torch.Tensor], None],
) -> Iterator[None]:
    """While active, every forward of the named linears sends its input to `sink(name, x)`."""
    handles = []
    for name in names:
        module = get_module(layer, name)

        def hook(mod: nn.Module, args: tuple, name: str = name) -> None:
            sink(name, args[0].detach())

        handles.append(module.register_forward_pre_hook(hook))
    try:
        yield
    finally:
        for h in handles:
            h.remove()
