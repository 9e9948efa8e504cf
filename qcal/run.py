"""Running a recipe: the one route from a `QuantRecipe` to a checkpoint (and its numbers).

`run_recipe` is the whole run as a line of stages, each calling down once:

1. resolve the model and the device (`Source`: the directory, read once; its meta skeleton
   and tokenizer are built on first use and then shared by the later stages);
2. guard the output (`qcal.output`: ownership, disk space, lock, resume state);
3. calibrate (`calibrate`: a saved set, a step-cache hit, or a fresh build);
4. quantize layer by layer (`quantize_layers`: load the model once, run the method);
5. save (`save`: the checkpoint with quant_log.json and its model card);
6. evaluate (`qcal.eval.job.run_evaluation`, when the recipe asks).

`qcal quantize`, the comparison grid and `qcal.quantize` (the Python API) all call
`run_recipe`. `quantize_model_dir` is stages 4 and 5 for callers that hold calibration ids
and guard their own output (architecture checks, tests). `replay_awq_model_dir` is the short
route from a saved AWQ search (`qcal quantize --awq-artifact`); `qcal export` has its own,
from a checkpoint (qcal.export).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import time
from pathlib import Path
from typing import Any

import torch
from qcal_kernels.format import PACKABLE_BITS
from torch import nn

from qcal.cache import StepCache, fingerprint
from qcal.config import AWQConfig, ModuleSelection, from_dict, to_dict
from qcal.devices import resolve_device
from qcal.errors import ConfigError
from qcal.locking import exclusive_lock
from qcal.methods import METHODS, RunOptions
from qcal.methods.awq_runner import ARTIFACT_NAME as AWQ_ARTIFACT
from qcal.methods.awq_runner import apply_awq_artifact, load_artifact
from qcal.model.adapters import expert_tokens
from qcal.model.consistency import check_token_ids
from qcal.model.distributed import DistContext, from_env
from qcal.model.loading import check_weight_files, load_model, load_tokenizer, resolve_model_dir
from qcal.model.resolve import arch_for
from qcal.model.rotate import check_rotatable, rotate_model
from qcal.model.shapes import skeleton
from qcal.model.shards import save_streamed_checkpoint
from qcal.model.stream import is_streamed
from qcal.output import OutputPolicy, default_output_dir, guarded_output, work_dir_for
from qcal.packing.card import model_card
from qcal.packing.checkpoint import DEFAULT_FORMAT, is_quantized_checkpoint, save_checkpoint
from qcal.recipe import QuantRecipe
from qcal.run_config import Rotation
from qcal.schemes import (
    check_against_model,
    format_fields,
    linear_shapes,
    stored_sym,
    validate_scheme,
)


@dataclasses.dataclass
class RecipeOutcome:
    output: Path
    log: dict[str, Any]  # quant_log.json of the checkpoint
    evaluation: Any = None  # EvalOutcome when the recipe asked for one
    reused: bool = False  # the checkpoint was already there for this exact recipe


def run_recipe(recipe: QuantRecipe, *, cache: StepCache | None = None,
               policy: OutputPolicy | None = None, reuse: bool = False, progress: bool = True,
               shard_bytes: int | None = None, max_memory: int | None = None) -> RecipeOutcome:
    """Calibration -> quantize -> save (-> evaluate) for one recipe.

    `policy` says what may be replaced and whether to resume; `reuse` keeps an existing
    checkpoint made by this exact recipe instead of recomputing it. `shard_bytes` and
    `max_memory` bound the checkpoint's shards and the calibration activations held in RAM
    (RunOptions); neither changes a result.
    """
    policy = policy or OutputPolicy()
    # 1. Resolve the model and the device; per-module schemes are checked on the skeleton.
    device = resolve_device(recipe.device)
    source = Source(resolve_model_dir(recipe.model, recipe.trust_remote_code),
                    recipe.trust_remote_code)
    modules = recipe.modules
    if recipe.rotation is not None:  # what the fold cannot do exactly: before any work
        check_rotatable(source.skeleton, arch_for(source.skeleton))
    if modules.schemes or modules.targets or modules.ignore:
        # each pattern names a linear, each group fits: before any work
        check_against_model(linear_shapes(source.skeleton), recipe.modules, recipe.scheme)
    out = Path(recipe.output) if recipe.output else default_output_dir(
        recipe.model, recipe.method_name, recipe.scheme)
    key = recipe.checkpoint_key(source.model_dir)
    log = finished_checkpoint(out, key) if reuse else None
    reused = log is not None
    dist = from_env(device)
    if log is None:
        # 2. Read every input before any output exists: the tokenizer, its chat template and
        # the calibration data are refused here in one line, with nothing created yet.
        source.check_files()
        tokenizer = source.tokenizer
        calib = calibrate(recipe, tokenizer, cache, device) if recipe.uses_calibration() else None
        with contextlib.ExitStack() as stack:
            # 3. Guard the output (rank 0 checks and locks it; the other ranks follow).
            work = _enter_output(stack, dist, lambda: guarded_output(
                out, source.model_dir, policy, expected_bytes(source.model_dir, recipe)), out)
            # 4. Quantize layer by layer.
            opts = RunOptions(device=device, work_dir=work, resume=policy.resume,
                              progress=progress, dist=dist, selection=recipe.modules,
                              max_memory=max_memory,
                              **({"shard_bytes": shard_bytes} if shard_bytes else {}))
            done = quantize_layers(source, recipe.method_name, recipe.method,
                                   calib.input_ids if calib is not None else None, opts,
                                   rotation=recipe.rotation)
            # 5. Save.
            log = save(done, out, calib.manifest if calib is not None else None, opts,
                       extra_log={"recipe": recipe.to_dict(), "recipe_key": key,
                                  "notes": list(recipe.notes),
                                  **({"scheme_overrides": [
                                      o.spec() for o in recipe.modules.schemes]}
                                     if recipe.modules.schemes else {}),
                                  "processes": dist.world},
                       fmt=recipe.format, command=recipe.command)
            dist.barrier()  # rank 0 has saved; only then does it clean up the work dir
    # 6. Evaluate.
    evaluation = None
    if recipe.eval is not None and dist.is_main:
        from qcal.eval.job import run_evaluation

        evaluation = run_evaluation(out, recipe.eval, progress=progress, device=device,
                                    trust_remote_code=recipe.trust_remote_code)
    return RecipeOutcome(out, log, evaluation, reused)


class Source:
    """The model a run starts from: its checked directory, and (each built once, on first
    use) its meta skeleton, whether its layers hold re-expressed linears, and its tokenizer."""

    def __init__(self, model_dir: Path, trust_remote_code: bool = False) -> None:
        self.model_dir = model_dir
        self.trust_remote_code = trust_remote_code
        self._files_checked = False

    @functools.cached_property
    def skeleton(self) -> nn.Module:
        """Shapes only; a quantized checkpoint is refused here (start from the float model)."""
        return skeleton(self.model_dir, self.trust_remote_code)

    @functools.cached_property
    def adapted(self) -> bool:
        """Whether layers hold modules re-expressed as linears (Conv1D, fused experts)."""
        return not is_quantized_checkpoint(self.model_dir) and bool(arch_for(self.skeleton).adapted)

    @functools.cached_property
    def tokenizer(self) -> Any:
        return load_tokenizer(self.model_dir, self.trust_remote_code)

    def check_files(self) -> None:
        """Every weight file read once per run (truncation, NaN/Inf, float16 range) and its
        tensors matched against the config: no random initialisation, sane packing."""
        from qcal.model.consistency import check_model_files

        if not self._files_checked:
            check_weight_files(self.model_dir)
            check_model_files(self.model_dir, self.trust_remote_code)
            self._files_checked = True


def calibrate(recipe: QuantRecipe, tokenizer: Any, cache: StepCache | None = None,
              device: str = "cpu") -> Any:
    """The recipe's calibration set: a saved set, a cached build, or a fresh build."""
    from qcal.calib import resolve_calib
    from qcal.calib.io import load_calib_set, save_calib_set
    from qcal.calib.manifest import tokenizer_info

    cfg = recipe.calib
    assert cfg is not None
    options = {"device": device} if cfg.selector.startswith(("perplexity", "ppl")) else {}

    def build() -> Any:
        return resolve_calib(cfg.source, tokenizer, nsamples=cfg.nsamples, seqlen=cfg.seqlen,
                             seed=cfg.seed, selector=cfg.selector, text_field=cfg.text_field,
                             chat=cfg.chat, **options)

    if cache is None:
        return build()
    info = tokenizer_info(tokenizer)
    # The prefix joins the key only where there is one, so prefix-free keys stay as they were.
    key = fingerprint("calib", cfg, info["fingerprint"], *([info["prefix"]] if "prefix" in info
                                                           else []))
    path = cache.path("calib", cfg.selector, key)
    # Shards and workers that need the same set wait for the one that builds it.
    with exclusive_lock(path.parent / f".{path.name}.lock", wait=True):
        if (path / "manifest.json").is_file():
            return load_calib_set(path)
        calib = build()
        save_calib_set(calib, path)
    return calib


