"""Checkpoints in the GPTQ safetensors layout (what transformers, GPTQModel and vLLM load).

Per quantized linear `<name>`: `<name>.qweight` int32 [in/8, out], `<name>.qzeros`
int32 [groups, out/8], `<name>.scales` fp16 [groups, out], `<name>.g_idx` int32 [in],
and `<name>.bias` if any. config.json carries `quantization_config` with
`quant_method: "gptq"`; quantize_config.json repeats it for older loaders.

`checkpoint_format: "gptq"` (v1) stores zero points minus one, as the original
GPTQ code did; a zero point of 0 cannot be stored that way, so when an
asymmetric grid produces one we write `"gptq_v2"` (true zero points) instead.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from qcal_kernels.format import PACKABLE_BITS, pack_cols, pack_rows, unpack_cols
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from qcal.errors import CheckpointError, ModelNotFoundError
from qcal.fsio import write_dir_atomically
from qcal.module_tree import get_module, set_module
from qcal.packing.naming import config_names, disk_namer, memory_namer
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


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelNotFoundError(f"no *.safetensors file in {path}; re-run `qcal quantize`")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            state.update(load_file(str(f)))
        except (SafetensorError, OSError, ValueError) as err:
            raise CheckpointError(
                f"checkpoint file {f} is corrupted or truncated ({err}); re-create it with "
                "`qcal quantize`"
            ) from None
    return state


def load_checkpoint(path: Path | str, dtype: torch.dtype | None = None,
                    trust_remote_code: bool = False,
                    prepare: Callable[[nn.Module], object] | None = None) -> nn.Module:
    """Build the model from config.json, `prepare` it (qcal.model.loading passes the
    architecture resolver, which re-expresses Conv1D and fused experts as the linears the
    checkpoint names), swap in `QuantLinear`s, and load the tensors.

    Missing, unexpected or mis-shaped tensors raise `CheckpointError` naming them.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    path = Path(path)
    if not (path / "config.json").is_file():
        raise ModelNotFoundError(f"{path} has no config.json; is it a qcal/GPTQ checkpoint?")
    raw = json.loads((path / "config.json").read_text())
    qcfg = raw.get("quantization_config") or {}
    method = qcfg.get("quant_method")
    if method not in QUANT_METHODS:
        raise CheckpointError(f"{path}/config.json has no quantization_config qcal reads "
                              f"(quant_method {method!r}; known: {', '.join(QUANT_METHODS)})")
    if method == "compressed-tensors":  # one scheme per config group (per-module schemes)
        from qcal.packing.formats import ct_groups, ct_layer_scheme

        groups = ct_groups(qcfg)
        all_bits = {g[0] for g in groups}

        def scheme_of(name: str) -> tuple[int, int]:
            return ct_layer_scheme(groups, name)
    else:
        from qcal.packing.formats import dynamic_scheme

        try:
            bits, group_size = int(qcfg["bits"]), int(qcfg["group_size"])
            dynamic = qcfg.get("dynamic") if method == "gptq" else None
            all_bits = {bits, *(int((f or {}).get("bits", bits))
                                for f in (dynamic or {}).values())}
        except (KeyError, TypeError, ValueError, AttributeError):
            raise CheckpointError(f"{path}/config.json quantization_config needs integer \"bits\" "
                                  "and \"group_size\" (and a `dynamic` of pattern -> fields); "
                                  "re-create it with `qcal quantize`") from None

        def scheme_of(name: str) -> tuple[int, int]:  # GPTQModel's per-module `dynamic` rules
            return dynamic_scheme(dynamic, name, bits, group_size)
    unpackable = sorted(all_bits - set(PACKABLE_BITS))
    if unpackable:
        raise CheckpointError(f"{path}/config.json says bits={unpackable[0]}; qcal's checkpoints "
                              f"hold {PACKABLE_BITS}-bit weights: fix config.json or re-create it")
    # Original checkpoint names (Mixtral's block_sparse_moe.experts.<i>.w1, ...) -> qcal's.
    to_memory = memory_namer(str(raw.get("model_type", "")), (raw.get("architectures") or [None])[0])
    state = {to_memory(k): v for k, v in _read_tensors(path).items()}
    fmt = qcfg.get("checkpoint_format", "gptq")
    if method != "gptq":
        state, fmt = _as_gptq_state(state, method, scheme_of), "gptq_v2"

    config = AutoConfig.from_pretrained(str(path), local_files_only=True,
                                        trust_remote_code=trust_remote_code)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    torch_dtype = dtype or getattr(config, "dtype", None) or torch.float32
    if isinstance(torch_dtype, str):
        torch_dtype = getattr(torch, torch_dtype)
    from accelerate import init_empty_weights

    # Parameters on meta: the float linears that QuantLinear replaces are never allocated
    # (for an 8B model a float copy would be 32 GB); every tensor is assigned from the file.
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype,
                                                 trust_remote_code=trust_remote_code)
    if prepare is not None:
        prepare(model)  # e.g. Conv1D and fused MoE experts as the linears the files name

    quant_names = sorted({k.rsplit(".", 1)[0] for k in state if k.endswith(".qweight")})
    for name in quant_names:
        try:
            linear = get_module(model, name)
        except AttributeError:
            raise CheckpointError(f"checkpoint tensor {name}.qweight names no module") from None
        scales = state.get(f"{name}.scales")
        # Keep the file's scale dtype (bf16/fp32 in other formats): a cast could round them.
        scale_dtype = scales.dtype if scales is not None and scales.is_floating_point() else torch.float16
        qlayer = QuantLinear(linear.in_features, linear.out_features, *scheme_of(name),
                             linear.bias is not None, scale_dtype)
        set_module(model, name, qlayer)
        for suffix in QUANT_SUFFIXES:
            if f"{name}.{suffix}" not in state:
                raise CheckpointError(
                    f"checkpoint {path} is missing tensor {name}.{suffix}; re-create it"
                )
    _load_strict(model, state, path)
    if fmt == "gptq":
        for name in quant_names:
            layer = get_module(model, name)
            layer.qzeros.copy_(pack_cols(unpack_cols(layer.qzeros, layer.bits) + 1, layer.bits))
    elif fmt != "gptq_v2":
        raise CheckpointError(f"unsupported checkpoint_format {fmt!r} in {path}/config.json")
    model.tie_weights()
    model.eval()
    _bound_kernel_caches(model)
    return model


