"""On-disk formats of a quantized linear besides the GPTQ layout, both directions.

- `compressed-tensors` "pack-quantized" (qcal's default: vLLM serves it natively and
  transformers loads it with the `compressed-tensors` package alone): per linear
  `weight_packed` int32 [out, in*bits/32] (codes along in_features, element i at bit
  i*bits, stored with the signed offset 2**(bits-1)), `weight_scale` [out, groups] in the
  model's float dtype, `weight_zero_point` int32 [out*bits/32, groups] (asymmetric only;
  packed along out), `weight_shape` [2]. compressed-tensors 0.20 stores act-order only as
  `actorder: "weight"` (columns visited in activation order, groups contiguous: GPTQ's
  static groups), so it has no `weight_g_idx`; qcal still reads one in older files.
- AWQ GEMM (`quant_method: awq`, `version: gemm`, AutoAWQ's layout): `qweight` int32
  [in, out/8] and `qzeros` int32 [groups, out/8], both packing 8 output columns per word
  in the interleaved order 0 2 4 6 1 3 5 7; `scales` fp16 [groups, out]; 4-bit, groups
  contiguous, true zero points.

Every format maps to and from `LinearCodes` (unsigned codes, zero points, scales, g_idx),
which `QuantLinear` stores in the GPTQ layout, so any supported checkpoint loads as
QuantLinear and any QuantLinear model saves in any format.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import torch
from qcal_kernels.format import pack_cols, pack_rows, unpack_cols, unpack_rows

from qcal.errors import CheckpointError

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
CT_FORMAT = "pack-quantized"


@dataclasses.dataclass
class LinearCodes:
    """A quantized linear, format-neutral:
    w[o, i] = (codes[o, i] - zeros[g_idx[i], o]) * scales[g_idx[i], o]."""

    codes: torch.Tensor  # int [out, in], 0..2**bits-1
    zeros: torch.Tensor  # int [groups, out]
    scales: torch.Tensor  # float [groups, out]
    g_idx: torch.Tensor  # int [in]
    bits: int
    group_size: int

    @property
    def contiguous_groups(self) -> bool:
        n_in = self.codes.shape[1]
        g = n_in if self.group_size == -1 else self.group_size
        return bool(torch.equal(self.g_idx.long(), torch.arange(n_in) // g))


def codes_of(layer: Any) -> LinearCodes:
    """The codes of a QuantLinear."""
    return LinearCodes(unpack_rows(layer.qweight, layer.bits).T.contiguous(),
                       unpack_cols(layer.qzeros, layer.bits), layer.scales.detach().clone(),
                       layer.g_idx.detach().clone(), layer.bits, layer.group_size)


def load_codes(layer: Any, c: LinearCodes) -> None:
    """Fill a QuantLinear (of matching shape) from `c`."""
    with torch.no_grad():
        layer.qweight.copy_(pack_rows(c.codes.T.contiguous().to(torch.int64), c.bits))
        layer.qzeros.copy_(pack_cols(c.zeros.to(torch.int64), c.bits))
        layer.scales.copy_(c.scales.to(layer.scales.dtype))
        layer.g_idx.copy_(c.g_idx.to(torch.int32))


def require_whole_groups(name: str, c: LinearCodes, fmt: str) -> None:
    n_in = c.codes.shape[1]
    if c.group_size != -1 and n_in % c.group_size:
        raise CheckpointError(
            f"{name} has in_features={n_in}, not a multiple of group_size={c.group_size}; the "
            f"{fmt} format needs whole groups: quantize with a group size that divides it "
            "(64 or 32 for the default model)"
        )


# --- compressed-tensors pack-quantized ------------------------------------------------------

def ct_tensors(name: str, c: LinearCodes, dtype: torch.dtype, sym: bool) -> dict[str, torch.Tensor]:
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

    require_whole_groups(name, c, "compressed-tensors")
    if not c.contiguous_groups:
        raise CheckpointError(
            f"{name} has act-order groups (g_idx), which compressed-tensors 0.20 cannot store; "
            "quantize with --desc-act --static-groups for compressed-tensors, or use --format gptq"
        )
    offset = 1 << (c.bits - 1)
    out = {f"{name}.weight_packed": pack_to_int32((c.codes - offset).to(torch.int8), c.bits),
           f"{name}.weight_scale": c.scales.T.contiguous().to(dtype),
           f"{name}.weight_shape": torch.tensor(list(c.codes.shape), dtype=torch.int64)}
    if not sym:
        zp = (c.zeros.T.contiguous() - offset).to(torch.int8)
        out[f"{name}.weight_zero_point"] = pack_to_int32(zp, c.bits, packed_dim=0)
    elif not bool((c.zeros == offset).all()):
        raise CheckpointError(f"{name}: a symmetric scheme needs zero points of {offset}")
    return out


def ct_codes(state: dict[str, torch.Tensor], name: str, bits: int, group_size: int) -> LinearCodes:
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32

    shape = torch.Size(int(v) for v in state[f"{name}.weight_shape"])
    packed = state[f"{name}.weight_packed"]
    words = -(-shape[1] * bits // 32)
    if tuple(packed.shape) != (shape[0], words):
        # The unpacker would read a prefix of the words without complaint.
        raise CheckpointError(f"checkpoint tensor {name}.weight_packed has shape "
                              f"{tuple(packed.shape)}, expected {(shape[0], words)} for "
                              f"{bits}-bit weights; the checkpoint does not match its config.json")
    offset = 1 << (bits - 1)
    # Codes in one byte each (an 8B model's widest linear: 59 MB, not 470 as int64): the
    # signed int8 values plus the offset, added modulo 256, are the unsigned codes exactly.
    codes = unpack_from_int32(packed, bits, shape).view(torch.uint8).add_(offset)
    scales = state[f"{name}.weight_scale"].T.contiguous()
    groups = scales.shape[0]
    if f"{name}.weight_zero_point" in state:
        zp = unpack_from_int32(state[f"{name}.weight_zero_point"], bits,
                               torch.Size((shape[0], groups)), packed_dim=0)
        zeros = zp.to(torch.int64).T.contiguous() + offset
    else:
        zeros = torch.full((groups, shape[0]), offset, dtype=torch.int64)
    g = shape[1] if group_size == -1 else group_size
    g_idx = state.get(f"{name}.weight_g_idx", torch.arange(shape[1]) // g)
    return LinearCodes(codes, zeros, scales, g_idx.to(torch.int32), bits, group_size)


def ct_config(groups: list[tuple[int, int, list[str]]], sym: bool, actorder: bool,
              ignore: list[str]) -> dict[str, Any]:
    """quantization_config of a pack-quantized checkpoint, built (and so validated) by
    compressed-tensors' own config classes, then serialized as its ModelCompressor does.

    `groups`: (bits, group size, targets) per scheme; one scheme targets every "Linear",
    several (per-module schemes) name their linears, so no module matches two groups."""
    import compressed_tensors
    from compressed_tensors.quantization import (
        ActivationOrdering,
        QuantizationArgs,
        QuantizationConfig,
        QuantizationScheme,
        QuantizationStatus,
    )

    schemes = {}
    for i, (bits, group_size, targets) in enumerate(groups):
        weights = QuantizationArgs(num_bits=bits, type="int", symmetric=sym,
                                   strategy="channel" if group_size == -1 else "group",
                                   group_size=None if group_size == -1 else group_size,
                                   actorder=ActivationOrdering.WEIGHT if actorder else None)
        schemes[f"group_{i}"] = QuantizationScheme(targets=targets, weights=weights,
                                                   format=CT_FORMAT)
    config = QuantizationConfig(config_groups=schemes, format=CT_FORMAT,
                                quantization_status=QuantizationStatus.COMPRESSED, ignore=ignore)
    out = {"version": compressed_tensors.__version__, **config.model_dump(mode="json")}
    if not sym and len(groups) == 1:
        # transformers' compressed path (compressed-tensors 0.20.1) sizes the model's zero
        # points unpacked, [out, groups], and refuses the packed ones every writer stores
        # (vLLM reads only those). `dequantize` is a documented CompressedTensorsConfig field
        # that transformers reads from config.json: it then decompresses at load time,
        # which unpacks them correctly; vLLM and compressed-tensors ignore the key.
        # transformers 5.24 dequantizes every dense linear with ONE config group's scheme,
        # so with several groups the flag would load wrong weights in silence; without it
        # transformers refuses such a file loudly (docs/formats.md).
        out["dequantize"] = True
    return out


def ct_targets(names: list[str], every: list[str]) -> list[str]:
    """Config-group targets that match exactly `names` among all quantized linears `every`:
    one `re:` pattern per kind of linear (its name with each index as `\\d+`, anchored at
    the end; compressed-tensors re.match-es from the start) where every linear of that kind
    is in `names`, else the linears' own names."""
    def kind(name: str) -> str:
        return r"\.".join(r"\d+" if part.isdigit() else re.escape(part)
                          for part in name.split("."))

    members: dict[str, set[str]] = {}
    for name in every:
        members.setdefault(kind(name), set()).add(name)
    chosen, out = set(names), []
    for name in names:
        pattern = kind(name)
        if members[pattern] <= chosen:
            if f"re:{pattern}$" not in out:
                out.append(f"re:{pattern}$")
        else:
            out.append(name)
    return out


