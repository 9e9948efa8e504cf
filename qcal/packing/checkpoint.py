"""Checkpoints in the GPTQ safetensors layout (what transformers, GPTQModel and vLLM load).

Per quantized linear `<name>`: `<name>.qweight` int32 [in/8, out], `<name>.qzeros`
int32 [groups, out/8], `<name>.scales` fp16 [groups, out], `<name>.g_idx` int32 [in],
and `<name>.bias` if any. config.json carries `quantization_config` with
`quant_method: "gptq"`; quantize_config.json repeats it for older loaders.

`checkpoint_format: "gptq"` (v1) stores zero points minus one, as the original
GPTQ code did; a zero point of 0 cannot be stored that way, so when an
asymmetric grid produces one we write `"gptq_v2"` (true zero points) instead.

This file writes checkpoints (and the compressed-tensors and AWQ GEMM layouts through
qcal.packing.formats) and tells from config.json what a folder holds; reading one back
into a model is qcal.packing.checkpoint_load.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from qcal_kernels.format import pack_cols, unpack_cols
from safetensors.torch import save_file
from torch import nn

from qcal.errors import CheckpointError
from qcal.fsio import write_dir_atomically
from qcal.packing.naming import config_names, disk_namer
from qcal.packing.qlinear import QuantLinear

WEIGHTS_NAME = "model.safetensors"
QUANT_SUFFIXES = ("qweight", "qzeros", "scales", "g_idx")
CHECKPOINT_KIND = "checkpoint"
QUANT_METHODS = ("gptq", "compressed-tensors", "awq")  # quantization_config.quant_method
# The default: the one format that bare transformers (with compressed-tensors, a qcal
# dependency), lm_eval's hf model and vLLM all load natively, symmetric or not (docs/formats.md).
DEFAULT_FORMAT = "compressed-tensors"
# --format names: gptq_v2 is the GPTQ layout with true zero points (GPTQModel 7.6 loads an
# asymmetric GPTQ checkpoint only so); gptq stores zero - 1 (v1) unless a zero point is 0.
FORMATS = ("gptq", "gptq_v2", "compressed-tensors", "awq")


def quant_modules(model: nn.Module) -> dict[str, QuantLinear]:
    return {n: m for n, m in model.named_modules() if isinstance(m, QuantLinear)}


def _zero_storage_format(model: nn.Module) -> str:
    for layer in quant_modules(model).values():
        if bool((unpack_cols(layer.qzeros, layer.bits) == 0).any()):
            return "gptq_v2"
    return "gptq"


def _state_for_disk(model: nn.Module, fmt: str, prefix: str = "",
                    tied: bool | None = None) -> dict[str, torch.Tensor]:
    """`model`'s tensors as the GPTQ layout stores them, named `prefix + name`."""
    state = {prefix + k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    for name in quant_modules(model):  # the GPTQ layout's scales are fp16 (exact for qcal's)
        state[f"{prefix}{name}.scales"] = state[f"{prefix}{name}.scales"].to(torch.float16)
    if fmt == "gptq":
        for name, layer in quant_modules(model).items():
            stored = unpack_cols(state[f"{prefix}{name}.qzeros"], layer.bits) - 1
            state[f"{prefix}{name}.qzeros"] = pack_cols(stored, layer.bits)
    # Tied embeddings share storage; safetensors refuses aliases, and loaders re-tie.
    if tied is None:
        tied = bool(getattr(getattr(model, "config", None), "tie_word_embeddings", False))
    if tied:
        state.pop("lm_head.weight", None)
    return state


# quantization_config fields loaders read besides bits/group_size/sym; a method's own
# values (QuantMethod.checkpoint_fields) override these.
DEFAULT_FORMAT_FIELDS = {"desc_act": False, "damp_percent": 0.01, "static_groups": False,
                         "true_sequential": True}


def quantization_config(layer: QuantLinear, sym: bool, fmt: str, meta: dict[str, Any],
                        fields: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "quant_method": "gptq",
        "bits": layer.bits,
        "group_size": layer.group_size,
        "sym": sym,
        "checkpoint_format": fmt,
        **DEFAULT_FORMAT_FIELDS,
        **(fields or {}),
        "meta": {"quantizer": ["qcal:0.1.0"], **meta},
    }


def save_checkpoint(
    model: nn.Module, out_dir: Path | str, tokenizer: Any = None, *, sym: bool,
    fields: dict[str, Any] | None = None, meta: dict[str, Any] | None = None,
    extra_files: dict[str, str | bytes] | None = None, fmt: str = "gptq",
) -> Path:
    """Write a model whose quantized linears are `QuantLinear`s; atomic (temp dir + rename).

    `extra_files` (name -> text) are written inside the same atomic step, so a kill can
    never leave a checkpoint without them. The caller checked the output with
    `qcal.fsio.check_output(out_dir, CHECKPOINT_KIND, ...)`.
    """
    layers = quant_modules(model)
    if not layers:
        raise CheckpointError("the model has no QuantLinear layers: quantize it before saving")
    if fmt not in FORMATS:
        raise CheckpointError(f"unknown checkpoint format {fmt!r}; known: {', '.join(FORMATS)}")
    first = next(iter(layers.values()))
    if fmt in ("gptq", "gptq_v2"):
        if len({(q.bits, q.group_size) for q in layers.values()}) > 1 and \
                not (fields or {}).get("dynamic"):
            # Per-module schemes are said by GPTQModel's `dynamic` field (qcal.schemes).
            raise CheckpointError(f"the {fmt} quantization_config holds one scheme for every "
                                  "linear unless its `dynamic` field names the others; pass "
                                  "the --scheme-override rules that made them")
        storage = "gptq_v2" if fmt == "gptq_v2" else _zero_storage_format(model)
        qcfg = quantization_config(first, sym, storage, meta or {}, fields)
        state = _state_for_disk(model, storage)
    else:
        state, qcfg = _other_format_state(model, fmt, sym, fields or {})

    state = on_disk(state, model.config)

    def fill(tmp: Path) -> None:
        save_file(state, str(tmp / WEIGHTS_NAME), metadata={"format": "pt"})
        write_side_files(tmp, model, qcfg, fmt, tokenizer, extra_files)

    write_dir_atomically(Path(out_dir), fill, CHECKPOINT_KIND)
    return Path(out_dir)


def on_disk(state: dict[str, torch.Tensor], config: Any) -> dict[str, torch.Tensor]:
    """`state` under the names the model's original checkpoints use (qcal.packing.naming)."""
    name = disk_namer(*config_names(config))
    return {name(k): v for k, v in state.items()}


def write_side_files(tmp: Path, model: nn.Module, qcfg: dict[str, Any], fmt: str,
                     tokenizer: Any, extra_files: dict[str, str | bytes] | None) -> None:
    """config.json (with quantization_config), quantize_config.json, tokenizer, extras."""
    config = model.config.to_dict()
    config["quantization_config"] = qcfg
    (tmp / "config.json").write_text(json.dumps(config, indent=2, default=str))
    if fmt in ("gptq", "gptq_v2"):
        (tmp / "quantize_config.json").write_text(json.dumps(qcfg, indent=2))
    if tokenizer is not None:
        tokenizer.save_pretrained(str(tmp))
    for name, content in (extra_files or {}).items():
        data = content.encode("utf-8") if isinstance(content, str) else content
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp / name).write_bytes(data)


