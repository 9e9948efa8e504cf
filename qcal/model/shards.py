"""Sharded checkpoints: written a shard at a time, assembled from per-layer files.

A streamed quantization (qcal.model.stream) leaves one safetensors file per finished
decoder layer in the work directory. `save_streamed_checkpoint` turns them into the
checkpoint layer by layer: each layer is read, converted to the output format and
handed to `write_sharded`, which never holds a shard in memory: a small one-shard
checkpoint is a single `model.safetensors` written exactly as `save_checkpoint` writes
it (same tensors, same bytes); larger ones are written to disk at planned offsets, as
`model-0000i-of-0000N.safetensors` plus the standard `model.safetensors.index.json`
(which transformers, GPTQModel and vLLM read) above the shard size.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from qcal_kernels.format import unpack_cols
from safetensors import safe_open
from torch import nn

from qcal.errors import CheckpointError
from qcal.fsio import write_dir_atomically
from qcal.model.arch import decoder_layers
from qcal.model.offload import DiskWeights
from qcal.model.resolve import arch_for
from qcal.model.stream import free_layer, layer_file, outside_layer_names, read_layer_state
from qcal.packing import checkpoint  # its save_file: one writer to patch in fault tests
from qcal.packing.checkpoint import (
    CHECKPOINT_KIND,
    FORMATS,
    WEIGHTS_NAME,
    _state_for_disk,
    convert_quant_state,
    model_float_dtype,
    on_disk,
    other_format_config,
    quant_modules,
    quantization_config,
    write_side_files,
)

INDEX_NAME = "model.safetensors.index.json"
DEFAULT_SHARD_BYTES = 2 * 10**9


SAFETENSORS_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16",
                      torch.bfloat16: "BF16", torch.int64: "I64", torch.int32: "I32",
                      torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL"}
# Up to this size a one-shard checkpoint is built in memory and written by safetensors
# itself (byte for byte what save_checkpoint writes); larger ones stream to disk.
IN_MEMORY_BYTES = 512 * 2**20

Entry = tuple[str, torch.dtype, tuple[int, ...]]


def _nbytes(dtype: torch.dtype, shape: tuple[int, ...]) -> int:
    return math.prod(shape) * torch.empty((), dtype=dtype).element_size()


def plan_shards(groups: list[list[Entry]], shard_bytes: int) -> list[list[Entry]]:
    """Tensors (in groups that stay whole where they fit: a layer's) cut into shards of at
    most `shard_bytes` (a single larger tensor gets a shard of its own)."""
    shards: list[list[Entry]] = [[]]
    size = 0
    for group in groups:
        for entry in group:
            nbytes = _nbytes(entry[1], entry[2])
            if shards[-1] and size + nbytes > shard_bytes:
                shards.append([])
                size = 0
            shards[-1].append(entry)
            size += nbytes
    return shards


class _ShardFile:
    """One safetensors file written at planned offsets: the header first (computed from the
    plan), then each tensor where the plan put it, so no shard is ever held in memory.
    Larger element sizes come first, so every tensor starts aligned to its element size."""

    def __init__(self, path: Path, entries: list[Entry]) -> None:
        ordered = sorted(entries, key=lambda e: (-torch.empty((), dtype=e[1]).element_size(), e[0]))
        header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
        self.offsets: dict[str, tuple[int, Entry]] = {}
        offset = 0
        for entry in ordered:
            name, dtype, shape = entry
            nbytes = _nbytes(dtype, shape)
            header[name] = {"dtype": SAFETENSORS_DTYPES[dtype], "shape": list(shape),
                            "data_offsets": [offset, offset + nbytes]}
            self.offsets[name] = (offset, entry)
            offset += nbytes
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        self.data_start = 8 + len(raw)
        self.handle = path.open("wb")
        self.handle.write(len(raw).to_bytes(8, "little") + raw)
        self.handle.truncate(self.data_start + offset)
        self.pending = set(self.offsets)

    def write(self, name: str, t: torch.Tensor) -> None:
        offset, (_, dtype, shape) = self.offsets[name]
        if t.dtype != dtype or tuple(t.shape) != shape:
            raise CheckpointError(f"tensor {name} came out as {t.dtype} {tuple(t.shape)}, planned "
                                  f"as {dtype} {shape}; re-run `qcal quantize`")
        self.handle.seek(self.data_start + offset)
        self.handle.write(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().data)
        self.pending.discard(name)

    def close(self) -> None:
        self.handle.close()
        if self.pending:
            raise CheckpointError(f"shard {self.handle.name} lacks planned tensors "
                                  f"{sorted(self.pending)[:3]}; re-run `qcal quantize`")


def write_sharded(out_dir: Path, produce: Callable[[], Iterator[dict[str, torch.Tensor]]],
                  shard_bytes: int = DEFAULT_SHARD_BYTES) -> list[Path]:
    """Write the tensors `produce()` yields (group by group, e.g. a layer at a time) as
    `model.safetensors`, or as shards plus the standard index when they exceed
    `shard_bytes`. `produce` is called twice (plan, then write) and must yield the same
    names, dtypes and shapes both times; memory holds one group, never a shard."""
    groups = [[(k, v.dtype, tuple(v.shape)) for k, v in group.items()] for group in produce()]
    shards = plan_shards(groups, shard_bytes)
    total = sum(_nbytes(e[1], e[2]) for shard in shards for e in shard)
    if len(shards) == 1 and total <= IN_MEMORY_BYTES:
        state: dict[str, torch.Tensor] = {}
        for group in produce():
            state.update(group)
        checkpoint.save_file(state, str(out_dir / WEIGHTS_NAME), metadata={"format": "pt"})
        return [out_dir / WEIGHTS_NAME]
    n = len(shards)
    names = [WEIGHTS_NAME] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors"
                                           for i in range(n)]
    shard_of = {e[0]: i for i, shard in enumerate(shards) for e in shard}
    current: tuple[int, _ShardFile] | None = None
    for group in produce():
        for name, t in group.items():
            i = shard_of[name]
            if current is None or current[0] != i:
                if current is not None:
                    current[1].close()
                current = (i, _ShardFile(out_dir / names[i], shards[i]))
            current[1].write(name, t)
    if current is not None:
        current[1].close()
    if n > 1:
        index = {"metadata": {"total_size": total},
                 "weight_map": {name: names[shard_of[name]] for name in sorted(shard_of)}}
        (out_dir / INDEX_NAME).write_text(json.dumps(index, indent=2))
    return [out_dir / name for name in names]


def _layer_has_zero_point_0(path: Path) -> bool:
    """Whether a layer file stores a true zero point of 0 (the v1 layout cannot hold it)."""
    with safe_open(str(path), "pt") as handle:
        meta = json.loads((handle.metadata() or {}).get("quant", "{}"))
        for name, (_, _, bits, *_rest) in meta.items():
            if bool((unpack_cols(handle.get_tensor(f"{name}.qzeros"), int(bits)) == 0).any()):
                return True
    return False


def save_streamed_checkpoint(
    model: nn.Module, out_dir: Path | str, tokenizer: Any = None, *, sym: bool,
    work_dir: Path, source_dir: Path, fields: dict[str, Any] | None = None,
    meta: dict[str, Any] | None = None, extra_files: dict[str, str | bytes] | None = None,
    fmt: str = "gptq", shard_bytes: int = DEFAULT_SHARD_BYTES,
) -> Path:
    """`save_checkpoint` for a skeleton whose quantized layers are files in `work_dir`
    (qcal.model.stream.write_layer_state) and whose other tensors are in `source_dir`.

    Memory: one layer plus one shard. Atomic like `save_checkpoint`."""
    if fmt not in FORMATS:
        raise CheckpointError(f"unknown checkpoint format {fmt!r}; known: {', '.join(FORMATS)}")
    arch = arch_for(model)
    layers = decoder_layers(model, arch)
    files = [layer_file(work_dir, i) for i in range(len(layers))]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise CheckpointError(f"{work_dir} lacks the quantized layers {missing[:3]}; re-run "
                              "`qcal quantize` (with --resume to keep the finished layers)")
    storage = fmt
    if fmt == "gptq":  # v1 unless a zero point of 0 occurs anywhere (see checkpoint.py)
        storage = "gptq_v2" if any(_layer_has_zero_point_0(f) for f in files) else "gptq"
    dtype = model_float_dtype(model)
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    weights = DiskWeights(source_dir)

    found: dict[str, Any] = {"first": None, "actorder": False}

    def produce() -> Iterator[dict[str, torch.Tensor]]:
        for index, path in enumerate(files):
            read_layer_state(layers[index], path)
            prefix = f"{arch.layers_path}.{index}."
            found["first"] = found["first"] or next(iter(quant_modules(layers[index]).values()),
                                                    None)
            state = _state_for_disk(layers[index], storage if fmt.startswith("gptq") else
                                    "gptq_v2", prefix, tied=False)
            if not fmt.startswith("gptq"):
                found["actorder"] = convert_quant_state(state, layers[index], fmt, sym, dtype,
                                                        prefix) or found["actorder"]
            free_layer(layers, index)
            yield on_disk(state, model.config)
        for outside in _outside_tensors(model, arch, weights, dtype, tied):
            yield on_disk(outside, model.config)

    def fill(tmp: Path) -> None:
        write_sharded(tmp, produce, shard_bytes)
        first = found["first"]
        if first is None:
            raise CheckpointError("the model has no QuantLinear layers: quantize it before saving")
        qcfg = (quantization_config(first, sym, storage, meta or {}, fields)
                if fmt.startswith("gptq")
                else other_format_config(model, fmt, first, sym, found["actorder"], fields or {}))
        write_side_files(tmp, model, qcfg, fmt, tokenizer, extra_files)

    write_dir_atomically(Path(out_dir), fill, CHECKPOINT_KIND)
    return Path(out_dir)


def _outside_tensors(model: nn.Module, arch: Any, weights: DiskWeights, dtype: torch.dtype,
                     tied: bool) -> Iterator[dict[str, torch.Tensor]]:
    """Embeddings, final norm, head, one at a time: read from the float files in the model's
    dtype, as a full load would hold them (the skeleton may have left the head on meta)."""
    held = model.state_dict()
    for name in outside_layer_names(model, arch):
        if tied and name == "lm_head.weight":
            continue
        if name in weights.files:
            # Read without a mapping, and no copy when the dtype already matches: a
            # 151k-token vocabulary makes the embedding and the untied head 0.9 GB each in
            # float32, and a mapped view copied out doubled that (qcal.tensor_files).
            t = weights.read(name)
            target = dtype if t.is_floating_point() else t.dtype
            yield {name: t.to(target)}
        elif not held[name].is_meta:
            yield {name: held[name].detach().contiguous().cpu()}
        else:
            raise CheckpointError(f"tensor {name} is in no weight file of {weights.model_dir}; "
                                  "the model directory is incomplete: restore it")