def _bound_kernel_caches(model: nn.Module, share: float = 0.25) -> None:
    """No per-layer dequantized-weight cache when those caches (float32 worst case) would
    take more than `share` of the RAM available: a big model then dequantizes per call."""
    import psutil

    layers = quant_modules(model).values()
    floats = sum(4 * m.in_features * m.out_features for m in layers)
    if floats > share * psutil.virtual_memory().available:
        for m in layers:
            m.cache_dequantized = False


def _as_gptq_state(state: dict[str, torch.Tensor], method: str,
                   scheme_of: Any) -> dict[str, torch.Tensor]:
    """A compressed-tensors or AWQ state dict rewritten as GPTQ buffers (true zero points)."""
    from qcal.packing import formats

    marker = ".weight_packed" if method == "compressed-tensors" else ".qweight"
    names = sorted({k[: -len(marker)] for k in state if k.endswith(marker)})
    out = dict(state)
    for name in names:
        bits, group_size = scheme_of(name)
        try:
            codes = (formats.ct_codes(state, name, bits, group_size) if method != "awq"
                     else formats.awq_codes(state, name, bits, group_size))
        except CheckpointError:
            raise  # already one line naming the tensor
        except (KeyError, RuntimeError, ValueError) as err:
            raise CheckpointError(f"{method} tensors of {name} are incomplete or mis-shaped "
                                  f"({str(err).splitlines()[0][:120]}); re-create the checkpoint") from None
        for key in [k for k in state if k.startswith(name + ".") and k != f"{name}.bias"]:
            out.pop(key)
        out[f"{name}.qweight"] = pack_rows(codes.codes.T.contiguous().to(torch.int64), bits)
        out[f"{name}.qzeros"] = pack_cols(codes.zeros.to(torch.int64), bits)
        out[f"{name}.scales"] = codes.scales
        out[f"{name}.g_idx"] = codes.g_idx.to(torch.int32)
    return out


def _load_strict(model: nn.Module, state: dict[str, torch.Tensor], path: Path) -> None:
    expected = model.state_dict()
    tied = getattr(model.config, "tie_word_embeddings", False)
    for key, ref in expected.items():
        if key not in state:
            if tied and key == "lm_head.weight":
                continue
            raise CheckpointError(f"checkpoint {path} is missing tensor {key}; re-create it")
        if tuple(state[key].shape) != tuple(ref.shape):
            raise CheckpointError(
                f"checkpoint tensor {key} has shape {tuple(state[key].shape)}, expected "
                f"{tuple(ref.shape)}; the checkpoint does not match its config.json"
            )
    unexpected = sorted(set(state) - set(expected))
    if unexpected:
        raise CheckpointError(f"checkpoint {path} has unexpected tensors: {unexpected[:5]}")
    # assign: the skeleton's parameters are meta; float tensors take the model's dtype.
    model.load_state_dict({key: state[key].to(ref.dtype) if ref.is_floating_point() else state[key]
                           for key, ref in expected.items() if key in state},
                          strict=False, assign=True)