@dataclasses.dataclass
class Quantized:
    """Stage 4's result, what stage 5 saves."""

    net: nn.Module
    tokenizer: Any
    source_dir: Path
    method: str
    config: Any
    arch: Any  # the ArchSpec
    losses: dict[str, float | None]
    seconds: float
    rotation: dict[str, Any] | None = None  # what --rotate folded in (qcal.model.rotate)


def quantize_layers(source: Source, method: str, config: Any, calib_ids: torch.Tensor | None,
                    opts: RunOptions, rotation: Rotation | None = None) -> Quantized:
    """Load the model once and quantize it with `method`, layer by layer.

    With a work directory the float model streams: decoder layers stay on the meta device
    until their turn, finished layers go to the work dir, and the checkpoint is assembled
    from there shard by shard (qcal.model.stream, qcal.model.shards). Not where layers hold
    modules re-expressed as linears (Conv1D, fused experts): their files name others, nor
    with a `rotation`, which changes every weight the files hold before the method runs.
    """
    quant_method = METHODS.get(method)
    if type(config) is not quant_method.config_cls:  # exact: RTN-imatrix extends RTN-MSE
        raise ConfigError(f"method {method!r} takes a {quant_method.config_cls.__name__}")
    if quant_method.needs_calibration and calib_ids is None:
        raise ConfigError(f"method {method!r} needs calibration data; pass --calib")
    stream = (opts.work_dir is not None and opts.packed and not source.adapted
              and rotation is None)
    source.check_files()  # a no-op when the run checked them before its output existed
    net, tokenizer, src = load_model(source.model_dir, trust_remote_code=source.trust_remote_code,
                                     stream=stream, prelude=quant_method.needs_calibration,
                                     tokenizer=source.tokenizer, check=False)
    check_token_ids(calib_ids, net, "calibration")
    arch = arch_for(net)
    rotated = None
    if rotation is not None:
        probe = (calib_ids[:1, :64] if calib_ids is not None
                 else torch.arange(64).remainder(net.get_input_embeddings().weight.shape[0])[None])
        rotated = rotate_model(net, arch, rotation.seed, probe.to(next(net.parameters()).device))
    validate_scheme(net, config.scheme, opts.selection)
    overrides = opts.selection.schemes
    widths = {config.scheme.bits, *(o.bits for o in overrides if o.bits is not None)}
    if not opts.packed or not widths <= set(PACKABLE_BITS):
        raise ConfigError(
            f"{max(widths - set(PACKABLE_BITS), default=config.scheme.bits)}-bit results cannot "
            "be packed into a GPTQ checkpoint; "
            f"use bits in {PACKABLE_BITS} (other widths are available as fake-quant in Python)"
        )
    if (opts.weights_dir is None and not is_quantized_checkpoint(src) and not arch.adapted
            and rotated is None):
        # Just loaded and unchanged: methods may re-read layers instead of keeping them resident
        # (not where layers were re-expressed as linears: their tensors differ from the files).
        opts = dataclasses.replace(opts, weights_dir=Path(src))
    started = time.perf_counter()
    losses = quant_method.run(net, config, calib_ids, opts)
    return Quantized(net, tokenizer, Path(src), method, config, arch, losses,
                     time.perf_counter() - started, rotated)


