"""`--rotate hadamard[:SEED]`: an exact rotation of the residual stream, folded into the
float weights before any method runs (QuaRot/SpinQuant's fused rotation, with a seeded
randomized Hadamard matrix Q instead of a learned one).

With RMSNorm the residual stream h can be replaced by Q^T h everywhere at no cost in
exactness: an RMSNorm with unit weight commutes with an orthogonal Q (the mean square of
Q^T h is that of h), so after each norm's weight is folded into the linears it feeds, the
linears that read the stream take W Q, those that write it Q^T W (and Q^T b), the
embedding E Q and the head W Q. Nothing rotates at run time: the output is an ordinary
model, and the rotation spreads outlier channels over all of them, which is what makes
the weights easier to quantize. Folding the final norm into the head unties a tied head
(the card says so). The fold runs in float64.

What is not exact is refused in one line before anything loads (`check_rotatable`, on the
skeleton): norms other than RMSNorm (LayerNorm subtracts the mean, and its bias is not
rotation-invariant), norms on a block's output (Gemma's post-norms), a norm feeding
attention and MLP at once (parallel residuals), re-expressed modules and MoE routers. After
the fold the float model's logits on a probe are compared with the unrotated ones
(`rotate_model`): a relative change above 1e-4 is an error, never a silent approximation.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from qcal.errors import ConfigError
from qcal.model.arch import ArchSpec, decoder_layers
from qcal.module_tree import get_module
from qcal.quant.hadamard import hadamard, random_hadamard

TOLERANCE = 1e-4  # relative change of the float logits the fold may cause


@dataclasses.dataclass(frozen=True)
class RotationPlan:
    """Which modules of every decoder layer the rotation touches, derived from the ArchSpec:
    norms and the linears each feeds (read the stream), the linears that write it, and the
    final norm before the head."""

    readers: tuple[tuple[str, tuple[str, ...]], ...]
    writers: tuple[str, ...]
    final_norm: str
    hidden: int


def _is_rms_norm(module: nn.Module) -> bool:
    return "rmsnorm" in type(module).__name__.lower() and getattr(module, "bias", None) is None


def _hidden_norms(module: nn.Module, hidden: int) -> dict[str, nn.Module]:
    """Norm-like modules of `module` whose weight spans the residual stream."""
    found = {}
    for name, sub in module.named_modules():
        weight = getattr(sub, "weight", None)
        if (name and "norm" in type(sub).__name__.lower() and isinstance(weight, torch.Tensor)
                and tuple(weight.shape) == (hidden,)):
            found[name] = sub
    return found


def plan_rotation(model: nn.Module, arch: ArchSpec) -> RotationPlan:
    """The modules to rotate, or ConfigError naming what makes the rotation inexact here."""
    family = arch.model_type or type(model).__name__
    if arch.adapted or arch.float_linears:
        raise ConfigError(f"--rotate hadamard does not handle {family}'s re-expressed modules or "
                          f"MoE routers ({', '.join((*arch.adapted, *arch.float_linears)[:3])}) "
                          "yet; drop --rotate")
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    if embed is None or not isinstance(head, nn.Linear):
        raise ConfigError(f"--rotate hadamard needs an input embedding and a linear head; "
                          f"{family} lacks one; drop --rotate")
    hidden = int(embed.weight.shape[1])
    hadamard(hidden)  # refuses a hidden size no construction reaches
    layer = decoder_layers(model, arch)[0]
    linears = {n: get_module(layer, n) for n in arch.linear_names}
    readers, fed = [], set()
    for group in arch.scale_groups:
        prev = get_module(layer, group.prev_op)
        if isinstance(prev, nn.Linear):
            continue  # a linear feeding a linear (v -> o, up -> down): inside a block
        if not _is_rms_norm(prev):
            raise ConfigError(f"--rotate hadamard is exact only after RMSNorm; {family}'s "
                              f"{group.prev_op} is {type(prev).__name__} (mean subtraction or a "
                              "bias does not commute with a rotation); drop --rotate")
        if not group.block:
            raise ConfigError(f"--rotate hadamard does not handle {family}'s parallel residual "
                              f"({group.prev_op} feeds attention and MLP at once) yet; drop "
                              "--rotate")
        readers.append((group.prev_op, tuple(group.linears)))
        fed.update(group.linears)
    post = sorted(set(_hidden_norms(layer, hidden)) - {norm for norm, _ in readers})
    if post:
        raise ConfigError(f"--rotate hadamard does not handle {family}'s post-norms ({post[0]} "
                          "normalizes a block's output before the residual add) yet; drop --rotate")
    writers = tuple(n for n, lin in linears.items()
                    if n not in fed and lin.out_features == hidden)
    outside = {n: m for n, m in _hidden_norms(model, hidden).items()
               if not n.startswith(arch.layers_path + ".")}
    if len(outside) != 1 or not _is_rms_norm(next(iter(outside.values()))):
        raise ConfigError(f"--rotate hadamard needs one final RMSNorm before {family}'s head; "
                          f"found {sorted(outside) or 'none'}; drop --rotate")
    return RotationPlan(tuple(readers), writers, next(iter(outside)), hidden)


def check_rotatable(model: nn.Module, arch: ArchSpec) -> None:
    """Refuse (ConfigError, one line) a model the rotation cannot fold exactly; works on the
    meta skeleton, before any weight loads."""
    plan_rotation(model, arch)


def _fold_norm(norm: nn.Module, linears: list[nn.Linear], offset: float) -> None:
    scale = norm.weight.detach().double() + offset  # Gemma-style (1 + w) norms: offset 1
    for lin in linears:
        lin.weight.data = (lin.weight.detach().double() * scale).to(lin.weight.dtype)
    norm.weight.data.fill_(1.0 - offset)


def _rotate_in(lin: nn.Linear, q: torch.Tensor) -> None:
    lin.weight.data = (lin.weight.detach().double() @ q).to(lin.weight.dtype)


def _rotate_out(lin: nn.Linear, q: torch.Tensor) -> None:
    lin.weight.data = (q.T @ lin.weight.detach().double()).to(lin.weight.dtype)
    if lin.bias is not None:
        lin.bias.data = (q.T @ lin.bias.detach().double()).to(lin.bias.dtype)


@torch.no_grad()
def rotate_model(model: nn.Module, arch: ArchSpec, seed: int,
                 probe: torch.Tensor | None = None) -> dict[str, Any]:
    """Fold a seeded randomized Hadamard rotation into `model` in place; returns what the
    checkpoint's log records (seed, hidden size, untied head, the probe's relative change)."""
    plan = plan_rotation(model, arch)
    before = model(probe).logits.double() if probe is not None else None
    q = random_hadamard(plan.hidden, seed).to(model.get_input_embeddings().weight.device)
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    untied = head.weight is embed.weight or head.weight.data_ptr() == embed.weight.data_ptr()
    if untied:  # the final norm's fold makes the head differ from the embedding
        head.weight = nn.Parameter(head.weight.detach().clone())
        model.config.tie_word_embeddings = False
        text = getattr(model.config, "get_text_config", None)
        if callable(text):
            text().tie_word_embeddings = False
    offset = arch.norm_offset
    for layer in decoder_layers(model, arch):
        for norm, names in plan.readers:
            group = [get_module(layer, n) for n in names]
            _fold_norm(get_module(layer, norm), group, offset)
            for lin in group:
                _rotate_in(lin, q)
        for name in plan.writers:
            _rotate_out(get_module(layer, name), q)
    _fold_norm(get_module(model, plan.final_norm), [head], offset)
    _rotate_in(head, q)
    embed.weight.data = (embed.weight.detach().double() @ q).to(embed.weight.dtype)
    record: dict[str, Any] = {"kind": "hadamard", "seed": seed, "hidden": plan.hidden,
                              "untied_head": untied, "writers": list(plan.writers)}
    if before is not None:
        after = model(probe).logits.double()
        change = float((after - before).norm() / before.norm().clamp_min(1e-30))
        record["probe_relative_change"] = change
        if not change <= TOLERANCE:
            raise ConfigError(f"--rotate hadamard changed {arch.model_type or 'the model'}'s "
                              f"float logits by {change:.2g} (relative, limit {TOLERANCE:g}): "
                              "its layers are not handled exactly; drop --rotate")
    return record