def _validated_ct(qcfg: dict[str, Any]) -> None:
    """The checkpoint's quantization_config through compressed-tensors' own schema (its
    pydantic QuantizationConfig): a malformed one is one line, not an error deep in a loader."""
    from compressed_tensors.quantization import QuantizationConfig
    from pydantic import ValidationError

    try:
        QuantizationConfig.model_validate(qcfg)
    except (ValidationError, ValueError, TypeError) as err:
        first = err.errors()[0] if isinstance(err, ValidationError) else {"msg": str(err)}
        where = ".".join(str(x) for x in first.get("loc", ()))
        raise CheckpointError(f"config.json quantization_config is not a valid "
                              f"compressed-tensors config ({where + ': ' if where else ''}"
                              f"{str(first.get('msg'))[:160]}); re-create the checkpoint with "
                              "`qcal quantize` or `qcal export`") from None


def ct_groups(qcfg: dict[str, Any]) -> list[tuple[int, int, list[str]]]:
    """(bits, group size, targets) of each weight-only config group qcal can read."""
    if qcfg.get("format") != CT_FORMAT:
        raise CheckpointError(f"compressed-tensors format {qcfg.get('format')!r} is not supported; "
                              f"qcal reads {CT_FORMAT!r}")
    _validated_ct(qcfg)
    groups = list((qcfg.get("config_groups") or {}).values())
    if not groups or not all(isinstance(g, dict) and g.get("weights") for g in groups):
        raise CheckpointError("qcal reads compressed-tensors checkpoints whose config groups "
                              "are weight-only")
    out = []
    for g in groups:
        w = g["weights"]
        if w.get("type") != "int" or g.get("input_activations"):
            raise CheckpointError("qcal reads integer weight-only compressed-tensors checkpoints")
        group = -1 if w.get("strategy") == "channel" else int(w["group_size"])
        out.append((int(w["num_bits"]), group, list(g.get("targets") or [])))
    return out