def save(done: Quantized, out_dir: Path, calib_manifest: dict[str, Any] | None,
         opts: RunOptions, extra_log: dict[str, Any] | None = None, fmt: str = DEFAULT_FORMAT,
         command: str | None = None) -> dict[str, Any]:
    """Write the checkpoint with its quant_log.json (returned) and model card."""
    net, src, config = done.net, done.source_dir, done.config
    meta = {
        "method": done.method,
        "config": to_dict(config),
        "source_model": str(src),
        "calibration": calib_manifest,
        "quantize_seconds": round(done.seconds, 2),
        "format": fmt,
        "command": command,
    }
    if done.rotation is not None:
        meta["rotation"] = done.rotation
    log = {"losses": done.losses, **meta, **(extra_log or {}), "arch": done.arch.to_dict()}
    experts = expert_tokens(net)
    if experts:
        # Which experts saw how many routed tokens, and which got no calibration (RTN).
        log["moe"] = {"all_experts_calibrated": opts.selection.moe_all_experts,
                      "routed_tokens": experts,
                      "rtn_fallback": sorted(n for n, v in done.losses.items()
                                             if v is None and ".experts." in n)}
    extra: dict[str, str | bytes] = {"quant_log.json": json.dumps(log, indent=2, default=str),
                                     "README.md": model_card(log, fmt, str(src), command)}
    artifact = Path(opts.work_dir) / AWQ_ARTIFACT if opts.work_dir is not None else None
    if done.method == "awq" and artifact is not None and artifact.is_file():
        # Replayable with --awq-artifact; in a subfolder so weight loaders never read it.
        extra[f"artifacts/{AWQ_ARTIFACT}"] = artifact.read_bytes()
    # quant_log.json is written inside the atomic step: its presence marks a finished checkpoint.
    overrides = opts.selection.schemes
    sym = stored_sym(config.scheme, overrides)
    fields = format_fields(config.scheme, overrides, fmt,
                           METHODS.get(done.method).checkpoint_fields(config))
    if opts.dist.is_main and is_streamed(net):
        save_streamed_checkpoint(net, out_dir, done.tokenizer, sym=sym,
                                 work_dir=Path(opts.work_dir), source_dir=src,  # type: ignore[arg-type]
                                 fields=fields, meta=meta,
                                 extra_files=extra, fmt=fmt, shard_bytes=opts.shard_bytes)
    elif opts.dist.is_main:  # under torchrun every rank holds the same result; one writes it
        save_checkpoint(net, out_dir, done.tokenizer, sym=sym, fields=fields, meta=meta,
                        extra_files=extra, fmt=fmt)
    return log


