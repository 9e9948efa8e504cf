"""Attention replay: once a layer's attention inputs are final, run its core only once.

GPTQ's true-sequential steps each feed the calibration batches through the layer
again: o_proj's step, gate/up's, down's and the final pass that makes the next
layer's inputs all recompute q/k/v, rotary embeddings and the attention core, though
q/k/v were quantized in the first step and nothing upstream of o_proj changes after
it. `AttentionReplay` records o_proj's input per batch during o_proj's own step and
from then on answers the attention block with ``o_proj(recorded input)``: the same
tensors in, the same op, so the same outputs, at the cost of one stored copy of the
layer's hidden states. o_proj is final once its step is over, so its output replaces
the recorded input on first use and later passes reuse it as it is (a pass that
modified it in place would be caught by the tensor's version counter, and the block
then runs for real).

Valid where the block's output is its output linear applied to that linear's input
(Llama, Mistral, Qwen2/3, Gemma3: `ArchSpec.attention`). The first replayed batch of
each layer is also computed for real and compared exactly; on any difference the
replay turns itself off for the layer and says so. Once that check passed, the norm
whose output only the block reads (`ArchSpec.attention_norm`) is skipped as well: it
hands the replayed block a free all-zeros tensor and keeps its own input, in case the
block must run for real after all.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn

from qcal.module_tree import get_module

_ATTR = "_qcal_attention_replay"


class AttentionReplay:
    """Record, then replay, the attention block of one decoder layer over `n_batches`
    calibration batches, which every pass through the layer visits in the same order."""

    def __init__(self, layer: nn.Module, block: str, out_linear: str, n_batches: int,
                 norm: str | None = None) -> None:
        self.layer, self.name, self.out_name = layer, block, out_linear
        self.block = get_module(layer, block)
        self.norm = get_module(layer, norm) if norm is not None else None
        self.norm_input: torch.Tensor | None = None
        self.n_batches = n_batches
        self.cache: dict[int, torch.Tensor] = {}  # o_proj's input, then its output
        self.versions: dict[int, int] = {}  # batches whose cache holds the output
        self.batch = -1
        self.recording = False
        self.checked = False
        self.handles = [
            layer.register_forward_pre_hook(self._next_batch),
            # On the float linear: it records during its own step, before it is swapped
            # for its quantized version.
            get_module(layer, out_linear).register_forward_pre_hook(self._record),
        ]
        setattr(layer, _ATTR, self)

    def _next_batch(self, module: nn.Module, args: Any) -> None:
        self.batch = (self.batch + 1) % self.n_batches

    def _record(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        if self.recording:
            self.cache[self.batch] = args[0].detach()

    def record(self) -> None:
        """Record o_proj's inputs during the next pass (its quantization step)."""
        self.recording, self.batch = True, -1
        self.versions.clear()

    def replay(self) -> None:
        """From now on the block returns o_proj(recorded input) for each batch."""
        self.recording = False
        if len(self.cache) != self.n_batches:
            return  # the pass did not reach o_proj for every batch: keep running it
        self.block.forward = self._forward  # an instance attribute shadows the class's

    def _output(self) -> torch.Tensor | None:
        """The block's output for the current batch; None if a cached one was changed."""
        batch = self.batch
        if batch not in self.versions:
            # The output linear as it is now: quantized, since its step replaced it.
            out = get_module(self.layer, self.out_name)(self.cache[batch])
            self.cache[batch], self.versions[batch] = out, out._version
            return out
        out = self.cache[batch]
        return out if out._version == self.versions[batch] else None

    def _forward(self, *args: Any, **kwargs: Any) -> Any:
        replayed = self._output()
        if replayed is None or not self.checked:
            # Once per layer the real block must give the same tensor; and a cached output
            # that a pass modified in place cannot be trusted any more.
            self.checked = True
            del self.block.forward
            args, kwargs = self._real_input(args, kwargs)
            real = self.block(*args, **kwargs)
            real_out = real[0] if isinstance(real, tuple) else real
            if replayed is None or not torch.equal(real_out, replayed):
                warnings.warn(f"attention replay of {self.name} differs from running it; "
                              "running it for the rest of this layer", stacklevel=2)
                return real
            self.block.forward = self._forward
            self._skip_norm()
            return real
        return replayed, None

    def _skip_norm(self) -> None:
        if self.norm is not None and "forward" not in self.norm.__dict__:
            self.norm.forward = self._norm_skipped

    def _norm_skipped(self, x: torch.Tensor) -> torch.Tensor:
        self.norm_input = x
        return x.new_zeros(()).expand(x.shape)

    def _real_input(self, args: tuple[Any, ...], kwargs: dict[str, Any]
                    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The block's arguments with the norm's real output, if the norm was skipped."""
        if self.norm is None or self.norm.__dict__.get("forward") != self._norm_skipped:
            return args, kwargs
        del self.norm.forward
        assert self.norm_input is not None
        normed = self.norm(self.norm_input)
        if "hidden_states" in kwargs:
            return args, {**kwargs, "hidden_states": normed}
        return (normed, *args[1:]), kwargs

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.block.__dict__.pop("forward", None)
        if self.norm is not None:
            self.norm.__dict__.pop("forward", None)
        self.norm_input = None
        self.cache.clear()
        self.versions.clear()
        self.layer.__dict__.pop(_ATTR, None)


def release_replay(layer: nn.Module) -> None:
    """Drop a layer's attention replay (hooks, recorded inputs), if it has one."""
    replay = layer.__dict__.get(_ATTR)
    if replay is not None:
        replay.remove()
