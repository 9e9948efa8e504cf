"""Round-to-nearest: every linear on its own min/max grid, no calibration data.

On a streamed model (a meta skeleton, qcal.model.stream) RTN is one pass over the
files: each decoder layer is read in its stored dtype (the grid math upcasts one
linear at a time), quantized, written to the work directory and freed, so memory is
one layer and `--resume` continues after the last written layer.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from qcal.config import RTNConfig
from qcal.fsio import atomic_write_text
from qcal.methods.registry import (
    QuantMethod,
    RunFn,
    RunOptions,
    apply_result,
    iter_layer_linears,
    layer_spec,
    selection_tag,
)
from qcal.model.arch import ArchSpec, decoder_layers, get_module
from qcal.model.offload import DiskWeights, return_freed_memory
from qcal.model.resolve import arch_for
from qcal.model.sequential import PROGRESS_FILE, ResumeStateError, read_progress, resume_fingerprint
from qcal.model.stream import free_layer, is_streamed, layer_file, read_layer_state, write_layer_state
from qcal.quant.base import QuantResult, rtn_quantize

# How a weight-only method quantizes one weight [out, in]: (weight, config, full name) -> result.
QuantizeWeight = Callable[[torch.Tensor, Any, str], QuantResult]


def rtn_weight(weight: torch.Tensor, cfg: RTNConfig, name: str) -> QuantResult:
    return rtn_quantize(weight, cfg.scheme, name=name, with_loss=True)


def weight_only_runner(tag: str, quantize: QuantizeWeight) -> RunFn:
    """The runner of a method that quantizes each linear from its weight alone (RTN and its
    variants): in place on a loaded model, or streamed layer by layer from the files with
    `--resume`. `tag` names the method in the resume fingerprint."""

    def run(model: nn.Module, cfg: Any, calib: torch.Tensor | None,
            opts: RunOptions) -> dict[str, float | None]:
        arch = arch_for(model)
        if is_streamed(model) and opts.weights_dir is not None and opts.work_dir is not None:
            return _run_streamed(model, arch, cfg, opts, tag, quantize)
        losses: dict[str, float | None] = {}
        names = iter_layer_linears(model, arch, opts.selection)
        for _, name in tqdm(names, desc=tag, disable=not opts.progress):
            losses[name] = _quantize_linear(model, name, name, cfg, opts, quantize)
        return losses

    return run


def _quantize_linear(module: nn.Module, name: str, full_name: str, cfg: Any, opts: RunOptions,
                     quantize: QuantizeWeight) -> float:
    weight = get_module(module, name).weight.detach()
    scheme = opts.selection.scheme_of(full_name, cfg.scheme)  # --scheme-override
    if scheme != cfg.scheme:
        cfg = dataclasses.replace(cfg, scheme=scheme)
    result = quantize(weight, cfg, full_name)
    apply_result(module, name, result, opts.packed)
    return float(result.loss)  # type: ignore[arg-type]


def _run_streamed(model: nn.Module, arch: ArchSpec, cfg: Any, opts: RunOptions, method: str,
                  quantize: QuantizeWeight) -> dict[str, float | None]:
    work = Path(opts.work_dir)  # type: ignore[arg-type]
    weights = DiskWeights(opts.weights_dir)  # type: ignore[arg-type]
    layers = decoder_layers(model, arch)
    tag = resume_fingerprint(method, model, cfg, torch.zeros(0, dtype=torch.int64), opts.packed) \
        + selection_tag(opts.selection)
    losses: dict[str, float | None] = {}
    start = 0
    if opts.resume:
        start, losses = _resume(work, layers, tag)
    # Linear weights stay in the file's dtype (bf16 halves the reads); the grid math
    # upcasts one linear at a time. Norms take the model's dtype, as a full load gives them.
    keep = frozenset(f"{name}.weight" for name in arch.linear_names)
    return_freed_memory()
    for index in tqdm(range(start, len(layers)), desc=method, disable=not opts.progress,
                      initial=start, total=len(layers)):
        prefix = f"{arch.layers_path}.{index}."
        weights.load_into(layers[index], prefix, keep_stored=keep)
        for name in layer_spec(arch, index, opts.selection).linear_names:
            losses[prefix + name] = _quantize_linear(layers[index], name, prefix + name, cfg,
                                                     opts, quantize)
        if opts.dist.is_main:
            write_layer_state(work, index, layers[index])
            atomic_write_text(work / PROGRESS_FILE, json.dumps(
                {"done": index, "fingerprint": tag, "logs": losses}))
        free_layer(layers, index)
        return_freed_memory()
    return losses


def _resume(work: Path, layers: nn.ModuleList, tag: str) -> tuple[int, dict[str, float | None]]:
    state = read_progress(work)
    if state is None:
        return 0, {}
    if state.get("fingerprint") != tag:
        raise ResumeStateError(f"{work} holds progress of a different run (model, method or "
                               "scheme changed); drop --resume and pass --overwrite to start over")
    done = int(state["done"])
    if not -1 <= done < len(layers):
        raise ResumeStateError(f"resume state file {work / PROGRESS_FILE} names layer {done} "
                               f"of a {len(layers)}-layer model; start over with --overwrite")
    for i in range(done + 1):  # module types only; the checkpoint is assembled from the files
        read_layer_state(layers[i], layer_file(work, i))
        free_layer(layers, i)
    return done + 1, dict(state.get("logs") or {})


run_rtn = weight_only_runner("rtn", rtn_weight)

METHOD = QuantMethod("rtn", RTNConfig, False, run_rtn)