def ct_scheme(qcfg: dict[str, Any]) -> tuple[int, int, list[str], list[str]]:
    """(bits, group size, targets, ignore) of the first config group."""
    bits, group, targets = ct_groups(qcfg)[0]
    return bits, group, targets, qcfg.get("ignore") or []


def ct_layer_scheme(groups: list[tuple[int, int, list[str]]], name: str) -> tuple[int, int]:
    """(bits, group size) of linear `name`: the group that names it (exactly or by a
    `re:` pattern) before one that targets every "Linear"."""
    for bits, group, targets in groups:
        for t in targets:
            if t == name or (t.startswith("re:") and _checkpoint_pattern("fullmatch", t[3:], name)):
                return bits, group
    for bits, group, targets in groups:
        if "Linear" in targets:
            return bits, group
    raise CheckpointError(f"no compressed-tensors config group targets {name}; the checkpoint "
                          "does not match its config.json")


# --- GPTQ layout: GPTQModel's per-module `dynamic` rules ---------------------------------

def dynamic_scheme(dynamic: dict[str, Any] | None, name: str, bits: int,
                   group_size: int) -> tuple[int, int]:
    """(bits, group size) of linear `name` under a GPTQ checkpoint's `dynamic` field: the
    first `+:` (or bare) pattern that re.match-es it, else the checkpoint's own."""
    for key, fields in (dynamic or {}).items():
        if key.startswith("-:"):
            continue
        pattern = key[2:] if key.startswith("+:") else key
        if _checkpoint_pattern("match", pattern, name):
            fields = fields or {}
            return int(fields.get("bits", bits)), int(fields.get("group_size", group_size))
    return bits, group_size


