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
from qcal_kernels.format import PACKABLE_BITS, pack_cols, pack_transposed, unpack_cols
from torch import nn

from qcal.errors import CheckpointError, ModelNotFoundError
from qcal.module_tree import get_module, set_module
from qcal.packing.checkpoint import QUANT_METHODS, QUANT_SUFFIXES, quant_modules
from qcal.packing.naming import memory_namer
from qcal.packing.qlinear import QuantLinear
from qcal.tensor_files import StoredTensor, TensorFileError, index_file, read_stored


def _index_files(path: Path) -> dict[str, StoredTensor]:
    """Stored key -> where its bytes are, from the safetensors headers alone."""
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelNotFoundError(f"no *.safetensors file in {path}; re-run `qcal quantize`")
    where: dict[str, StoredTensor] = {}
    for f in files:
        try:
            where.update(index_file(f))
        except (OSError, TensorFileError) as err:
            raise CheckpointError(f"checkpoint file {f} is corrupted or truncated "
                                  f"({str(err).splitlines()[0] if str(err) else type(err).__name__}); "
                                  "re-create it with `qcal quantize`") from None
    return where


def _read(stored: StoredTensor) -> torch.Tensor:
    """One tensor, read straight into memory of its own (qcal.tensor_files): an 805 MB
    embedding copied out of a mapping was held twice, and copying slices instead left the
    allocator's heap fragmented by the slices."""
    try:
        return read_stored(stored)
    except (OSError, TensorFileError) as err:
        raise CheckpointError(f"checkpoint file {stored.file} is truncated or unreadable "
                              f"({err}); re-create it with `qcal quantize`") from None


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

        groups = [group_size, *(int((f or {}).get("group_size", group_size))
                                for f in (dynamic or {}).values())]
        if any(g == 0 or g < -1 for g in groups):
            raise CheckpointError(f"{path}/config.json says group_size="
                                  f"{next(g for g in groups if g == 0 or g < -1)}; a group size "
                                  "is -1 (per channel) or positive: fix config.json or re-create "
                                  "it with `qcal quantize`")

        def scheme_of(name: str) -> tuple[int, int]:  # GPTQModel's per-module `dynamic` rules
            return dynamic_scheme(dynamic, name, bits, group_size)
    unpackable = sorted(all_bits - set(PACKABLE_BITS))
    if unpackable:
        raise CheckpointError(f"{path}/config.json says bits={unpackable[0]}; qcal's checkpoints "
                              f"hold {PACKABLE_BITS}-bit weights: fix config.json or re-create it")
    # Original checkpoint names (Mixtral's block_sparse_moe.experts.<i>.w1, ...) -> qcal's.
    to_memory = memory_namer(str(raw.get("model_type", "")), (raw.get("architectures") or [None])[0])
    where = {to_memory(k): v for k, v in _index_files(path).items()}
    marker = {"compressed-tensors": ".weight_packed"}.get(method, ".qweight")
    quant_names = sorted({k[: -len(marker)] for k in where if k.endswith(marker)})
    fmt = qcfg.get("checkpoint_format", "gptq") if method == "gptq" else "gptq_v2"
    if fmt not in ("gptq", "gptq_v2"):
        raise CheckpointError(f"unsupported checkpoint_format {fmt!r} in {path}/config.json")

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
    linears = {}
    for name in quant_names:
        try:
            linears[name] = get_module(model, name)
        except AttributeError:
            raise CheckpointError(f"checkpoint tensor {name}{marker} names no module") from None
    _check_names(model, where, linears, method == "gptq", path)
    # The stored tensors by the module that takes them: a quantized linear (by leaf name),
    # or any other module (parameters and buffers assigned as they are).
    of_linear: dict[str, dict[str, StoredTensor]] = {name: {} for name in linears}
    rest: dict[str, dict[str, StoredTensor]] = {}
    for key, stored in where.items():
        owner = _owner(key, linears)
        if owner is not None:
            of_linear[owner][key[len(owner) + 1:]] = stored
        else:
            module_name, _, leaf = key.rpartition(".")
            rest.setdefault(module_name, {})[leaf] = stored
    # One module at a time: read, convert to the GPTQ buffers, assign. Memory holds the
    # model loaded so far plus one module's tensors, never the files' whole contents too.
    for name, linear in linears.items():
        local = {leaf: _read(stored) for leaf, stored in of_linear[name].items()}
        buffers = _gptq_buffers(local, name, method, *scheme_of(name))
        with torch.device("meta"):  # every buffer is assigned from the file just below
            qlayer = QuantLinear(linear.in_features, linear.out_features, *scheme_of(name),
                                 linear.bias is not None, buffers["scales"].dtype)
        _assign(qlayer, buffers, f"{name}.", path)
        if fmt == "gptq":  # v1 stores zero points minus one
            qlayer.qzeros = pack_cols(unpack_cols(qlayer.qzeros, qlayer.bits) + 1, qlayer.bits)
        set_module(model, name, qlayer)
    for module_name, leaves in rest.items():
        module = get_module(model, module_name) if module_name else model
        _assign(module, {leaf: _read(stored) for leaf, stored in leaves.items()},
                f"{module_name}." if module_name else "", path)
    model.tie_weights()
    model.eval()
    _bound_kernel_caches(model)
    return model


