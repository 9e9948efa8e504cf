"""The quantization-method registry and the in-place application of results.

A method's `run(model, config, calib_ids, options)` quantizes every linear named by
the model's ArchSpec, replaces it in place (packed `QuantLinear`, or a fake-quant
`nn.Linear` for widths that cannot pack), and returns per-linear losses. A method is one
file that defines its `METHOD = QuantMethod(...)` entry (config type, runner, CLI flags,
checkpoint fields); `qcal.methods` (the package's `__init__`) lists the method modules
and registers their entries, by config type and by name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from pydantic import StrictBool
from qcal_kernels.format import PACKABLE_BITS
from torch import nn

from qcal.config import ModuleSelection
from qcal.logs import info as log_info
from qcal.model.arch import ArchSpec, decoder_layers, get_module, set_module
from qcal.model.distributed import SINGLE, DistContext
from qcal.packing.qlinear import QuantLinear
from qcal.quant.base import QuantResult
from qcal.registry import Registry


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """How to run (not what to compute): device, progress, resume state."""

    device: str = "cpu"
    progress: bool = True
    packed: bool = True
    work_dir: Path | None = None  # per-layer state for --resume
    resume: bool = False
    log: Callable[[str], None] = log_info  # the `qcal` logger; the CLI shows it on stderr
    # The float model dir the model was *just* loaded from, unchanged: calibration-based
    # methods may then re-read each layer from it instead of keeping the model resident.
    weights_dir: Path | None = None
    # Data-parallel calibration under torchrun (one process: a no-op context).
    dist: DistContext = SINGLE
    # Which linears are quantized, and whether every MoE expert sees every calibration token
    # (the recipe's `modules`; part of the checkpoint key when not the default).
    selection: ModuleSelection = ModuleSelection()
    # A streamed run's checkpoint shards (bytes; qcal.model.shards) and the calibration
    # activations kept in memory before they spill to work_dir (bytes; None: automatic).
    shard_bytes: int = 2 * 10**9
    max_memory: int | None = None


RunFn = Callable[[nn.Module, Any, "torch.Tensor | None", RunOptions], dict[str, float | None]]


def no_format_fields(config: Any) -> dict[str, Any]:
    return {}


def no_option_rules(options: Any) -> None:
    return None


@dataclasses.dataclass(frozen=True)
class MethodFlag:
    """One `qcal quantize` option of a method: `--<dest>` sets the config field `field`.

    `schema` is the pydantic type that checks the value (its range included) before any
    model loads; `value_type` None makes a switch (store_true), else argparse reads one
    value. A flag left at `default` leaves the config's own default, and a flag given with
    another --method is refused. `invert`: a switch that turns `field` off (--no-clip).
    """

    dest: str
    field: str
    help: str
    schema: Any = StrictBool
    default: Any = False
    value_type: type | None = None
    invert: bool = False

    @property
    def option(self) -> str:
        return "--" + self.dest.replace("_", "-")

    def config_value(self, value: Any) -> Any:
        return (not value) if self.invert else value


@dataclasses.dataclass(frozen=True)
class QuantMethod:
    """Everything qcal knows of a method, declared in the method's own file: its config
    type, its runner, its CLI flags (with their schema rules) and its checkpoint fields.
    The CLI, the schema, recipes and grids build their tables from these entries."""

    name: str
    config_cls: type
    needs_calibration: bool
    run: RunFn
    # The method's own quantization_config fields in the GPTQ checkpoint (e.g. desc_act):
    # qcal.run writes them without knowing any method's settings.
    checkpoint_fields: Callable[[Any], dict[str, Any]] = no_format_fields
    flags: tuple[MethodFlag, ...] = ()
    # Rules between this method's flags and the other `qcal quantize` options, checked by
    # the schema on the typed options (raise ValueError with the one-line message).
    option_rules: Callable[[Any], None] = no_option_rules


def new_method_registry() -> Registry[QuantMethod]:
    return Registry("quantization method")


def apply_result(model: nn.Module, name: str, result: QuantResult, packed: bool = True) -> nn.Module:
    """Replace linear `name` by its quantized form; returns the new module."""
    linear = get_module(model, name)
    bias = linear.bias.detach() if getattr(linear, "bias", None) is not None else None
    if packed and result.scheme.bits in PACKABLE_BITS:
        new: nn.Module = QuantLinear.from_result(result, bias).to(linear.weight.device)
    else:
        new = nn.Linear(linear.in_features, linear.out_features, bias=bias is not None)
        new = new.to(device=linear.weight.device, dtype=linear.weight.dtype)
        with torch.no_grad():
            new.weight.copy_(result.dequantize().to(linear.weight.dtype))
            if bias is not None:
                new.bias.copy_(bias)
    set_module(model, name, new)
    return new


def iter_layer_linears(model: nn.Module, arch: ArchSpec,
                       selection: ModuleSelection | None = None) -> list[tuple[int, str]]:
    """(layer index, full name) of every linear to quantize."""
    layers = decoder_layers(model, arch)
    names = [(i, f"{arch.layers_path}.{i}.{lin}") for i in range(len(layers))
             for lin in arch.linear_names]
    return [(i, n) for i, n in names if selection is None or selection.selects(n)]


def selection_tag(selection: ModuleSelection) -> str:
    """What a resume fingerprint adds for a non-default selection (none for the default, so
    saved progress of earlier runs stays valid)."""
    from qcal.cache import fingerprint

    return "" if selection.is_default() else "-" + fingerprint(selection)[:12]


def layer_spec(arch: ArchSpec, index: int, selection: ModuleSelection) -> ArchSpec:
    """The spec of decoder layer `index` restricted to the selected linears."""
    if selection.is_default():
        return arch
    prefix = f"{arch.layers_path}.{index}."
    return arch.restricted({n for n in arch.linear_names if selection.selects(prefix + n)})
