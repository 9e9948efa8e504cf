"""End-to-end jobs the CLI calls: quantize a model, evaluate perplexity."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from qcal.config import QuantScheme, to_dict
from qcal.errors import ConfigError
from qcal.model.arch import arch_for, get_module
from qcal.model.loading import load_model
from qcal.packing.checkpoint import is_quantized_checkpoint, save_checkpoint
from qcal.packing.format import PACKABLE_BITS
from qcal.quant.methods import METHODS, RunOptions, iter_layer_linears
from qcal.results import atomic_write_text


def validate_scheme(model: nn.Module, scheme: QuantScheme) -> None:
    """Fail before any work if the scheme cannot serve every quantized linear."""
    for _, name in iter_layer_linears(model, arch_for(model)):
        linear = get_module(model, name)
        scheme.groups_for(linear.in_features, name)
        per = 32 // scheme.bits if scheme.bits in PACKABLE_BITS else 1
        if linear.out_features % per:
            raise ConfigError(
                f"{name} has out_features={linear.out_features}, not a multiple of {per}; "
                f"{scheme.bits}-bit packing needs that"
            )


def quantize_model_dir(
    model: str | Path | None, method: str, config: Any, out_dir: Path,
    calib_ids: torch.Tensor | None = None, calib_manifest: dict[str, Any] | None = None,
    opts: RunOptions | None = None,
) -> dict[str, Any]:
    """Load `model`, quantize it with `method`, write a GPTQ-layout checkpoint to `out_dir`."""
    opts = opts or RunOptions()
    spec = METHODS.get(method)
    if not isinstance(config, spec.config_cls):
        raise ConfigError(f"method {method!r} takes a {spec.config_cls.__name__}")
    if spec.needs_calibration and calib_ids is None:
        raise ConfigError(f"method {method!r} needs calibration data; pass --calib")
    net, tokenizer, src = load_model(model)
    validate_scheme(net, config.scheme)
    if not opts.packed or config.scheme.bits not in PACKABLE_BITS:
        raise ConfigError(
            f"{config.scheme.bits}-bit results cannot be packed into a GPTQ checkpoint; "
            f"use bits in {PACKABLE_BITS} (other widths are available as fake-quant in Python)"
        )
    if opts.weights_dir is None and not is_quantized_checkpoint(src):
        # Just loaded and unchanged: methods may re-read layers instead of keeping them resident.
        opts = dataclasses.replace(opts, weights_dir=Path(src))
    started = time.perf_counter()
    losses = spec.run(net, config, calib_ids, opts)
    seconds = time.perf_counter() - started
    meta = {
        "method": method,
        "config": to_dict(config),
        "source_model": str(src),
        "calibration": calib_manifest,
        "quantize_seconds": round(seconds, 2),
        "damp_percent": getattr(config, "damp_percent", 0.01),
        "static_groups": getattr(config, "static_groups", False),
    }
    save_checkpoint(net, out_dir, tokenizer, desc_act=getattr(config, "desc_act", False),
                    sym=config.scheme.sym, meta=meta)
    log = {"losses": losses, **meta}
    # Written last and atomically: its presence marks a finished checkpoint (qcal compare).
    atomic_write_text(Path(out_dir) / "quant_log.json", json.dumps(log, indent=2, default=str))
    return log


def replay_awq_model_dir(model: str | Path | None, artifact: str | Path,
                         out_dir: Path) -> dict[str, Any]:
    """Apply a saved AWQ search (scales, clips) to `model` and write the checkpoint.

    No calibration data and no search: the artifact (`<checkpoint>.work/awq_search.pt`
    of an earlier `qcal quantize --method awq`) fixes every choice, so the result equals
    that run's checkpoint.
    """
    from qcal.config import AWQConfig, from_dict
    from qcal.quant.awq_runner import apply_awq_artifact, load_artifact

    art = load_artifact(artifact)
    config = from_dict(AWQConfig, art["config"])
    net, tokenizer, src = load_model(model)
    if is_quantized_checkpoint(src):
        raise ConfigError(f"{src} is already quantized; replay the AWQ artifact on the float model")
    validate_scheme(net, config.scheme)
    started = time.perf_counter()
    apply_awq_artifact(net, art)
    meta = {"method": "awq", "config": to_dict(config), "source_model": str(src),
            "calibration": None, "awq_artifact": str(Path(artifact).resolve()),
            "quantize_seconds": round(time.perf_counter() - started, 2)}
    save_checkpoint(net, out_dir, tokenizer, desc_act=False, sym=config.scheme.sym, meta=meta)
    atomic_write_text(Path(out_dir) / "quant_log.json", json.dumps(meta, indent=2, default=str))
    return meta


def default_output_dir(model: str | Path | None, method: str, scheme: QuantScheme,
                       tag: str = "") -> Path:
    from qcal.paths import DEFAULT_MODEL_NAME, runs_dir

    base = Path(model).name if model else DEFAULT_MODEL_NAME
    g = "c" if scheme.group_size == -1 else str(scheme.group_size)
    sym = "-sym" if scheme.sym else ""
    return runs_dir() / f"{base}-{method}-w{scheme.bits}g{g}{sym}{tag}"
