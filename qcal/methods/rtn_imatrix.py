"""RTN-imatrix: RTN-MSE's per-group clip search with each input channel's error weighted by
its calibration energy E[x^2] (llama.cpp's importance matrix; llm-compressor's imatrix_mse).

The importances come from one forward pass of the *float* model over the calibration ids,
layer by layer (memory: one layer, streamed from the files where the model is), as
llama.cpp computes them: they depend on the model and the ids only, not on any scheme, so
they are kept as `imatrix-<key>.safetensors` (plain tensors, never pickle) under the
cache folder, the key fingerprinting model config and ids, and every later run on the same
model and calibration set, whatever its scheme, reads them instead of running the pass
again. The quantization itself is then RTN-MSE's weight-only pass (streamed, resumable per
layer) with those weights: an ordinary grid that every format stores.

This file is the whole method: config, runner, CLI flags.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from safetensors.torch import load_file, save
from torch import nn

from qcal.fsio import atomic_write_bytes
from qcal.methods.registry import QuantMethod, RunOptions, selection_tag
from qcal.methods.rtn import weight_only_runner
from qcal.methods.rtn_mse import FLAGS as MSE_FLAGS
from qcal.methods.rtn_mse import RTNMSEConfig, mse_clip_quantize
from qcal.model.arch import ArchSpec, decoder_layers
from qcal.model.capture import capture_layer0_inputs, capture_linear_inputs, run_layer
from qcal.model.offload import DiskWeights, return_freed_memory
from qcal.model.resolve import arch_for
from qcal.model.sequential import resume_fingerprint
from qcal.model.stream import free_layer, free_outside, is_streamed
from qcal.paths import runs_dir
from qcal.quant.base import QuantResult

ENERGY_FORMAT = "qcal-imatrix/1"  # the file's metadata: what the vectors are


@dataclasses.dataclass(frozen=True)
class RTNImatrixConfig(RTNMSEConfig):
    """RTN-MSE's search, its fields, defaults and checks, weighted by E[x^2] per input
    channel. A type of its own: configs dispatch to their method by exact type."""


def channel_energy(model: nn.Module, arch: ArchSpec, calib: torch.Tensor,
                   opts: RunOptions) -> dict[str, torch.Tensor]:
    """{full linear name: mean over calibration tokens of x^2 per input channel [in]} of the
    float model, one decoder layer at a time (each layer read from the files and freed
    again when the model is a streamed skeleton)."""
    streamed = is_streamed(model) and opts.weights_dir is not None
    weights = DiskWeights(opts.weights_dir) if streamed else None
    inputs = capture_layer0_inputs(model, arch, calib, device=opts.device)
    if weights is not None:
        free_outside(model, arch, weights.files)
    layers = decoder_layers(model, arch)
    sums: dict[str, torch.Tensor] = {}
    tokens = inputs.n_tokens

    def add(prefix: str, name: str, x: torch.Tensor) -> None:
        square = x.reshape(-1, x.shape[-1]).float().pow(2).sum(dim=0).cpu()
        key = prefix + name
        sums[key] = sums[key].add_(square) if key in sums else square

    for index in range(len(layers)):
        prefix = f"{arch.layers_path}.{index}."
        if weights is not None:
            weights.load_into(layers[index], prefix)
        names = [n for n in arch.linear_names if opts.selection.selects(prefix + n)]
        with capture_linear_inputs(layers[index], names, lambda n, x, p=prefix: add(p, n, x)):
            hidden = run_layer(layers[index], inputs.for_layer(index), opts.device, inplace=True)
        inputs = dataclasses.replace(inputs, hidden=hidden)
        if weights is not None:
            free_layer(layers, index)
        return_freed_memory()
        opts.log(f"imatrix: layer {index + 1}/{len(layers)}")
    return {name: total.div_(tokens) for name, total in sums.items()}


def energy_file(model: nn.Module, calib: torch.Tensor, selection_key: str = "") -> Path:
    key = resume_fingerprint("imatrix", model, ENERGY_FORMAT, calib, False) + selection_key
    return runs_dir() / "imatrix" / f"imatrix-{key}.safetensors"


def load_or_measure(model: nn.Module, calib: torch.Tensor,
                    opts: RunOptions) -> dict[str, torch.Tensor]:
    """The importances of this model and these ids: read from their cache file, or measured
    and written there (atomically: an interrupted pass leaves no file)."""
    path = energy_file(model, calib, selection_tag(opts.selection))
    if path.is_file():
        opts.log(f"imatrix: reusing {path.name} (same model and calibration ids)")
        return load_file(str(path))
    energy = channel_energy(model, arch_for(model), calib, opts)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, save({k: v.contiguous() for k, v in energy.items()},
                                  metadata={"format": ENERGY_FORMAT,
                                            "tokens": str(int(calib.numel()))}))
    return energy


def run_rtn_imatrix(model: nn.Module, cfg: RTNImatrixConfig, calib: torch.Tensor | None,
                    opts: RunOptions) -> dict[str, float | None]:
    assert calib is not None  # needs_calibration: qcal.run refuses a run without ids
    energy = load_or_measure(model, calib, opts)

    def quantize(weight: torch.Tensor, config: RTNImatrixConfig, name: str) -> QuantResult:
        return mse_clip_quantize(weight, config, name, importance=energy[name])

    # The layers are read from the files again (streamed) or are still the float ones: the
    # energy pass changes no weight.
    return weight_only_runner("rtn-imatrix", quantize)(model, cfg, None, opts)


# RTN-MSE's search settings, with the same names, ranges and defaults: one set of rules.
FLAGS = MSE_FLAGS

METHOD = QuantMethod("rtn-imatrix", RTNImatrixConfig, True, run_rtn_imatrix, flags=FLAGS)
