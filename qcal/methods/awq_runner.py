"""AWQ over a model: the per-layer search (qcal.methods.awq_search) on the shared
sequential driver, a replayable search artifact, and registration as the "awq" method.

Per decoder layer: capture the inputs of every linear from the layer as it stands,
search, fold and quantize it (`search_layer`); the driver then runs the quantized layer
to make the next layer's inputs.

Checkpoint layout: AWQ's result is an ordinary min/max integer grid per group, so
it is packed into the same GPTQ layout (`quant_method: "gptq"`, qzeros/scales/g_idx)
as RTN and GPTQ, and loads with qcal's `QuantLinear` and GPTQ-layout loaders. The
AWQ GEMM layout (AutoAWQ's interleaved packing) is not written.

The search artifact (`awq_search.safetensors`: tensors + JSON metadata, no pickle;
written into the checkpoint and RunOptions.work_dir, or returned by
`awq_quantize_model`) holds, per layer, the folded scales and the clip thresholds;
`apply_awq_artifact` replays it on a float model without calibration data and
yields the same quantized weights.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import torch
from pydantic import Field
from torch import nn

from qcal.config import AWQConfig, ModuleSelection, from_dict, to_dict
from qcal.errors import CheckpointError, ConfigError
from qcal.methods.awq_artifact import (
    ARTIFACT_FORMAT,
    ARTIFACT_NAME,
    ARTIFACT_VERSION,
    entry_path,
    load_artifact,
    read_entry,
    save_artifact,
    write_entry,
)
from qcal.methods.awq_search import fold_scale, quantize_layer_weights, search_layer
from qcal.methods.registry import (
    MethodFlag,
    QuantMethod,
    RunOptions,
    layer_spec,
    selection_tag,
)
from qcal.model.adapters import calibrate_experts, finish_experts
from qcal.model.arch import ScaleGroup, decoder_layers
from qcal.model.capture import LayerInputs
from qcal.model.offload import DiskWeights
from qcal.model.resolve import arch_for
from qcal.model.sequential import resume_fingerprint, sequential_quantize

# The artifact's names are read from here by the pipeline and `qcal quantize`.
__all__ = ["ARTIFACT_NAME", "apply_awq_artifact", "awq_quantize_model", "load_artifact"]


def _fingerprint(model: nn.Module, cfg: AWQConfig, calib: torch.Tensor) -> str:
    return resume_fingerprint("awq", model, cfg, calib, True)


def awq_quantize_model(model: nn.Module, cfg: AWQConfig, calib_ids: torch.Tensor,
                       opts: RunOptions | None = None) -> tuple[dict[str, float | None], dict[str, Any]]:
    """Search and quantize every decoder layer in place; returns (losses, search artifact)."""
    opts = opts or RunOptions()
    if calib_ids is None or calib_ids.numel() == 0:
        raise ConfigError("AWQ needs calibration data; pass --calib (and --nsamples > 0)")
    dist = opts.dist
    if calib_ids.shape[0] < dist.world:
        raise ConfigError(f"{calib_ids.shape[0]} calibration windows cannot be shared by "
                          f"{dist.world} processes; use --nsamples >= {dist.world}")
    arch = arch_for(model)
    entries: dict[int, dict[str, Any]] = {}
    losses: dict[str, float | None] = {}

    def quantize_layer(index: int, layer: nn.Module, inputs: LayerInputs) -> dict[str, Any]:
        prefix = f"{arch.layers_path}.{index}."
        calibrate_experts(layer, opts.selection.moe_all_experts)
        entry, layer_losses = search_layer(layer, layer_spec(arch, index, opts.selection), inputs,
                                           cfg, opts.device, prefix, dist, opts.selection)
        finish_experts(layer)
        entries[index] = entry
        if opts.work_dir is not None and dist.is_main:
            write_entry(entry, entry_path(Path(opts.work_dir), index))
        losses.update(layer_losses)
        return {"losses": layer_losses,
                "ratios": {g["prev_op"]: g["ratio"] for g in entry["scales"]}}

    logs = sequential_quantize(
        model, arch, dist.shard(calib_ids), quantize_layer, device=opts.device,
        progress=opts.progress and dist.is_main, desc="awq", work_dir=opts.work_dir,
        resume=opts.resume, fingerprint=(_fingerprint(model, cfg, calib_ids) + f"-x{dist.world}"
                                         + selection_tag(opts.selection)),
        # Each layer's float weights from a short-lived mapping: the memory-mapped float
        # model would otherwise become resident layer by layer beside the packed one.
        weights=DiskWeights(opts.weights_dir) if opts.weights_dir is not None else None,
        dist=dist, max_memory=opts.max_memory,  # issue 36: activation budget
    )
    n_layers = len(decoder_layers(model, arch))
    for index in range(n_layers):
        if index not in entries:  # finished by an earlier, resumed run
            entries[index] = read_entry(entry_path(Path(opts.work_dir), index))
            losses.update(logs.get(str(index), {}).get("losses", {}))
    artifact = {"format": ARTIFACT_FORMAT, "version": ARTIFACT_VERSION, "config": to_dict(cfg),
                **({} if opts.selection.is_default() else {"selection": to_dict(opts.selection)}),
                "layers_path": arch.layers_path, "norm_offset": arch.norm_offset,
                "layers": [entries[i] for i in range(n_layers)]}
    if opts.work_dir is not None and dist.is_main:
        path = save_artifact(artifact, Path(opts.work_dir) / ARTIFACT_NAME)
        opts.log(f"AWQ search artifact (scales and clips per layer): {path}")
    return losses, artifact


@torch.no_grad()
def apply_awq_artifact(model: nn.Module, artifact: Mapping[str, Any] | str | Path,
                       packed: bool = True) -> None:
    """Replay a search artifact on a float model: fold scales, clamp, RTN; no calibration data."""
    art = load_artifact(artifact) if isinstance(artifact, (str, Path)) else artifact
    if art.get("format") != ARTIFACT_FORMAT or art.get("version") != ARTIFACT_VERSION:
        raise CheckpointError("not a qcal AWQ search artifact of version "
                              f"{ARTIFACT_VERSION}; re-run the AWQ search")
    cfg = from_dict(AWQConfig, art["config"])
    arch = arch_for(model)
    layers = decoder_layers(model, arch)
    if len(art["layers"]) != len(layers) or art["layers_path"] != arch.layers_path:
        raise CheckpointError(
            f"the AWQ artifact covers {len(art['layers'])} layers at {art['layers_path']!r}, the model "
            f"has {len(layers)} at {arch.layers_path!r}; use the artifact made for this model"
        )
    selection = from_dict(ModuleSelection, art["selection"]) if "selection" in art \
        else ModuleSelection()
    for index, (layer, entry) in enumerate(zip(layers, art["layers"], strict=True)):
        spec = layer_spec(arch, index, selection)
        for g in entry["scales"]:
            group = ScaleGroup(g["prev_op"], tuple(g["linears"]), "")
            fold_scale(layer, group, g["scale"].to(next(layer.parameters()).device),
                       float(art["norm_offset"]))
        quantize_layer_weights(layer, spec, cfg.scheme, entry["clips"], packed,
                               f"{arch.layers_path}.{index}.", selection)


def run_awq(model: nn.Module, cfg: AWQConfig, calib: torch.Tensor | None,
            opts: RunOptions) -> dict[str, float | None]:
    if calib is None:
        raise ConfigError("AWQ needs calibration data; pass --calib")
    if not opts.packed:
        raise ConfigError("AWQ always packs into QuantLinear; drop the fake-quant option")
    losses, _ = awq_quantize_model(model, cfg, calib, opts)
    return losses


FLAGS = (
    MethodFlag("no_clip", "clip_search", "AWQ: skip the clip search", invert=True),
    MethodFlag("search_tokens", "search_tokens",
               "AWQ: calibration tokens the scale search scores each candidate on "
               "(default 4096; 0: all, as the reference does)", value_type=int, default=None,
               schema=Annotated[int, Field(ge=0, le=1 << 30,
                                         description="an integer >= 0")] | None),
    MethodFlag("full_ratio_grid", "coarse_to_fine", "AWQ: score all 20 ratios (default: every "
               "other one, then the best's neighbours)", invert=True),
)

METHOD = QuantMethod("awq", AWQConfig, True, run_awq, flags=FLAGS)