def quantize_model_dir(
    model: str | Path | None, method: str, config: Any, out_dir: Path,
    calib_ids: torch.Tensor | None = None, calib_manifest: dict[str, Any] | None = None,
    opts: RunOptions | None = None, trust_remote_code: bool = False,
    extra_log: dict[str, Any] | None = None, fmt: str = DEFAULT_FORMAT, command: str | None = None,
) -> dict[str, Any]:
    """Stages 4 and 5 of a run for callers that hold the calibration ids: load `model`,
    quantize it with `method`, write the checkpoint to `out_dir`; returns quant_log.json.

    The caller guards the output (`qcal.output.guarded_output`); `opts.work_dir` holds resume
    state.
    """
    opts = opts or RunOptions()
    source = Source(resolve_model_dir(model, trust_remote_code), trust_remote_code)
    done = quantize_layers(source, method, config, calib_ids, opts)
    return save(done, out_dir, calib_manifest, opts, extra_log, fmt, command)


def replay_awq_model_dir(model: str | Path | None, artifact: str | Path,
                         out_dir: Path, trust_remote_code: bool = False, fmt: str = DEFAULT_FORMAT,
                         command: str | None = None) -> dict[str, Any]:
    """Apply a saved AWQ search (scales, clips) to `model` and write the checkpoint.

    No calibration data and no search: the artifact (`awq_search.safetensors` in the
    checkpoint of an earlier `qcal quantize --method awq`) fixes every choice, so the
    result equals that run's checkpoint. The caller guards the output.
    """
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


def finished_checkpoint(out: Path, key: str) -> dict[str, Any] | None:
    """quant_log.json of `out` when it is a finished checkpoint of the recipe with `key`."""
    try:
        log = json.loads((Path(out) / "quant_log.json").read_text())
    except (OSError, ValueError):
        return None
    return log if log.get("recipe_key") == key else None


def expected_bytes(model_dir: Path, recipe: QuantRecipe) -> int:
    """Disk the run needs: the checkpoint (at most the float files) plus, for layer-wise
    methods, per-layer resume state of about the same size."""
    floats = sum(f.stat().st_size for f in Path(model_dir).glob("*.safetensors"))
    return floats * (2 if recipe.uses_calibration() else 1)


def _enter_output(stack: contextlib.ExitStack, dist: DistContext, guard: Any, out: Path) -> Path:
    """Rank 0 checks and locks the output; the others learn whether it may proceed."""
    failure: BaseException | None = None
    work = work_dir_for(out)
    if dist.is_main:
        try:
            work = stack.enter_context(guard())
        except BaseException as err:  # noqa: BLE001  (re-raised below, after telling the ranks)
            failure = err
    if dist.all_reduce_min(0 if failure is not None else 1) == 0:
        if failure is not None:
            raise failure
        raise ConfigError(f"rank 0 refused the output {out}; its message says why")
    return work
