"""Architectures described as data.

An `ArchSpec` says where the decoder layers live, which linears GPTQ quantizes
together and in which (true-sequential) order, and which op/linear pairs AWQ
may rescale. Specs are keyed by the HF class name; unknown classes fall back to
the Llama-like default, which covers Llama, Mistral, Qwen2/3 and SmolLM.
"""

from __future__ import annotations

import dataclasses

from torch import nn

from qcal.module_tree import get_module, set_module
from qcal.registry import Registry

__all__ = ["ARCHS", "ArchSpec", "ScaleGroup", "arch_for", "decoder_layers", "get_module",
           "set_module"]


@dataclasses.dataclass(frozen=True)
class ScaleGroup:
    """AWQ: `prev_op`'s output feeds `linears`; scales fold into `prev_op`.

    `block` names the module whose output error scores a scale (the attention or
    MLP block), so the search sees what the scale does downstream. `token_wise` says the
    block maps every token on its own (an MLP, not attention), so its loss may be scored on
    a token subsample; a block that is a single linear is handled exactly either way.
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

    @property
    def linear_names(self) -> tuple[str, ...]:
        return tuple(name for step in self.sequential for name in step)


LLAMA_LIKE = ArchSpec()

ARCHS: Registry[ArchSpec] = Registry("architecture")
for _cls in ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"):
    ARCHS.register(_cls, LLAMA_LIKE)
# Gemma3's post_attention_layernorm normalises the attention *output*; the MLP's
# input comes from pre_feedforward_layernorm, so that is where AWQ's MLP scale folds.
ARCHS.register("Gemma3ForCausalLM", dataclasses.replace(
    LLAMA_LIKE, norm_offset=1.0,
    scale_groups=(
        LLAMA_LIKE.scale_groups[0], LLAMA_LIKE.scale_groups[1],
        ScaleGroup("pre_feedforward_layernorm", ("mlp.gate_proj", "mlp.up_proj"), "mlp", True),
        LLAMA_LIKE.scale_groups[3],
    ),
))


def arch_for(model: nn.Module) -> ArchSpec:
    name = type(model).__name__
    return ARCHS.get(name) if name in ARCHS else LLAMA_LIKE


def decoder_layers(model: nn.Module, arch: ArchSpec) -> nn.ModuleList:
    return get_module(model, arch.layers_path)  # type: ignore[return-value]
