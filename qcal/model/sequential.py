"""The layer-wise driver shared by calibration-based quantizers (GPTQ, AWQ).

For each decoder layer in order: move it to the compute device, let the method
quantize it in place (given the layer's calibration inputs), run the *quantized*
layer to produce the next layer's inputs, move it back. Peak memory is one
layer plus the calibration activations, whatever the depth. After every layer the
driver checkpoints its state, so `resume=True` continues after the last finished
layer of an interrupted run.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save
from torch import nn
from tqdm.auto import tqdm

from qcal.cache import fingerprint
from qcal.errors import ConfigError
from qcal.fsio import atomic_write_bytes, atomic_write_text
from qcal.model.arch import ArchSpec, decoder_layers, get_module
from qcal.model.capture import LayerInputs, capture_layer0_inputs, run_layer
from qcal.model.distributed import SINGLE, DistContext
from qcal.model.offload import DiskWeights, return_freed_memory
from qcal.model.replay import release_replay
from qcal.model.stream import (
    ResumeStateError,
    activation_budget,
    free_layer,
    free_outside,
    is_streamed,
    layer_file,
    read_layer_state,
    read_state_file,
    spill_to_disk,
    write_layer_state,
)
from qcal.packing.qlinear import QuantLinear

LayerFn = Callable[[int, nn.Module, LayerInputs], dict[str, Any]]


PROGRESS_FILE = "progress.json"
HIDDEN_FILE = "next_hidden.json"  # index of one safetensors file per calibration batch


def _hidden_file(work_dir: Path, dist: DistContext) -> Path:
    return work_dir / (HIDDEN_FILE if not dist.active
                       else HIDDEN_FILE.replace(".json", f".rank{dist.rank}.json"))


def _batch_file(index_file: Path, batch: int) -> Path:
    return index_file.with_name(index_file.stem + f".b{batch:04d}.safetensors")


def _save_progress(work_dir: Path, index: int, layer: nn.Module, inputs: LayerInputs,
                   logs: dict[str, Any], fingerprint: str, dist: DistContext) -> None:
    """Resume state as safetensors + JSON only: loading it can never run code.

    Order matters for a kill at any point: the layer, then progress, then the hidden
    states tagged with their layer; resume takes the older of progress and hidden."""
    if dist.is_main:
        work_dir.mkdir(parents=True, exist_ok=True)
        write_layer_state(work_dir, index, layer)
        atomic_write_text(work_dir / PROGRESS_FILE,
                          json.dumps({"done": index, "fingerprint": fingerprint, "logs": logs}))
    dist.barrier()
    # One file per batch: the whole calibration set never has to sit in memory twice.
    index_file = _hidden_file(work_dir, dist)
    for i, h in enumerate(inputs.hidden):
        atomic_write_bytes(_batch_file(index_file, i),
                           save({"hidden": h.contiguous()}, metadata={"layer": str(index)}))
    atomic_write_text(index_file, json.dumps({"layer": index, "batches": len(inputs.hidden)}))
    dist.barrier()


def resume_fingerprint(method: str, model: nn.Module, cfg: Any, calib: torch.Tensor,
                       packed: bool) -> str:
    """What a resumed run must share with the interrupted one: method, model config, method
    config and calibration ids (qcal.cache's one fingerprint scheme)."""
    config = getattr(model, "config", None)
    name = str(getattr(config, "_name_or_path", type(model).__name__))
    model_config = config.to_dict() if config is not None else None
    return fingerprint(method, name, model_config, cfg, calib.detach().cpu().to(torch.int64),
                       packed)[:16]


def read_progress(work_dir: Path) -> dict[str, Any] | None:
    """The saved progress of an interrupted run in `work_dir`, or None if there is none."""
    progress = work_dir / PROGRESS_FILE
    if not progress.is_file():
        return None
    try:
        state = json.loads(progress.read_text())
        int(state["done"])
    except (OSError, ValueError, KeyError, TypeError):
        raise ResumeStateError(
            f"resume state file {progress} is corrupted; start over: run without --resume "
            "and with --overwrite"
        ) from None
    return state


def _resume(work_dir: Path, layers: nn.ModuleList, fingerprint: str,
            dist: DistContext = SINGLE
            ) -> tuple[int, list[torch.Tensor] | None, dict[str, Any]]:
    state = read_progress(work_dir)
    if state is None:
        return -1, None, {}
    if state.get("fingerprint") != fingerprint:
        raise ResumeStateError(
            f"{work_dir} holds progress of a different run (model, method or calibration "
            "changed); drop --resume and pass --overwrite to start over"
        )
    done = int(state["done"])
    if not -1 <= done < len(layers):
        raise ResumeStateError(f"resume state file {work_dir / PROGRESS_FILE} names layer {done} "
                               f"of a {len(layers)}-layer model; start over with --overwrite")
    hidden_file = _hidden_file(work_dir, dist)
    try:
        index = json.loads(hidden_file.read_text())
        tagged, batches = int(index["layer"]), int(index["batches"])
    except (OSError, ValueError, KeyError, TypeError):
        raise ResumeStateError(f"resume state file {hidden_file} is missing or corrupted; start "
                               "over: run without --resume and with --overwrite") from None
    # A kill between progress and hidden leaves the hidden states one layer behind.
    if dist.all_reduce_min(tagged) != tagged or tagged not in (done, done - 1):
        raise ResumeStateError(f"resume state in {work_dir} is inconsistent ({hidden_file.name} "
                               f"is after layer {tagged}, progress after {done}); start over: "
                               "run without --resume and with --overwrite")
    done = tagged
    for i in range(done + 1):
        streamed = any(p.is_meta for p in layers[i].parameters())
        read_layer_state(layers[i], layer_file(work_dir, i))
        if streamed:  # the checkpoint is assembled from the files; memory stays one layer
            free_layer(layers, i)
    hidden = []
    for i in range(batches):
        part, meta = read_state_file(_batch_file(hidden_file, i))
        if "hidden" not in part or meta.get("layer") != str(tagged):
            raise ResumeStateError(f"resume state file {_batch_file(hidden_file, i)} does not "
                                   f"belong to layer {tagged}; start over: run without --resume "
                                   "and with --overwrite")
        hidden.append(part["hidden"])
    return done, hidden, state.get("logs", {})


def sequential_quantize(
    model: nn.Module, arch: ArchSpec, calib_ids: torch.Tensor, quantize_layer: LayerFn, *,
    device: str = "cpu", batch_size: int = 8, progress: bool = True, desc: str = "layers",
    work_dir: Path | None = None, resume: bool = False, fingerprint: str = "",
    store_dtype: torch.dtype | None = None, weights: DiskWeights | None = None,
    dist: DistContext = SINGLE, max_memory: int | None = None,
) -> dict[str, Any]:
    """Run `quantize_layer(index, layer, inputs)` over all decoder layers; returns its logs.

    `store_dtype` (e.g. torch.float16) keeps the calibration activations between
    layers compactly; by default they keep the model's dtype. `weights` (the directory
    a freshly loaded model came from) re-reads each layer's float weights right before
    it is quantized, so the memory-mapped float model never becomes resident. The
    process's allocator is tuned to hand freed layers back (see `return_freed_memory`).
    Calibration activations above `max_memory` bytes (None: a share of the available RAM)
    live in memory-mapped files in `work_dir` instead of RAM (qcal.model.stream).
    """
    layers = decoder_layers(model, arch)
    logs: dict[str, Any] = {}
    start, hidden = 0, None
    return_freed_memory()
    if resume and work_dir is not None:
        done, hidden, logs = _resume(work_dir, layers, fingerprint, dist)
        start = done + 1
    # The keyword inputs (rotary embeddings, masks; per layer where they differ, as in
    # Gemma3) are cheap to recompute, so resume state stores only the hidden states.
    inputs = capture_layer0_inputs(model, arch, calib_ids, batch_size, device, store_dtype)
    if weights is not None and work_dir is not None and is_streamed(model):
        free_outside(model, arch, weights.files)  # the checkpoint reads them from the files
    if hidden is not None:
        if [tuple(h.shape) for h in hidden] != [tuple(h.shape) for h in inputs.hidden]:
            raise ResumeStateError(f"resume state in {work_dir} does not match the calibration "
                                   "batches; start over: run without --resume, with --overwrite")
        inputs = dataclasses.replace(inputs, hidden=hidden)
    held = sum(h.numel() * h.element_size() for h in inputs.hidden)
    if work_dir is not None and held > activation_budget(max_memory):
        spill_dir = work_dir / (f"spill.rank{dist.rank}" if dist.active else "spill")
        inputs = dataclasses.replace(inputs, hidden=spill_to_disk(inputs.hidden, spill_dir))
    bar = tqdm(range(len(layers)), desc=desc, disable=not progress, initial=start)
    for index in range(start, len(layers)):
        # A skeleton's layer (qcal.model.stream) is read from disk now and freed when done.
        streamed = any(p.is_meta for p in layers[index].parameters())
        if weights is not None:
            weights.load_into(layers[index], f"{arch.layers_path}.{index}.")
        layer = layers[index].to(device)
        layer_inputs = inputs.for_layer(index)
        logs[str(index)] = quantize_layer(index, layer, layer_inputs)
        # In place: the layer's inputs are dead once it is quantized.
        inputs = dataclasses.replace(inputs, hidden=run_layer(layer, layer_inputs, device,
                                                              store_dtype, inplace=True))
        _drop_kernel_caches(layer)
        release_replay(layer)  # a method's attention replay lives until this final pass
        layers[index] = layer.to("cpu") if device != "cpu" else layer
        return_freed_memory()
        if work_dir is not None:
            _save_progress(work_dir, index, layers[index], inputs, logs, fingerprint, dist)
            if streamed:
                free_layer(layers, index)
        bar.update(1)
    bar.close()
    return logs


def _drop_kernel_caches(layer: nn.Module) -> None:
    # QuantLinear caches a dequantized weight per dtype for speed; across 30 layers
    # those copies would add up to the float model again.
    for module in layer.modules():
        if isinstance(module, QuantLinear):
            module._kernel_cache.clear()


def layer_linear(layer: nn.Module, name: str) -> nn.Linear:
    module = get_module(layer, name)
    if not isinstance(module, nn.Linear):
        raise ConfigError(f"{name} is {type(module).__name__}, not an nn.Linear to quantize")
    return module
