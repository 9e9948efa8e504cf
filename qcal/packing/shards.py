"""Sharded checkpoints: written a shard at a time, assembled from per-layer files.

A streamed quantization (qcal.model.stream) leaves one safetensors file per finished
decoder layer in the work directory. `save_streamed_checkpoint` turns them into the
checkpoint layer by layer: each layer is read, converted to the output format and
handed to a `ShardWriter`, which holds at most one shard in memory. A checkpoint that
fits one shard is a single `model.safetensors` written exactly as `save_checkpoint`
writes it (same tensors, same bytes); larger ones are `model-0000i-of-0000N.safetensors`
plus the standard `model.safetensors.index.json`, which transformers, GPTQModel and
vLLM read.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from qcal_kernels.format import unpack_cols
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from qcal.errors import CheckpointError
from qcal.fsio import write_dir_atomically
from qcal.model.arch import arch_for, decoder_layers
from qcal.model.offload import DiskWeights
from qcal.model.stream import free_layer, layer_file, outside_layer_names, read_layer_state
from qcal.packing.checkpoint import (
    CHECKPOINT_KIND,
    FORMATS,
    WEIGHTS_NAME,
    _state_for_disk,
    convert_quant_state,
    model_float_dtype,
    other_format_config,
    quant_modules,
    quantization_config,
    write_side_files,
)

INDEX_NAME = "model.safetensors.index.json"
DEFAULT_SHARD_BYTES = 2 * 10**9


class ShardWriter:
    """Collects tensors and writes a shard whenever the next tensor would overflow it."""

    def __init__(self, out_dir: Path, shard_bytes: int = DEFAULT_SHARD_BYTES) -> None:
        self.out_dir, self.shard_bytes = Path(out_dir), int(shard_bytes)
        self.pending: dict[str, torch.Tensor] = {}
        self.pending_bytes = 0
        self.shards: list[tuple[Path, list[str]]] = []
        self.total = 0

    def add(self, tensors: dict[str, torch.Tensor]) -> None:
        for name, t in tensors.items():
            nbytes = t.numel() * t.element_size()
            if self.pending and self.pending_bytes + nbytes > self.shard_bytes:
                self._flush()
            self.pending[name] = t
            self.pending_bytes += nbytes
            self.total += nbytes

    def _flush(self) -> None:
        path = self.out_dir / f"shard-{len(self.shards):05d}.partial"
        save_file(self.pending, str(path), metadata={"format": "pt"})
        self.shards.append((path, list(self.pending)))
        self.pending, self.pending_bytes = {}, 0

    def close(self) -> list[Path]:
        """Write the last shard, name the files, write the index (more than one shard)."""
        if self.pending or not self.shards:
            self._flush()
        if len(self.shards) == 1:
            final = self.out_dir / WEIGHTS_NAME
            self.shards[0][0].rename(final)
            return [final]
        n = len(self.shards)
        weight_map: dict[str, str] = {}
        paths = []
        for i, (path, names) in enumerate(self.shards):
            final = self.out_dir / f"model-{i + 1:05d}-of-{n:05d}.safetensors"
            path.rename(final)
            paths.append(final)
            weight_map.update({name: final.name for name in names})
        index = {"metadata": {"total_size": self.total},
                 "weight_map": dict(sorted(weight_map.items()))}
        (self.out_dir / INDEX_NAME).write_text(json.dumps(index, indent=2))
        return paths


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

    def fill(tmp: Path) -> None:
        writer = ShardWriter(tmp, shard_bytes)
        first, actorder = None, False
        for index, path in enumerate(files):
            read_layer_state(layers[index], path)
            prefix = f"{arch.layers_path}.{index}."
            first = first or next(iter(quant_modules(layers[index]).values()), None)
            state = _state_for_disk(layers[index], storage if fmt.startswith("gptq") else
                                    "gptq_v2", prefix, tied=False)
            if not fmt.startswith("gptq"):
                actorder = convert_quant_state(state, layers[index], fmt, sym, dtype,
                                               prefix) or actorder
            writer.add(state)
            free_layer(layers, index)
        if first is None:
            raise CheckpointError("the model has no QuantLinear layers: quantize it before saving")
        writer.add(_outside_tensors(model, arch, weights, dtype, tied))
        writer.close()
        qcfg = (quantization_config(first, sym, storage, meta or {}, fields)
                if fmt.startswith("gptq")
                else other_format_config(model, fmt, first, sym, actorder, fields or {}))
        write_side_files(tmp, model, qcfg, fmt, tokenizer, extra_files)

    write_dir_atomically(Path(out_dir), fill, CHECKPOINT_KIND)
    return Path(out_dir)


def _outside_tensors(model: nn.Module, arch: Any, weights: DiskWeights, dtype: torch.dtype,
                     tied: bool) -> dict[str, torch.Tensor]:
    """Embeddings, final norm, head: read from the float files in the model's dtype, as a
    full load would hold them (the skeleton may have left the head on meta)."""
    out: dict[str, torch.Tensor] = {}
    held = model.state_dict()
    for name in outside_layer_names(model, arch):
        if tied and name == "lm_head.weight":
            continue
        if name in weights.files:
            with safe_open(str(weights.files[name]), "pt") as handle:
                t = handle.get_tensor(name)
            target = dtype if t.is_floating_point() else t.dtype
            out[name] = t.to(target, copy=True).contiguous()
        elif not held[name].is_meta:
            out[name] = held[name].detach().contiguous().cpu()
        else:
            raise CheckpointError(f"tensor {name} is in no weight file of {weights.model_dir}; "
                                  "the model directory is incomplete: restore it")
    return out
