"""Exact re-expressions of modules that are not plain `nn.Linear`s, so every quantizer sees
linears: transformers' `Conv1D` (GPT-2: y = x W + b with W stored [in, out]) and MoE experts
stored as fused 3-D parameters (transformers 5: `experts.gate_up_proj [E, 2I, H]`,
`experts.down_proj [E, H, I]`).

Each adapter computes the same function as the module it replaces (the architecture
resolver checks that on a random probe before any real model is touched), and its linears
carry the per-expert names that vLLM and transformers' per-expert loaders use
(`experts.<i>.gate_proj`, `.up_proj`, `.down_proj`).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator

import torch
from torch import nn

FUSED_EXPERT_PARAMS = ("gate_up_proj", "down_proj")


def is_conv1d(module: nn.Module) -> bool:
    """transformers' Conv1D (matched by class name and layout: no import of GPT-2 code)."""
    return (type(module).__name__ == "Conv1D" and hasattr(module, "nf") and hasattr(module, "nx")
            and isinstance(getattr(module, "weight", None), torch.Tensor)
            and module.weight.dim() == 2)


@torch.no_grad()
def conv1d_as_linear(conv: nn.Module) -> nn.Linear:
    """The nn.Linear computing what `conv` computes (weight transposed, same bias)."""
    weight = conv.weight
    bias = getattr(conv, "bias", None)
    linear = nn.Linear(int(conv.nx), int(conv.nf), bias=bias is not None,
                       device=weight.device, dtype=weight.dtype)
    if weight.device.type == "meta":
        return linear
    linear.weight.copy_(weight.t())
    if bias is not None:
        linear.bias.copy_(bias)
    return linear


def is_fused_experts(module: nn.Module) -> bool:
    """A transformers-5 experts module: gate_up_proj [E, 2I, H], down_proj [E, H, I], act_fn,
    forward(hidden_states, top_k_index, top_k_weights), no biases."""
    gate_up = getattr(module, "gate_up_proj", None)
    down = getattr(module, "down_proj", None)
    if not (isinstance(gate_up, nn.Parameter) and isinstance(down, nn.Parameter)):
        return False
    if gate_up.dim() != 3 or down.dim() != 3 or not hasattr(module, "act_fn"):
        return False
    # transformers' experts decorator says how the 3-D weights are laid out; only the
    # concatenated [gate; up], untransposed, bias-free, gated layout is re-expressed here.
    layout = {"is_concatenated": True, "is_transposed": False, "has_bias": False,
              "has_gate": True, "has_post_expert_norm": False}
    if any(getattr(module, flag, value) != value for flag, value in layout.items()):
        return False
    experts, two_inter, hidden = gate_up.shape
    if down.shape != (experts, hidden, two_inter // 2) or two_inter % 2:
        return False
    params = list(inspect.signature(module.forward).parameters)
    return params[:3] == ["hidden_states", "top_k_index", "top_k_weights"]


class ExpertMLP(nn.Module):
    """One expert: down(act(gate(x)) * up(x))."""

    def __init__(self, hidden: int, inter: int, act_fn: nn.Module, device: torch.device,
                 dtype: torch.dtype) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False, device=device, dtype=dtype)
        self.up_proj = nn.Linear(hidden, inter, bias=False, device=device, dtype=dtype)
        self.down_proj = nn.Linear(inter, hidden, bias=False, device=device, dtype=dtype)
        # Not a submodule: the activation holds no weights and must not appear in state dicts.
        self.__dict__["act_fn"] = act_fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class LinearizedExperts(nn.ModuleList):
    """Per-expert linears computing what a fused experts module computes.

    `route_all` (set by calibration) also runs every expert on the tokens the router did
    not send it, with its output discarded: the expert's linears then see every token (so
    no expert is left without calibration data) while the layer's output stays the routed
    one. `tokens_seen[i]` counts the routed tokens expert i received.
    """

    def __init__(self, experts: list[ExpertMLP]) -> None:
        super().__init__(experts)
        self.route_all = False
        self.tokens_seen = [0] * len(experts)

    @classmethod
    @torch.no_grad()
    def from_fused(cls, fused: nn.Module) -> LinearizedExperts:
        gate_up, down = fused.gate_up_proj, fused.down_proj
        n, two_inter, hidden = gate_up.shape
        inter = two_inter // 2
        experts = [ExpertMLP(hidden, inter, fused.act_fn, gate_up.device, gate_up.dtype)
                   for _ in range(n)]
        if gate_up.device.type != "meta":
            for i, expert in enumerate(experts):
                expert.gate_proj.weight.copy_(gate_up[i, :inter])
                expert.up_proj.weight.copy_(gate_up[i, inter:])
                expert.down_proj.weight.copy_(down[i])
        return cls(experts)

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(hidden_states)
        for index, expert in enumerate(self):
            token_idx, slot = torch.where(top_k_index == index)
            # route_all (calibration only): every token reaches the linears once, and the
            # routed rows of that output are the ones used.
            full = expert(hidden_states) if self.route_all else None
            if token_idx.numel() == 0:
                continue
            self.tokens_seen[index] += int(token_idx.numel())
            y = full[token_idx] if full is not None else expert(hidden_states[token_idx])
            y = y * top_k_weights[token_idx, slot, None]
            out.index_add_(0, token_idx, y.to(out.dtype))
        return out


def iter_adaptable(root: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """(name, module) of every Conv1D and fused experts module below `root`."""
    for name, module in root.named_modules():
        if is_conv1d(module) or is_fused_experts(module):
            yield name, module


def adapt_modules(root: nn.Module, names: list[str] | tuple[str, ...] | None = None) -> list[str]:
    """Replace Conv1D and fused-experts modules below `root` (only `names`, when given) by
    their linear forms, in place; returns the names replaced."""
    from qcal.module_tree import set_module

    done = []
    for name, module in list(iter_adaptable(root)):
        if names is not None and name not in names:
            continue
        new = conv1d_as_linear(module) if is_conv1d(module) else LinearizedExperts.from_fused(module)
        set_module(root, name, new)
        done.append(name)
    return done


def calibrate_experts(layer: nn.Module, route_all: bool) -> None:
    """Before a layer's calibration passes: route every token to every expert or not."""
    for module in layer.modules():
        if isinstance(module, LinearizedExperts):
            module.route_all = route_all


def finish_experts(layer: nn.Module) -> None:
    """After a layer is quantized: its next pass (the one that makes the next layer's inputs)
    routes normally and counts the tokens each expert receives."""
    for module in layer.modules():
        if isinstance(module, LinearizedExperts):
            module.route_all = False
            module.tokens_seen = [0] * len(module)


def expert_tokens(model: nn.Module) -> dict[str, list[int]]:
    """Routed calibration tokens per expert, per experts module (from the last pass)."""
    return {name: list(m.tokens_seen) for name, m in model.named_modules()
            if isinstance(m, LinearizedExperts)}