def _owner(key: str, linears: dict[str, nn.Module]) -> str | None:
    """The quantized module a key belongs to, if any (a prefix of the key, found by walking
    up its dotted path rather than scanning every module)."""
    parts = key.split(".")
    return next((p for p in (".".join(parts[:i]) for i in range(1, len(parts))) if p in linears),
                None)


def _check_names(model: nn.Module, where: dict[str, Any], linears: dict[str, nn.Module],
                 gptq_layout: bool, path: Path) -> None:
    """Missing and unexpected tensors, from the names alone, before any tensor is read."""
    quant_keys = {f"{n}.{s}" for n, lin in linears.items()
                  for s in (*QUANT_SUFFIXES, *(("bias",) if lin.bias is not None else ()))}
    expected = {k for k in model.state_dict() if _owner(k, linears) is None} | quant_keys
    if gptq_layout:  # stored as the buffers are named
        stored = set(where)
    else:  # other formats' tensors of a quantized module become its GPTQ buffers
        stored = {k for k in where if _owner(k, linears) is None}
        for name in linears:
            stored |= {f"{name}.{s}" for s in QUANT_SUFFIXES}
            if f"{name}.bias" in where:
                stored.add(f"{name}.bias")
    tied = getattr(model.config, "tie_word_embeddings", False)
    missing = sorted(k for k in expected - stored if not (tied and k == "lm_head.weight"))
    if missing:
        raise CheckpointError(f"checkpoint {path} is missing tensor {missing[0]}; re-create it")
    unexpected = sorted(stored - expected)
    if unexpected:
        raise CheckpointError(f"checkpoint {path} has unexpected tensors: {unexpected[:5]}")


def _assign(module: nn.Module, tensors: dict[str, torch.Tensor], prefix: str, path: Path) -> None:
    """Give `module` these tensors (its own parameters and buffers, by leaf name), shapes
    checked; float tensors take the dtype the module declares."""
    expected = dict(module.named_parameters(recurse=False)) | dict(module.named_buffers(recurse=False))
    for leaf, t in tensors.items():
        ref = expected.get(leaf)
        if ref is None:
            raise CheckpointError(f"checkpoint {path} has unexpected tensors: {[prefix + leaf]}")
        if tuple(t.shape) != tuple(ref.shape):
            raise CheckpointError(
                f"checkpoint tensor {prefix}{leaf} has shape {tuple(t.shape)}, expected "
                f"{tuple(ref.shape)}; the checkpoint does not match its config.json"
            )
    module.load_state_dict({leaf: t.to(_float_as(expected[leaf], t))
                            for leaf, t in tensors.items()}, strict=False, assign=True)


def _float_as(ref: torch.Tensor, t: torch.Tensor) -> torch.dtype:
    return ref.dtype if ref.is_floating_point() else t.dtype


def _bound_kernel_caches(model: nn.Module, share: float = 0.25) -> None:
    """No per-layer dequantized-weight cache when those caches (float32 worst case) would
    take more than `share` of the RAM available: a big model then dequantizes per call."""
    import psutil

    layers = quant_modules(model).values()
    floats = sum(4 * m.in_features * m.out_features for m in layers)
    if floats > share * psutil.virtual_memory().available:
        for m in layers:
            m.cache_dequantized = False


def _gptq_buffers(local: dict[str, torch.Tensor], name: str, method: str, bits: int,
                  group_size: int) -> dict[str, torch.Tensor]:
    """One quantized module's stored tensors (by leaf name) as GPTQ buffers; other formats
    are rewritten with true zero points."""
    if method == "gptq":
        return local
    from qcal.packing import formats

    state = {f"{name}.{leaf}": t for leaf, t in local.items()}
    try:
        codes = (formats.ct_codes(state, name, bits, group_size) if method != "awq"
                 else formats.awq_codes(state, name, bits, group_size))
    except CheckpointError:
        raise  # already one line naming the tensor
    except (KeyError, RuntimeError, ValueError) as err:
        raise CheckpointError(f"{method} tensors of {name} are incomplete or mis-shaped "
                              f"({str(err).splitlines()[0][:120]}); re-create the checkpoint") from None
    out = {"qweight": pack_transposed(codes.codes, bits),
           "qzeros": pack_cols(codes.zeros.to(torch.int64), bits),
           "scales": codes.scales, "g_idx": codes.g_idx.to(torch.int32)}
    if "bias" in local:
        out["bias"] = local["bias"]
    return out
