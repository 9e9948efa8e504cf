"""Architectures described as data.

An `ArchSpec` says where the decoder layers live, which linears GPTQ quantizes
together and in which (true-sequential) order, and which op/linear pairs AWQ
may rescale. Specs are resolved from the model itself (qcal.model.resolve), never
looked up by class name; `LLAMA_LIKE` is what resolution yields for Llama, Mistral,
Qwen2/3 and SmolLM, kept as the reference the tests compare against.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from torch import nn

from qcal.module_tree import get_module, set_module

__all__ = ["LLAMA_LIKE", "ArchSpec", "ScaleGroup", "decoder_layers", "get_module", "set_module"]


@dataclasses.dataclass(frozen=True)
class ScaleGroup:
    """AWQ: `prev_op`'s output feeds `linears`; scales fold into `prev_op`.

    `block` names the module whose output error scores a scale (the attention or
    MLP block), so the search sees what the scale does downstream; "" when no module takes
    exactly the linears' input (a parallel-residual norm feeding attention and MLP): the
    loss is then the linears' own output error. `token_wise` says the block maps every
    token on its own (an MLP, not attention), so its loss may be scored on a token
    subsample; a block that is a single linear is handled exactly either way.
    """

    prev_op: str
    linears: tuple[str, ...]
    block: str
    token_wise: bool = False


@dataclasses.dataclass(frozen=True)
class ArchSpec:
    layers_path: str = "model.layers"
    # Quantized together and in this order (true-sequential): each step sees
    # inputs produced by the already-quantized earlier steps.
    sequential: tuple[tuple[str, ...], ...] = (
        ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
        ("self_attn.o_proj",),
        ("mlp.gate_proj", "mlp.up_proj"),
        ("mlp.down_proj",),
    )
    scale_groups: tuple[ScaleGroup, ...] = (
        ScaleGroup(
            "input_layernorm",
            ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
            "self_attn",
        ),
        ScaleGroup("self_attn.v_proj", ("self_attn.o_proj",), "self_attn.o_proj", True),
        ScaleGroup("post_attention_layernorm", ("mlp.gate_proj", "mlp.up_proj"), "mlp", True),
        ScaleGroup("mlp.up_proj", ("mlp.down_proj",), "mlp.down_proj", True),
    )
    # Norms whose weight multiplies as (1 + w) (Gemma) cannot absorb a scale by plain division.
    norm_offset: float = 0.0
    # AWQ leaves these unclipped: their outputs meet in a softmax, where a linear-output
    # MSE says little about the error that matters (the reference code skips them too).
    awq_clip_skip: tuple[str, ...] = ("self_attn.q_proj", "self_attn.k_proj")
    # The attention block and its output linear, where the block's output is that linear
    # applied to its input: GPTQ then replays the attention core instead of recomputing it
    # in later true-sequential steps (qcal.model.replay). None: always run the block.
    attention: tuple[str, str] | None = ("self_attn", "self_attn.o_proj")
    # The norm whose output only that attention block reads: skipped while it is replayed.
    attention_norm: str | None = "input_layernorm"
    # What runs before decoder layer 0 (embeddings, rotary tables): moved to the compute
    # device to capture layer 0's inputs, then back. Missing names are skipped.
    prelude_modules: tuple[str, ...] = ("model.embed_tokens", "model.rotary_emb",
                                        "model.rotary_emb_local")
    # What resolution found besides: the model type, the layer modules re-expressed as
    # linears (Conv1D, fused MoE experts: qcal.model.adapters), the linears kept float
    # (routers, 1-wide gates) and the AWQ scale-group candidates left out, with the reason.
    model_type: str = ""
    adapted: tuple[str, ...] = ()
    float_linears: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()

    @property
    def linear_names(self) -> tuple[str, ...]:
        return tuple(name for step in self.sequential for name in step)

    def restricted(self, keep: set[str] | frozenset[str]) -> ArchSpec:
        """This spec for one layer where only the linears in `keep` are quantized: steps lose
        the others, and AWQ groups that would scale an unquantized linear are dropped (its
        columns would have to absorb the scale while it stays float: exact, but then the
        search would score it as if quantized)."""
        if keep >= set(self.linear_names):
            return self
        steps = tuple(s for s in (tuple(n for n in step if n in keep) for step in self.sequential)
                      if s)
        groups = tuple(g for g in self.scale_groups if set(g.linears) <= keep)
        return dataclasses.replace(self, sequential=steps, scale_groups=groups)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: what quant_log.json, the model card and `--show-arch` record."""
        out = dataclasses.asdict(self)
        out["scale_groups"] = [dataclasses.asdict(g) for g in self.scale_groups]
        return json.loads(json.dumps(out))

    def describe(self) -> str:
        """A human-readable summary (`qcal quantize --show-arch`)."""
        lines = [f"model type      {self.model_type}",
                 f"decoder layers  {self.layers_path}",
                 f"prelude         {', '.join(self.prelude_modules)}",
                 f"re-expressed    {', '.join(self.adapted) or '-'}",
                 f"kept float      {', '.join(self.float_linears) or '-'}",
                 "steps (true-sequential):"]
        lines += [f"  {i}. {', '.join(step)}" for i, step in enumerate(self.sequential)]
        lines.append(f"AWQ scale groups (norms scale as {'1 + w' if self.norm_offset else 'w'}):")
        lines += [f"  {g.prev_op} -> {', '.join(g.linears)}  [loss on {g.block or 'the linears'}]"
                  for g in self.scale_groups]
        lines += [f"  skipped: {why}" for why in self.skipped]
        lines.append(f"AWQ unclipped   {', '.join(self.awq_clip_skip) or '-'}")
        attention = " via ".join(self.attention) if self.attention else "not replayed"
        lines.append(f"attention       {attention}; its norm {self.attention_norm or '-'}")
        return "\n".join(lines)


LLAMA_LIKE = ArchSpec()

def decoder_layers(model: nn.Module, arch: ArchSpec) -> nn.ModuleList:
    return get_module(model, arch.layers_path)  # type: ignore[return-value]
