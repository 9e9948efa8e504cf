"""A one-layer twin of a model's architecture: random weights, float64, on the CPU.

Resolution (qcal.model.resolve) traces and probes the twin instead of the model itself,
so that it never needs the model's weights in memory and works on a meta skeleton.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any

import torch
from torch import nn

# Tokens of the twin's vocabulary: more than the probe feeds, far fewer than a real model's.
TWIN_VOCAB = 256
PROBE_TOKENS = 16


# MLP widths (each family's name for them) the twin may cut to TWIN_WIDTH: with the embedding,
# the MLP is most of a layer's weights (176M of an 8B layer's 218M, 1.4 GB in float64), and
# it does not change which module feeds which.
MLP_WIDTHS = ("intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size",
              "ffn_dim", "n_inner")
TWIN_WIDTH = 256


def _small(cfg: Any) -> Any | None:
    """`cfg` with a vocabulary of TWIN_VOCAB tokens (special ids past it dropped) and MLP
    widths of at most TWIN_WIDTH, or None when nothing is that large."""
    small = copy.deepcopy(cfg)
    changed = False
    vocab = getattr(cfg, "vocab_size", None)
    if isinstance(vocab, int) and vocab > TWIN_VOCAB:
        small.vocab_size, changed = TWIN_VOCAB, True
        for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
            value = getattr(small, key, None)
            if isinstance(value, int) and value >= TWIN_VOCAB:
                setattr(small, key, None)
    for key in MLP_WIDTHS:
        value = getattr(cfg, key, None)
        if isinstance(value, int) and value > TWIN_WIDTH:
            setattr(small, key, TWIN_WIDTH)
            changed = True
    return small if changed else None


def _build(cfg: Any, trust_remote_code: bool) -> nn.Module:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, trust_remote_code=trust_remote_code,
                                            dtype=torch.float64)


def build_twin(config: Any, trust_remote_code: bool, shrink: bool = True) -> nn.Module:
    """A one-layer copy of the architecture with random weights, float64, on the CPU;
    `shrink` cuts its vocabulary and MLP width (see `_small`) where the class allows."""
    cfg = copy.deepcopy(config)
    cfg.num_hidden_layers = 1
    if isinstance(getattr(cfg, "layer_types", None), list):
        cfg.layer_types = cfg.layer_types[:1]
    if hasattr(cfg, "_experts_implementation"):
        cfg._experts_implementation = "eager"  # the reference loop; fused kernels lack float64
    twin = None
    small = _small(cfg) if shrink else None
    if small is not None:
        # The embedding, head and MLP width play no part in which module feeds which, and at
        # full size in float64 an 8B model's twin held 4.9 GB before any weight was read.
        with contextlib.suppress(Exception):  # a class that ties these to other sizes
            twin = _build(small, trust_remote_code)
    if twin is None:
        twin = _build(cfg, trust_remote_code)
    with torch.no_grad():
        for name, p in twin.named_parameters():
            if p.dim() == 1 and name.endswith("weight"):
                p.uniform_(0.5, 1.5)  # norms far from their init, as trained ones are
            elif p.dim() == 1:
                p.uniform_(-0.1, 0.1)
    return twin.eval()


class _Stop(Exception):
    pass


def layer0_inputs(twin: nn.Module, layers: nn.ModuleList
                  ) -> tuple[tuple[Any, ...], dict[str, Any], list[str]] | None:
    """Layer 0's args and kwargs for a few tokens, and the modules that ran before it; None
    when the forward pass never reached layer 0."""
    got: dict[str, Any] = {}
    done: list[str] = []
    inside = {id(m) for m in layers.modules()}
    handles = []

    def pre(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        got["args"], got["kwargs"] = args, dict(kwargs)
        raise _Stop

    for name, module in twin.named_modules():
        if name and id(module) not in inside:
            handles.append(module.register_forward_hook(
                lambda m, a, o, name=name: done.append(name)))
    handles.append(layers[0].register_forward_pre_hook(pre, with_kwargs=True))
    vocab = int(twin.get_input_embeddings().weight.shape[0])
    ids = torch.arange(PROBE_TOKENS).remainder(vocab)[None]
    try:
        twin(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
    except _Stop:
        pass
    finally:
        for h in handles:
            h.remove()
    if "args" not in got:
        return None
    for key in ("past_key_values", "past_key_value", "cache", "use_cache"):
        got["kwargs"].pop(key, None)
    prelude = [n for n in done if not any(n.startswith(p + ".") for p in done if p != n)]
    return tuple(got["args"]), got["kwargs"], prelude
