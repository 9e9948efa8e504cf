"""The layer-wise driver shared by calibration-based quantizers (GPTQ, AWQ).

For each decoder layer in order: move it to the compute device, let the method
quantize it in place (given the layer's calibration inputs), run the *quantized*
layer to produce the next layer's inputs, move it back. Peak memory is one
layer plus the calibration activations, whatever the depth. After every layer the
driver checkpoints its state, so `resume=True` continues after the last finished
layer of an interrupted run.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from qcal.errors import ConfigError
from qcal.model.arch import ArchSpec, decoder_layers, get_module, set_module
from qcal.model.capture import LayerInputs, capture_layer0_inputs, run_layer
from qcal.model.offload import DiskWeights, return_freed_memory
from qcal.packing.qlinear import QuantLinear

LayerFn = Callable[[int, nn.Module, LayerInputs], dict[str, Any]]


def _state_paths(work_dir: Path) -> tuple[Path, Path]:
    return work_dir / "progress.json", work_dir / "next_inputs.pt"


def _save_progress(work_dir: Path, index: int, layer: nn.Module, inputs: LayerInputs,
                   logs: dict[str, Any], fingerprint: str) -> None:
    work_dir.mkdir(parents=True, exist_ok=True)
    progress, next_inputs = _state_paths(work_dir)
    quant = {n: [m.in_features, m.out_features, m.bits, m.group_size, m.bias is not None]
             for n, m in layer.named_modules() if isinstance(m, QuantLinear)}
    layer_file = work_dir / f"layer_{index:04d}.pt"
    tmp = layer_file.with_suffix(".pt.tmp")
    torch.save({"state": layer.state_dict(), "quant": quant}, tmp)
    tmp.replace(layer_file)
    tmp = next_inputs.with_suffix(".pt.tmp")
    torch.save({"hidden": inputs.hidden, "kwargs": inputs.kwargs}, tmp)
    tmp.replace(next_inputs)
    tmp = progress.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"done": index, "fingerprint": fingerprint, "logs": logs}))
    tmp.replace(progress)


def _restore_layer(layer: nn.Module, saved: dict[str, Any]) -> None:
    for name, (inf, outf, bits, group, bias) in saved["quant"].items():
        set_module(layer, name, QuantLinear(inf, outf, bits, group, bias))
    # assign: copying into memory-mapped float weights would make their pages resident.
    layer.load_state_dict(saved["state"], assign=True)


def _resume(work_dir: Path, layers: nn.ModuleList, fingerprint: str
            ) -> tuple[int, LayerInputs | None, dict[str, Any]]:
    progress, next_inputs = _state_paths(work_dir)
    if not progress.is_file():
        return -1, None, {}
    state = json.loads(progress.read_text())
    if state.get("fingerprint") != fingerprint:
        raise ConfigError(
            f"{work_dir} holds progress of a different run (model, method or calibration "
            "changed); delete it or drop --resume"
        )
    done = int(state["done"])
    for i in range(done + 1):
        _restore_layer(layers[i], torch.load(work_dir / f"layer_{i:04d}.pt", weights_only=False))
    saved = torch.load(next_inputs, weights_only=False)
    return done, LayerInputs(saved["hidden"], saved["kwargs"]), state.get("logs", {})


def sequential_quantize(
    model: nn.Module, spec: ArchSpec, calib_ids: torch.Tensor, quantize_layer: LayerFn, *,
    device: str = "cpu", batch_size: int = 8, progress: bool = True, desc: str = "layers",
    work_dir: Path | None = None, resume: bool = False, fingerprint: str = "",
    store_dtype: torch.dtype | None = None, weights: DiskWeights | None = None,
) -> dict[str, Any]:
    """Run `quantize_layer(index, layer, inputs)` over all decoder layers; returns its logs.

    `store_dtype` (e.g. torch.float16) keeps the calibration activations between
    layers compactly; by default they keep the model's dtype. `weights` (the directory
    a freshly loaded model came from) re-reads each layer's float weights right before
    it is quantized, so the memory-mapped float model never becomes resident. The
    process's allocator is tuned to hand freed layers back (see `return_freed_memory`).
    """
    layers = decoder_layers(model, spec)
    logs: dict[str, Any] = {}
    start, inputs = 0, None
    return_freed_memory()
    if resume and work_dir is not None:
        done, inputs, logs = _resume(work_dir, layers, fingerprint)
        start = done + 1
    if inputs is None:
        inputs = capture_layer0_inputs(model, spec, calib_ids, batch_size, device, store_dtype)
    bar = tqdm(range(len(layers)), desc=desc, disable=not progress, initial=start)
    for index in range(start, len(layers)):
        if weights is not None:
            weights.load_into(layers[index], f"{spec.layers_path}.{index}.")
        layer = layers[index].to(device)
        logs[str(index)] = quantize_layer(index, layer, inputs)
        # In place: the layer's inputs are dead once it is quantized.
        inputs = LayerInputs(run_layer(layer, inputs, device, store_dtype, inplace=True),
                             inputs.kwargs)
        _drop_kernel_caches(layer)
        layers[index] = layer.to("cpu") if device != "cpu" else layer
        return_freed_memory()
        if work_dir is not None:
            _save_progress(work_dir, index, layers[index], inputs, logs, fingerprint)
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