def _other_format_state(model: nn.Module, fmt: str, sym: bool, fields: dict[str, Any]
                        ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """State dict and quantization_config of the compressed-tensors or AWQ GEMM format."""
    layers = quant_modules(model)
    first = next(iter(layers.values()))
    if fmt == "awq" and len({(q.bits, q.group_size) for q in layers.values()}) > 1:
        raise CheckpointError("the AWQ GEMM layout holds one scheme for every linear; use "
                              "--format compressed-tensors for per-module schemes")
    state = _state_for_disk(model, "gptq_v2")
    actorder = convert_quant_state(state, model, fmt, sym, model_float_dtype(model))
    return state, other_format_config(model, fmt, first, sym, actorder, fields)


def model_float_dtype(model: nn.Module) -> torch.dtype:
    return next((t.dtype for t in model.parameters() if t.is_floating_point()), torch.float32)


def convert_quant_state(state: dict[str, torch.Tensor], module: nn.Module, fmt: str, sym: bool,
                        dtype: torch.dtype, prefix: str = "") -> bool:
    """Rewrite `module`'s GPTQ-layout (v2) entries of `state` in format `fmt`, in place;
    returns whether any linear's groups are reordered (act-order)."""
    from qcal.packing import formats

    actorder = False
    for name, layer in quant_modules(module).items():
        full = prefix + name
        for suffix in QUANT_SUFFIXES:
            state.pop(f"{full}.{suffix}")
        codes = formats.codes_of(layer)
        actorder = actorder or not codes.contiguous_groups
        new = (formats.ct_tensors(full, codes, dtype, sym) if fmt == "compressed-tensors"
               else formats.awq_tensors(full, codes))
        state.update({k: v.contiguous() for k, v in new.items()})
    return actorder


def other_format_config(model: nn.Module, fmt: str, first: QuantLinear, sym: bool,
                        actorder: bool, fields: dict[str, Any]) -> dict[str, Any]:
    from qcal.packing import formats

    if fmt == "awq":
        return formats.awq_config(first.bits, first.group_size)
    ignore = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    by_scheme: dict[tuple[int, int], list[str]] = {}
    for name, layer in quant_modules(model).items():
        by_scheme.setdefault((layer.bits, layer.group_size), []).append(name)
    every = [n for names in by_scheme.values() for n in names]
    groups = ([(first.bits, first.group_size, ["Linear"])] if len(by_scheme) == 1 else
              [(bits, group, formats.ct_targets(names, every))
               for (bits, group), names in by_scheme.items()])
    # Act-order reaches this format only with static groups (ct_tensors refuses g_idx).
    return formats.ct_config(groups, sym, bool(fields.get("desc_act")), ignore)


def is_legacy_qcal_checkpoint(path: Path) -> bool:
    """A checkpoint an older qcal wrote (before output markers): its config names qcal."""
    try:
        qc = json.loads((Path(path) / "config.json").read_text()).get("quantization_config") or {}
    except (OSError, ValueError, AttributeError):
        return False
    quantizers = (qc.get("meta") or {}).get("quantizer") or []
    return any(str(q).startswith("qcal") for q in quantizers)


def is_quantized_checkpoint(path: Path | str) -> bool:
    cfg = Path(path) / "config.json"
    if not cfg.is_file():
        return False
    try:
        qc = json.loads(cfg.read_text()).get("quantization_config") or {}
    except (OSError, ValueError, AttributeError):
        return False
    return qc.get("quant_method") in QUANT_METHODS


def checkpoint_summary(path: Path | str) -> dict[str, Any]:
    """Method, scheme, source and calibration of a quantized checkpoint in any format:
    from its quant_log.json (qcal's) or else from the GPTQ-style quantization_config."""
    path = Path(path)
    qc = json.loads((path / "config.json").read_text()).get("quantization_config") or {}
    try:
        log = json.loads((path / "quant_log.json").read_text())
    except (OSError, ValueError):
        log = dict(qc.get("meta") or {})
    config = log.get("config") or {}
    scheme = config.get("scheme") or {}
    if qc.get("quant_method") == "compressed-tensors" and not scheme:
        from qcal.packing.formats import ct_scheme

        bits, group = ct_scheme(qc)[:2]
        scheme = {"bits": bits, "group_size": group}
    return {"method": log.get("method", qc.get("quant_method")),
            "bits": scheme.get("bits", qc.get("bits")),
            "group_size": scheme.get("group_size", qc.get("group_size")),
            "sym": scheme.get("sym", qc.get("sym")),
            "desc_act": config.get("desc_act", qc.get("desc_act")),
            "source_model": log.get("source_model"), "calibration": log.get("calibration"),
            "format": log.get("format") or qc.get("checkpoint_format") or qc.get("quant_method")}