# --- AWQ GEMM ---------------------------------------------------------------------------

def _awq_pack(values: torch.Tensor, bits: int) -> torch.Tensor:
    """[rows, out] codes -> int32 [rows, out/8], 8 columns a word in AWQ_ORDER."""
    rows, cols = values.shape
    grouped = values.to(torch.int64).reshape(rows, cols // 8, 8)[:, :, list(AWQ_ORDER)]
    shifts = torch.arange(8, dtype=torch.int64) * bits
    words = (grouped << shifts).sum(-1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def _awq_unpack(words: torch.Tensor, bits: int) -> torch.Tensor:
    shifts = torch.arange(8, dtype=torch.int64) * bits
    fields = (words.to(torch.int64).unsqueeze(-1) >> shifts) & ((1 << bits) - 1)
    inverse = [AWQ_ORDER.index(j) for j in range(8)]
    return fields[:, :, inverse].reshape(words.shape[0], -1)


def awq_tensors(name: str, c: LinearCodes) -> dict[str, torch.Tensor]:
    require_whole_groups(name, c, "AWQ GEMM")
    if c.bits != 4 or not c.contiguous_groups:
        raise CheckpointError(f"{name}: the AWQ GEMM layout holds 4-bit weights with contiguous "
                              "groups (no act-order); use --format gptq or compressed-tensors")
    return {f"{name}.qweight": _awq_pack(c.codes.T.contiguous(), c.bits),
            f"{name}.qzeros": _awq_pack(c.zeros, c.bits),
            f"{name}.scales": c.scales.to(torch.float16)}


def awq_codes(state: dict[str, torch.Tensor], name: str, bits: int, group_size: int) -> LinearCodes:
    codes = _awq_unpack(state[f"{name}.qweight"], bits).T.contiguous()
    zeros = _awq_unpack(state[f"{name}.qzeros"], bits)
    n_in = codes.shape[1]
    g = n_in if group_size == -1 else group_size
    return LinearCodes(codes, zeros, state[f"{name}.scales"], (torch.arange(n_in) // g).to(torch.int32),
                       bits, group_size)


def awq_config(bits: int, group_size: int) -> dict[str, Any]:
    return {"quant_method": "awq", "bits": bits, "group_size": group_size, "zero_point": True,
            "version": "gemm", "modules_to_not_convert": None}


def _checkpoint_pattern(how: str, pattern: str, name: str) -> bool:
    """A pattern from a checkpoint's config.json matched with qcal.patterns' time bound."""
    from qcal.patterns import PatternError, fullmatch, match

    try:
        return (fullmatch if how == "fullmatch" else match)(pattern, name)
    except PatternError as err:
        raise CheckpointError(f"quantization_config pattern {str(pattern)[:80]!r}: {err}; fix "
                              "config.json") from None
