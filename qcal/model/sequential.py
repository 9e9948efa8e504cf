"""The layer-wise driver shared by calibration-based quantizers (GPTQ, AWQ).

For each decoder layer in order: move it to the compute device, let the method
quantize it in place (given the layer's calibration inputs), run the *quantized*
layer to produce the next layer's inputs, move it back. Peak memory is one
layer plus the calibration activations, whatever the depth. After every layer the
driver checkpoints its state, so `resume=True` continues after the last finished
layer of an interrupted run.
"""

from __future__ import annotations

import copy
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
from qcal.model.capture import LayerInputs, ReferenceStream, capture_layer0_inputs, run_layer
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
                   logs: dict[str, Any], fingerprint: str, dist: DistContext,
                   reference: list[torch.Tensor] | None = None) -> None:
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
        tensors = {"hidden": h.contiguous()}
        if reference is not None:  # the float model's stream (GPTAQ), batch by batch
            tensors["reference"] = reference[i].contiguous()
        atomic_write_bytes(_batch_file(index_file, i),
                           save(tensors, metadata={"layer": str(index)}))
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
            dist: DistContext = SINGLE, reference: bool = False,
            ) -> tuple[int, list[torch.Tensor] | None, list[torch.Tensor] | None, dict[str, Any]]:
    """(last finished layer, its output hidden states, the float stream's when `reference`,
    the logs) of the run saved in `work_dir`; (-1, None, None, {}) when there is none."""
    state = read_progress(work_dir)
    if state is None:
        return -1, None, None, {}
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
    hidden, floats = [], []
    for i in range(batches):
        part, meta = read_state_file(_batch_file(hidden_file, i))
        if ("hidden" not in part or (reference and "reference" not in part)
                or meta.get("layer") != str(tagged)):
            raise ResumeStateError(f"resume state file {_batch_file(hidden_file, i)} does not "
                                   f"belong to layer {tagged}; start over: run without --resume "
                                   "and with --overwrite")
        hidden.append(part["hidden"])
        if reference:
            floats.append(part["reference"])
    return done, hidden, floats if reference else None, state.get("logs", {})


def sequential_quantize(
    model: nn.Module, arch: ArchSpec, calib_ids: torch.Tensor, quantize_layer: LayerFn, *,
    device: str = "cpu", batch_size: int = 8, progress: bool = True, desc: str = "layers",
    work_dir: Path | None = None, resume: bool = False, fingerprint: str = "",
    store_dtype: torch.dtype | None = None, weights: DiskWeights | None = None,
    dist: DistContext = SINGLE, max_memory: int | None = None, reference_stream: bool = False,
) -> dict[str, Any]:
    """Run `quantize_layer(index, layer, inputs)` over all decoder layers; returns its logs.

    `reference_stream` also carries the float model's hidden states, layer by layer, and
    hands each layer's float copy and float inputs to `quantize_layer` as
    `inputs.reference` (GPTAQ): one more layer and one more set of activations in memory,
    saved with the resume state and spilled to disk like the quantized stream.

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
    start, hidden, floats = 0, None, None
    return_freed_memory()
    if resume and work_dir is not None:
        done, hidden, floats, logs = _resume(work_dir, layers, fingerprint, dist,
                                             reference_stream)
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
    if reference_stream and floats is None:  # layer 0: both models feed it the same
        floats = [h.clone() for h in inputs.hidden]
    held = sum(h.numel() * h.element_size() for h in inputs.hidden) * (2 if floats else 1)
    if work_dir is not None and held > activation_budget(max_memory):
        spill_dir = work_dir / (f"spill.rank{dist.rank}" if dist.active else "spill")
        inputs = dataclasses.replace(inputs, hidden=spill_to_disk(inputs.hidden, spill_dir))
        if floats is not None:
            floats = spill_to_disk(floats, spill_dir.with_name(spill_dir.name + "-float"))
    bar = tqdm(range(len(layers)), desc=desc, disable=not progress, initial=start)
    for index in range(start, len(layers)):
        # A skeleton's layer (qcal.model.stream) is read from disk now and freed when done.
        streamed = any(p.is_meta for p in layers[index].parameters())
        if weights is not None:
            weights.load_into(layers[index], f"{arch.layers_path}.{index}.")
        layer = layers[index].to(device)
        layer_inputs = inputs.for_layer(index)
        if floats is not None:
            layer_inputs = dataclasses.replace(
                layer_inputs, reference=ReferenceStream(copy.deepcopy(layer), floats))
        logs[str(index)] = quantize_layer(index, layer, layer_inputs)
        # In place: the layer's inputs are dead once it is quantized.
        inputs = dataclasses.replace(inputs, hidden=run_layer(layer, layer_inputs, device,
                                                              store_dtype, inplace=True))
        if layer_inputs.reference is not None:
            floats = run_layer(layer_inputs.reference.layer,
                               dataclasses.replace(layer_inputs, hidden=floats, reference=None),
                               device, store_dtype, inplace=True)
        del layer_inputs  # and with it the float copy of the layer
        _drop_kernel_caches(layer)
        release_replay(layer)  # a method's attention replay lives until this final pass
        layers[index] = layer.to("cpu") if device != "cpu" else layer
        return_freed_memory()
        if work_dir is not None:
            _save_progress(work_dir, index, layers[index], inputs, logs, fingerprint, dist,
                           floats)
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
