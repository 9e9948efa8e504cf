"""Shapes of a model without its weights: a meta-device skeleton built from config.json.

Used to check a scheme against every quantized linear before any work, and to pick the
default group size (the largest of 128/64/32 dividing every quantized in_features).
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch
from torch import nn

from qcal.config import auto_group_size
from qcal.errors import ConfigError


def skeleton(model_dir: Path | str, trust_remote_code: bool = False) -> nn.Module:
    """The model's modules on the meta device: shapes only, no weights read or allocated."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(model_dir), local_files_only=True,
                                        trust_remote_code=trust_remote_code)
    if hasattr(config, "quantization_config"):
        raise ConfigError(f"{model_dir} is already quantized; start from the float model")
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)


@functools.lru_cache(maxsize=16)
def quantized_in_features(model_dir: str, trust_remote_code: bool = False) -> tuple[int, ...]:
    """Distinct in_features of the linears the ArchSpec quantizes, ascending."""
    from qcal.model.arch import decoder_layers, get_module
    from qcal.model.resolve import arch_for

    net = skeleton(model_dir, trust_remote_code)
    arch = arch_for(net)
    sizes = set()
    for layer in decoder_layers(net, arch):
        for name in arch.linear_names:
            sizes.add(int(get_module(layer, name).in_features))
    return tuple(sorted(sizes))


def default_group_size(model_dir: Path | str, trust_remote_code: bool = False) -> tuple[int, str]:
    """(group size, the sentence that explains the choice)."""
    sizes = quantized_in_features(str(Path(model_dir).resolve()), trust_remote_code)
    group = auto_group_size(sizes)
    why = (f"group size {group}: the largest of 128/64/32 that divides every quantized "
           f"in_features {list(sizes)}" if group != -1 else
           f"group size -1 (per channel): none of 128/64/32 divides every quantized in_features "
           f"{list(sizes)}")
    return group, why
