"""End-to-end jobs the CLI calls: quantize a model, evaluate perplexity."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from qcal_kernels.format import PACKABLE_BITS
from torch import nn

from qcal.config import ModuleSelection, QuantScheme, from_dict, to_dict
from qcal.errors import ConfigError
from qcal.fsio import (
    MARKER,
    check_output,
    check_writable,
    clean_stale_siblings,
    exclusive_lock,
    marker_text,
    read_marker,
)
from qcal.methods import METHODS, RunOptions, iter_layer_linears
from qcal.methods.awq_runner import ARTIFACT_NAME as AWQ_ARTIFACT
from qcal.model.adapters import expert_tokens
from qcal.model.arch import get_module
from qcal.model.consistency import check_token_ids
from qcal.model.loading import load_model
from qcal.model.resolve import arch_for
from qcal.model.sequential import PROGRESS_FILE, read_progress
from qcal.model.shards import save_streamed_checkpoint
from qcal.model.stream import is_streamed
from qcal.packing.card import model_card
from qcal.packing.checkpoint import (
    CHECKPOINT_KIND,
    DEFAULT_FORMAT,
    is_legacy_qcal_checkpoint,
    is_quantized_checkpoint,
    save_checkpoint,
)
from qcal.schemes import check_format, format_fields, stored_sym

WORK_KIND = "quantization work state"


def validate_scheme(model: nn.Module, scheme: QuantScheme,
                    selection: ModuleSelection | None = None) -> None:
    """Fail before any work if the scheme cannot serve every quantized linear."""
    arch = arch_for(model)
    names = iter_layer_linears(model, arch, selection)
    if selection is not None and not names:
        raise ConfigError("--targets/--ignore leave no linear to quantize; loosen the patterns")
    conv1d = [n for n in arch.adapted if n in arch.linear_names]
    kept = [n for i, n in iter_layer_linears(model, arch) if n not in {m for _, m in names}
            and n.rsplit(f"{i}.", 1)[-1] in conv1d]
    if kept:
        # A Conv1D kept float would be saved transposed under its Conv1D name.
        raise ConfigError(f"{kept[0]} is a Conv1D, which qcal can only store quantized; "
                          "drop the --targets/--ignore pattern that keeps it float")
    for _, name in names:
        linear = get_module(model, name)
        own = selection.scheme_of(name, scheme) if selection is not None else scheme
        own.groups_for(linear.in_features, name)
        # Codes fill whole int32 words: 32/bits of them (3 bits: 32 codes in 3 words).
        per = 32 // math.gcd(32, own.bits) if own.bits in PACKABLE_BITS else 1
        for what, size in (("out_features", linear.out_features),
                           ("in_features", linear.in_features)):
            if size % per:
                raise ConfigError(
                    f"{name} has {what}={size}, not a multiple of {per}; {own.bits}-bit "
                    "packing needs that (pick another width for it with --scheme-override)"
                )


@dataclasses.dataclass(frozen=True)
class OutputPolicy:
    """What the user allowed for the output: replace foreign content, resume, keep state."""

    overwrite: bool = False
    resume: bool = False
    keep_work: bool = False


def work_dir_for(out_dir: Path) -> Path:
    return Path(str(out_dir) + ".work")


@contextlib.contextmanager
def guarded_output(out_dir: Path, model_dir: Path | None, policy: OutputPolicy,
                   expected_bytes: int = 0) -> Iterator[Path]:
    """Check the output and its `<out>.work` state dir, lock them, yield the work dir.

    Before any work: the output may replace only qcal's own checkpoint (or anything,
    with --overwrite) and never the model or its parents; the disk must be writable
    with room for `expected_bytes`; a second run on the same output is refused; saved
    progress of a killed run needs --resume (continue) or --overwrite (start over).
    On success the work dir is removed unless `keep_work`.
    """
    out_dir = Path(out_dir)
    work = work_dir_for(out_dir)
    check_output(out_dir, CHECKPOINT_KIND, overwrite=policy.overwrite, protected=(model_dir,),
                 legacy_owned=is_legacy_qcal_checkpoint)
    check_output(work, WORK_KIND, overwrite=policy.overwrite, protected=(model_dir,),
                 legacy_owned=lambda p: (p / PROGRESS_FILE).is_file())
    check_writable(out_dir, expected_bytes)
    work.mkdir(parents=True, exist_ok=True)
    if read_marker(work) is None:
        (work / MARKER).write_text(marker_text(WORK_KIND), encoding="utf-8")
    busy = (f"another `qcal quantize` is writing {out_dir}; wait for it to finish or choose "
            "another -o")
    with exclusive_lock(work / ".lock", busy):
        clean_stale_siblings(out_dir)
        if (work / PROGRESS_FILE).is_file() and not policy.resume:
            if not policy.overwrite:
                progress = read_progress(work)
                done = int(progress["done"]) + 1 if progress else 0
                raise ConfigError(f"{work} holds an interrupted run ({done} layers done); add "
                                  "--resume to continue it, or --overwrite to start over")
            _empty_work_dir(work)
        try:
            yield work
        except BaseException:
            # Keep finished layers for --resume; a run that saved nothing leaves nothing.
            if not (work / PROGRESS_FILE).is_file():
                shutil.rmtree(work, ignore_errors=True)
            raise
    if not policy.keep_work:
        shutil.rmtree(work, ignore_errors=True)


def _empty_work_dir(work: Path) -> None:
    for entry in work.iterdir():
        if entry.name in {MARKER, ".lock"}:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def quantize_model_dir(
    model: str | Path | None, method: str, config: Any, out_dir: Path,
    calib_ids: torch.Tensor | None = None, calib_manifest: dict[str, Any] | None = None,
    opts: RunOptions | None = None, trust_remote_code: bool = False,
    extra_log: dict[str, Any] | None = None, fmt: str = DEFAULT_FORMAT, command: str | None = None,
) -> dict[str, Any]:
    """Load `model`, quantize it with `method`, write a GPTQ-layout checkpoint to `out_dir`.

    The caller guards the output (`guarded_output`); `opts.work_dir` holds resume state.
    """
    opts = opts or RunOptions()
    quant_method = METHODS.get(method)
    if not isinstance(config, quant_method.config_cls):
        raise ConfigError(f"method {method!r} takes a {quant_method.config_cls.__name__}")
    if quant_method.needs_calibration and calib_ids is None:
        raise ConfigError(f"method {method!r} needs calibration data; pass --calib")
    # With a work directory the float model streams: decoder layers stay on the meta device
    # until their turn, finished layers go to the work dir, and the checkpoint is assembled
    # from there shard by shard (qcal.model.stream, qcal.model.shards). Not where layers
    # hold modules re-expressed as linears (Conv1D, fused experts): their files name others.
    from qcal.model.loading import resolve_model_dir
    from qcal.model.resolve import resolve_arch
    from qcal.model.shapes import skeleton

    model = resolve_model_dir(model, trust_remote_code)
    adapted = not is_quantized_checkpoint(model) and bool(
        resolve_arch(skeleton(model, trust_remote_code)).adapted)
    stream = opts.work_dir is not None and opts.packed and not adapted
    net, tokenizer, src = load_model(model, trust_remote_code=trust_remote_code, stream=stream,
                                     prelude=quant_method.needs_calibration)
    check_token_ids(calib_ids, net, "calibration")
    arch = arch_for(net)
    validate_scheme(net, config.scheme, opts.selection)
    overrides = opts.selection.schemes
    widths = {config.scheme.bits, *(o.bits for o in overrides if o.bits is not None)}
    if not opts.packed or not widths <= set(PACKABLE_BITS):
        raise ConfigError(
            f"{max(widths - set(PACKABLE_BITS), default=config.scheme.bits)}-bit results cannot "
            "be packed into a GPTQ checkpoint; "
            f"use bits in {PACKABLE_BITS} (other widths are available as fake-quant in Python)"
        )
    if opts.weights_dir is None and not is_quantized_checkpoint(src) and not arch.adapted:
        # Just loaded and unchanged: methods may re-read layers instead of keeping them resident
        # (not where layers were re-expressed as linears: their tensors differ from the files).
        opts = dataclasses.replace(opts, weights_dir=Path(src))
    started = time.perf_counter()
    losses = quant_method.run(net, config, calib_ids, opts)
    seconds = time.perf_counter() - started
    meta = {
        "method": method,
        "config": to_dict(config),
        "source_model": str(src),
        "calibration": calib_manifest,
        "quantize_seconds": round(seconds, 2),
        "format": fmt,
        "command": command,
    }
    log = {"losses": losses, **meta, **(extra_log or {}), "arch": arch.to_dict()}
    experts = expert_tokens(net)
    if experts:
        # Which experts saw how many routed tokens, and which got no calibration (RTN).
        log["moe"] = {"all_experts_calibrated": opts.selection.moe_all_experts,
                      "routed_tokens": experts,
                      "rtn_fallback": sorted(n for n, v in losses.items()
                                             if v is None and ".experts." in n)}
    extra: dict[str, str | bytes] = {"quant_log.json": json.dumps(log, indent=2, default=str),
                                     "README.md": model_card(log, fmt, str(src), command)}
    artifact = Path(opts.work_dir) / AWQ_ARTIFACT if opts.work_dir is not None else None
    if method == "awq" and artifact is not None and artifact.is_file():
        # Replayable with --awq-artifact; in a subfolder so weight loaders never read it.
        extra[f"artifacts/{AWQ_ARTIFACT}"] = artifact.read_bytes()
    # quant_log.json is written inside the atomic step: its presence marks a finished checkpoint.
    sym = stored_sym(config.scheme, overrides)
    fields = format_fields(config.scheme, overrides, fmt, quant_method.checkpoint_fields(config))
    if opts.dist.is_main and is_streamed(net):
        save_streamed_checkpoint(net, out_dir, tokenizer, sym=sym,
                                 work_dir=Path(opts.work_dir), source_dir=Path(src),  # type: ignore[arg-type]
                                 fields=fields, meta=meta,
                                 extra_files=extra, fmt=fmt, shard_bytes=opts.shard_bytes)
    elif opts.dist.is_main:  # under torchrun every rank holds the same result; one writes it
        save_checkpoint(net, out_dir, tokenizer, sym=sym, fields=fields, meta=meta,
                        extra_files=extra, fmt=fmt)
    return log


def replay_awq_model_dir(model: str | Path | None, artifact: str | Path,
                         out_dir: Path, trust_remote_code: bool = False, fmt: str = DEFAULT_FORMAT,
                         command: str | None = None) -> dict[str, Any]:
    """Apply a saved AWQ search (scales, clips) to `model` and write the checkpoint.

    No calibration data and no search: the artifact (`awq_search.safetensors` in the
    checkpoint of an earlier `qcal quantize --method awq`) fixes every choice, so the
    result equals that run's checkpoint. The caller guards the output.
    """
    from qcal.config import AWQConfig, from_dict
    from qcal.methods.awq_runner import apply_awq_artifact, load_artifact

    art = load_artifact(artifact)
    config = from_dict(AWQConfig, art["config"])
    net, tokenizer, src = load_model(model, trust_remote_code=trust_remote_code)
    if is_quantized_checkpoint(src):
        raise ConfigError(f"{src} is already quantized; replay the AWQ artifact on the float model")
    selection = (from_dict(ModuleSelection, art["selection"]) if "selection" in art
                 else ModuleSelection())
    validate_scheme(net, config.scheme, selection)
    started = time.perf_counter()
    apply_awq_artifact(net, art)
    meta = {"method": "awq", "config": to_dict(config), "source_model": str(src),
            "calibration": None, "awq_artifact": str(Path(artifact).resolve()),
            "quantize_seconds": round(time.perf_counter() - started, 2), "format": fmt,
            "command": command}
    save_checkpoint(net, out_dir, tokenizer, sym=stored_sym(config.scheme, selection.schemes),
                    fields=format_fields(config.scheme, selection.schemes, fmt, {}),
                    meta=meta, fmt=fmt,
                    extra_files={"quant_log.json": json.dumps(meta, indent=2, default=str),
                                 "README.md": model_card(meta, fmt, str(src), command)})
    return meta


def export_checkpoint(src: str | Path, out_dir: Path, fmt: str, policy: OutputPolicy,
                      command: str | None = None) -> Path:
    """Rewrite a quantized checkpoint (any format qcal reads) in format `fmt`; `command`
    (the export's own command line) goes into the card, the source's stays in the log."""
    from qcal.model.loading import resolve_model_dir

    src_dir = resolve_model_dir(src)
    if not is_quantized_checkpoint(src_dir):
        raise ConfigError(f"{src_dir} is not a quantized checkpoint; `qcal export` converts "
                          "checkpoints (quantize a float model with `qcal quantize --format ...`)")
    size = sum(f.stat().st_size for f in src_dir.glob("*.safetensors"))
    check_output(out_dir, CHECKPOINT_KIND, overwrite=policy.overwrite, protected=(src_dir,),
                 legacy_owned=is_legacy_qcal_checkpoint)
    check_writable(out_dir, size)
    try:
        log = json.loads((src_dir / "quant_log.json").read_text())
    except (OSError, ValueError):
        log = {"method": "unknown (not written by qcal)", "config": {}}
    qcfg = json.loads((src_dir / "config.json").read_text())["quantization_config"]
    sym = bool((log.get("config") or {}).get("scheme", {}).get("sym", qcfg.get("sym", False)))
    # Per-module schemes travel: qcal's own rules from the recipe, else a GPTQ `dynamic`.
    modules = ((log.get("recipe") or {}).get("modules")) or {}
    overrides = from_dict(ModuleSelection, modules).schemes if modules else ()
    fields: dict[str, Any] = {"desc_act": bool(qcfg.get("desc_act", False)
                                               or (log.get("config") or {}).get("desc_act"))}
    if overrides:
        base_scheme = from_dict(QuantScheme, (log.get("config") or {}).get("scheme") or {})
        sym = stored_sym(base_scheme, overrides)
        fields = format_fields(base_scheme, overrides, fmt, fields)
        check_format(base_scheme, overrides, fmt)  # e.g. the one-scheme AWQ layout
    elif qcfg.get("dynamic") and fmt.startswith("gptq"):
        fields.update(bits=qcfg.get("bits"), group_size=qcfg.get("group_size"),
                      dynamic=qcfg["dynamic"])
    net, tokenizer, _ = load_model(src_dir)
    log = {**log, "format": fmt, "exported_from": str(src_dir),
           "source_command": log.get("command"), "command": command}
    base = str(log.get("source_model") or src_dir)
    extra: dict[str, str | bytes] = {"quant_log.json": json.dumps(log, indent=2, default=str),
                                     "README.md": model_card(log, fmt, base, command)}
    save_checkpoint(net, out_dir, tokenizer, sym=sym, meta=log, extra_files=extra, fmt=fmt,
                    fields=fields)
    return out_dir


def default_output_dir(model: str | Path | None, method: str, scheme: QuantScheme,
                       tag: str = "") -> Path:
    from qcal.paths import DEFAULT_MODEL_NAME, runs_dir

    base = Path(model).name if model else DEFAULT_MODEL_NAME
    g = "c" if scheme.group_size == -1 else str(scheme.group_size)
    sym = "-sym" if scheme.sym else ""
    return runs_dir() / f"{base}-{method}-w{scheme.bits}g{g}{sym}{tag}"
