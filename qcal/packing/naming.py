"""Tensor names on disk: the model's original checkpoint layout, as transformers saves it.

transformers 5 renames some models' tensors while loading (Mixtral's `block_sparse_moe`
becomes `mlp`) and fuses per-expert MoE weights into 3-D parameters; `save_pretrained`
reverses both, so every loader (transformers itself, vLLM, GPTQModel) reads the original
names. qcal keeps experts per expert (qcal.model.adapters: `experts.<i>.gate_proj`,
`up_proj`, `down_proj`), so its checkpoints name each expert as the model's original
checkpoint did (`block_sparse_moe.experts.<i>.w1` for Mixtral) and apply the renamings in
reverse. Both directions come from transformers' own conversion mapping for the model,
not from a table here; a mapping qcal cannot invert exactly leaves qcal's names unchanged.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

# qcal's per-expert linears and the fused parameter each is a slice of:
# gate = gate_up_proj[i, :I], up = gate_up_proj[i, I:], down = down_proj[i].
_FUSED_SLICES = {"gate_up_proj": ("gate_proj", "up_proj"), "down_proj": ("down_proj",)}
_EXPERT_KEY = re.compile(r"^(?P<head>.*\.experts\.)(?P<index>\d+)\.(?P<leaf>\w+)\.(?P<tail>.+)$")


def _conversions(model_type: str, class_name: str | None) -> list[Any]:
    try:
        from transformers.conversion_mapping import get_checkpoint_conversion_mapping
    except ImportError:  # an older transformers without load-time conversions
        return []
    found = get_checkpoint_conversion_mapping(class_name) if class_name else None
    return list(found or get_checkpoint_conversion_mapping(model_type) or [])


def _expert_leaves(conversions: list[Any]) -> dict[str, str]:
    """qcal's expert leaf name -> the original checkpoint's (e.g. gate_proj -> w1), from the
    converters that merge per-expert weights into `experts.gate_up_proj` / `down_proj`
    along the layout qcal slices them by; {} when there are none or they do otherwise."""
    from transformers.core_model_loading import Concatenate, MergeModulelist, WeightConverter

    leaves: dict[str, str] = {}
    for conv in conversions:
        if not isinstance(conv, WeightConverter) or len(conv.target_patterns) != 1:
            continue
        fused = next((f for f in _FUSED_SLICES if conv.target_patterns[0].endswith(
            f"experts.{f}")), None)
        if fused is None:
            continue
        ops = [(type(op), getattr(op, "dim", None)) for op in conv.operations]
        expected = [(MergeModulelist, 0)] + ([(Concatenate, 1)] if fused == "gate_up_proj" else [])
        ours = _FUSED_SLICES[fused]
        if ops != expected or len(conv.source_patterns) != len(ours):
            return {}
        for mine, pattern in zip(ours, conv.source_patterns, strict=True):
            m = re.search(r"experts\.\*\.(\w+)\.weight$", pattern)
            if m is None:
                return {}
            leaves[mine] = m.group(1)
    return leaves


def _renamings(conversions: list[Any], reverse: bool) -> list[Any]:
    from transformers.core_model_loading import PrefixChange, WeightRenaming

    plain = [c for c in conversions if type(c) is WeightRenaming and not isinstance(c, PrefixChange)]
    return [c.reverse_transform() for c in reversed(plain)] if reverse else plain


def _rename(key: str, renamings: list[Any]) -> str:
    for r in renamings:
        key, _ = r.rename_source_key(key)
    return key


def _namers(conversions: list[Any]) -> tuple[Callable[[str], str], Callable[[str], str]]:
    """(qcal key -> disk key, disk key -> qcal key) for a model's conversion mapping."""
    leaves = _expert_leaves(conversions)
    back = {v: k for k, v in leaves.items()}
    to_disk_renames, to_mem_renames = _renamings(conversions, True), _renamings(conversions, False)

    def to_disk(key: str) -> str:
        m = _EXPERT_KEY.match(key)
        if m and m.group("leaf") in leaves:
            key = f"{m['head']}{m['index']}.{leaves[m['leaf']]}.{m['tail']}"
        return _rename(key, to_disk_renames)

    def to_memory(key: str) -> str:
        key = _rename(key, to_mem_renames)
        m = _EXPERT_KEY.match(key)
        if m and m.group("leaf") in back:
            key = f"{m['head']}{m['index']}.{back[m['leaf']]}.{m['tail']}"
        return key

    return to_disk, to_memory


def disk_namer(model_type: str, class_name: str | None) -> Callable[[str], str]:
    """qcal state-dict key -> on-disk key; the identity for models without load-time
    conversions, and for any key whose on-disk name would not load back as itself."""
    conversions = _conversions(model_type, class_name)
    if not conversions:
        return lambda k: k
    to_disk, to_memory = _namers(conversions)

    def name(key: str) -> str:
        disk = to_disk(key)
        if to_memory(disk) == key:
            return disk
        log.warning("%s: %s would not load back under transformers' name %s; kept as is",
                    model_type, key, disk)
        return key

    return name


def memory_namer(model_type: str, class_name: str | None) -> Callable[[str], str]:
    """On-disk key -> qcal state-dict key (the inverse of `disk_namer`): the load-time
    renamings, then per-expert leaves back to qcal's. Names already qcal's pass unchanged."""
    conversions = _conversions(model_type, class_name)
    return _namers(conversions)[1] if conversions else (lambda k: k)


def config_names(config: Any) -> tuple[str, str | None]:
    """(model_type, class name) of a transformers config, as the conversion lookup wants."""
    archs = getattr(config, "architectures", None) or [None]
    return str(getattr(config, "model_type", "")), archs[0]
