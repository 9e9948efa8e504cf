"""Reading quantized checkpoints back into a model: GPTQ layout (v1 or v2 zero points),
compressed-tensors and AutoAWQ's GEMM layout, per-module schemes included.

The model is built on meta from config.json, its quantized linears replaced by
`QuantLinear`s of the scheme the config gives each, the other formats' tensors rewritten
as GPTQ buffers, and every tensor assigned from the files with its name and shape
checked. The layout and the writing side are qcal.packing.checkpoint.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from qcal_kernels.format import PACKABLE_BITS, pack_cols, pack_rows, unpack_cols
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from qcal.errors import CheckpointError, ModelNotFoundError
from qcal.module_tree import get_module, set_module
from qcal.packing.checkpoint import QUANT_METHODS, QUANT_SUFFIXES, quant_modules
from qcal.packing.naming import memory_namer
from qcal.packing.qlinear import QuantLinear


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
