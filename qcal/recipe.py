"""`QuantRecipe`: the one description of a quantization job, from CLI to checkpoint.

A recipe names the model, the method config (its type picks the method), the
calibration config, the output, the device and whether remote code may run; the
scheme and the calibration seed live in those configs. `run_recipe` goes
calibration -> quantize -> save (-> evaluate). `qcal quantize` builds one recipe, a
comparison grid expands into many (`GridSpec.recipes`), and benchmark scripts build
them too, so the chain exists once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from pathlib import Path
from typing import Any

from qcal.cache import StepCache, fingerprint
from qcal.config import (
    CalibConfig,
    EvalConfig,
    GPTQConfig,
    ModuleSelection,
    QuantScheme,
)
from qcal.config import from_dict as config_from_dict
from qcal.config import to_dict as config_to_dict
from qcal.errors import ConfigError
from qcal.fsio import exclusive_lock
from qcal.model.distributed import from_env

# A method's config: a frozen dataclass with a `scheme`, registered in the method's own file
# (qcal.methods); which method runs follows from the config's type.
MethodConfig = Any


def method_config(method: str, scheme: QuantScheme, **options: Any) -> MethodConfig:
    """The config of method `method` with `scheme` and `options` (its other fields, by name);
    an unknown option is an error listing the fields, so nothing is silently dropped."""
    from qcal.methods import METHODS

    cls = METHODS.get(method).config_cls
    return config_from_dict(cls, {"scheme": config_to_dict(scheme), **options})


def fit_to_format(method: MethodConfig, fmt: str) -> tuple[MethodConfig, str | None]:
    """The method config a checkpoint format can store, and a note when it had to change.

    What a format cannot hold is refused here, before any model is loaded. compressed-tensors
    0.20 stores act-order only as `actorder: "weight"` (GPTQ's static groups: no g_idx), and the
    AWQ layout has no g_idx either, so --desc-act there means --desc-act --static-groups; the
    note says so in quant_log.json and the model card.
    """
    scheme = method.scheme
    if fmt != "gptq" and fmt != "gptq_v2" and scheme.allow_ragged:
        raise ConfigError(f"--format {fmt} needs whole groups; --allow-ragged-groups works with "
                          "--format gptq or gptq_v2 only: drop it or pick a group size that divides "
                          "in_features")
    desc_act = bool(getattr(method, "desc_act", False))
    if fmt == "awq" and scheme.bits != 4:
        raise ConfigError(f"--format awq holds 4-bit weights, not {scheme.bits}-bit; use --bits 4 "
                          "or the default --format compressed-tensors")
    if fmt in ("compressed-tensors", "awq") and desc_act and not getattr(method, "static_groups", True):
        return (dataclasses.replace(method, static_groups=True),
                f"act-order with static groups (--desc-act --static-groups): --format {fmt} "
                "stores contiguous groups without g_idx (compressed-tensors: actorder 'weight')")
    return method, None


@dataclasses.dataclass(frozen=True)
class QuantRecipe:
    """Everything that determines a quantized checkpoint (and, with `eval`, its numbers)."""

    method: MethodConfig = GPTQConfig()
    calib: CalibConfig | None = CalibConfig()
    model: str | None = None
    output: str | None = None
    device: str = "auto"
    trust_remote_code: bool = False
    eval: EvalConfig | None = None
    format: str = "compressed-tensors"  # checkpoint format (packing.checkpoint.FORMATS)
    command: str | None = None  # the command line that made the recipe, for the model card
    notes: tuple[str, ...] = ()  # choices made for the user (e.g. the automatic group size)
    # --targets/--ignore, --moe-all-experts, --scheme-override (modules.schemes)
    modules: ModuleSelection = ModuleSelection()

    def __post_init__(self) -> None:
        from qcal.packing.checkpoint import FORMATS

        if self.format not in FORMATS:
            raise ConfigError(f"--format {self.format!r} is unknown; use one of {', '.join(FORMATS)}")
        from qcal.schemes import check_format, format_note

        check_format(self.scheme, self.modules.schemes, self.format)  # per-module schemes
        loaders = format_note(self.scheme, self.modules.schemes, self.format)
        if loaders is not None and loaders not in self.notes:
            object.__setattr__(self, "notes", (*self.notes, loaders))
        method_cfg, note = fit_to_format(self.method, self.format)
        if note is not None:  # frozen: the one adjustment a format forces, recorded in notes
            object.__setattr__(self, "method", method_cfg)
            object.__setattr__(self, "notes", (*self.notes, note))
        from qcal.methods import method_for_config

        method = method_for_config(self.method)
        if method.needs_calibration and self.calib is None:
            raise ConfigError(f"method {method.name!r} needs calibration data; give the recipe a "
                              "CalibConfig (--calib ...)")

    @property
    def method_name(self) -> str:
        from qcal.methods import method_for_config

        return method_for_config(self.method).name

    @property
    def scheme(self) -> QuantScheme:
        return self.method.scheme

    @property
    def seed(self) -> int | None:
        return self.calib.seed if self.calib is not None else None

    def uses_calibration(self) -> bool:
        from qcal.methods import method_for_config

        return method_for_config(self.method).needs_calibration

    def checkpoint_key(self, model_dir: Path | str) -> str:
        """Fingerprint of what the checkpoint depends on (not output, device or eval)."""
        calib = self.calib if self.uses_calibration() else None
        # The default selection adds nothing, so keys of existing checkpoints stay valid.
        extra = () if self.modules.is_default() else (self.modules,)
        return fingerprint("checkpoint", str(Path(model_dir).resolve()), self.method, calib,
                           self.format, *extra)

    def to_dict(self) -> dict[str, Any]:
        return {"method": {"type": type(self.method).__name__, **config_to_dict(self.method)},
                "calib": config_to_dict(self.calib) if self.calib is not None else None,
                "model": self.model, "output": self.output, "device": self.device,
                "trust_remote_code": self.trust_remote_code,
                "eval": config_to_dict(self.eval) if self.eval is not None else None,
                "format": self.format, "command": self.command, "notes": list(self.notes),
                **({} if self.modules.is_default() else {"modules": config_to_dict(self.modules)})}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> QuantRecipe:
        from qcal.methods import method_config_types

        configs = method_config_types()
        raw = dict(data["method"])
        kind = raw.pop("type", None)
        if kind not in configs:
            raise ConfigError(f"recipe method type {kind!r} is unknown; known: "
                              f"{sorted(configs)}")
        return cls(method=config_from_dict(configs[kind], raw),
                   calib=config_from_dict(CalibConfig, data["calib"]) if data.get("calib") else None,
                   model=data.get("model"), output=data.get("output"),
                   device=data.get("device", "auto"),
                   trust_remote_code=bool(data.get("trust_remote_code", False)),
                   eval=config_from_dict(EvalConfig, data["eval"]) if data.get("eval") else None,
                   # recipes saved before the format field was written made GPTQ checkpoints
                   format=data.get("format", "gptq"), command=data.get("command"),
                   notes=tuple(data.get("notes") or ()),
                   modules=config_from_dict(ModuleSelection, data["modules"]) if data.get("modules")
                   else ModuleSelection())


@dataclasses.dataclass
class RecipeOutcome:
    output: Path
    log: dict[str, Any]  # quant_log.json of the checkpoint
    evaluation: Any = None  # EvalOutcome when the recipe asked for one
    reused: bool = False  # the checkpoint was already there for this exact recipe


def calibration_step(recipe: QuantRecipe, tokenizer: Any, model_dir: Path,
                     cache: StepCache | None = None, device: str = "cpu") -> Any:
    """The recipe's calibration set: a saved set, a cached build, or a fresh build."""
    from qcal.calib import resolve_calib
    from qcal.calib.io import load_calib_set, save_calib_set
    from qcal.calib.manifest import tokenizer_info

    cfg = recipe.calib
    assert cfg is not None
    options = {"device": device} if cfg.selector.startswith(("perplexity", "ppl")) else {}
    if cache is None:
        return resolve_calib(cfg.source, tokenizer, nsamples=cfg.nsamples, seqlen=cfg.seqlen,
                             seed=cfg.seed, selector=cfg.selector, text_field=cfg.text_field,
                             chat=cfg.chat, **options)
    info = tokenizer_info(tokenizer)
    # The prefix joins the key only where there is one, so prefix-free keys stay as they were.
    key = fingerprint("calib", cfg, info["fingerprint"], *([info["prefix"]] if "prefix" in info
                                                           else []))
    path = cache.path("calib", cfg.selector, key)
    # Shards and workers that need the same set wait for the one that builds it.
    with exclusive_lock(path.parent / f".{path.name}.lock", wait=True):
        if (path / "manifest.json").is_file():
            return load_calib_set(path)
        calib = resolve_calib(cfg.source, tokenizer, nsamples=cfg.nsamples, seqlen=cfg.seqlen,
                              seed=cfg.seed, selector=cfg.selector, text_field=cfg.text_field,
                              chat=cfg.chat, **options)
        save_calib_set(calib, path)
    return calib


def finished_checkpoint(out: Path, key: str) -> dict[str, Any] | None:
    """quant_log.json of `out` when it is a finished checkpoint of the recipe with `key`."""
    try:
        log = json.loads((Path(out) / "quant_log.json").read_text())
    except (OSError, ValueError):
        return None
    return log if log.get("recipe_key") == key else None


def run_recipe(recipe: QuantRecipe, *, cache: StepCache | None = None, policy: Any = None,
               reuse: bool = False, progress: bool = True, shard_bytes: int | None = None,
               max_memory: int | None = None) -> RecipeOutcome:
    """Calibration -> quantize -> save (-> evaluate) for one recipe.

    `policy` (OutputPolicy) says what may be replaced and whether to resume; `reuse`
    keeps an existing checkpoint made by this exact recipe instead of recomputing it.
    `shard_bytes` and `max_memory` bound the checkpoint's shards and the calibration
    activations held in RAM (RunOptions); neither changes a result.
    """
    from qcal.devices import resolve_device
    from qcal.methods import RunOptions
    from qcal.model.loading import load_tokenizer, resolve_model_dir
    from qcal.pipeline import OutputPolicy, default_output_dir, guarded_output, quantize_model_dir

    policy = policy or OutputPolicy()
    device = resolve_device(recipe.device)
    model_dir = resolve_model_dir(recipe.model, recipe.trust_remote_code)
    if recipe.modules.schemes:  # each pattern names a linear, each group fits: before any work
        from qcal.schemes import check_against_model, linear_shapes

        check_against_model(linear_shapes(model_dir, recipe.trust_remote_code), recipe.modules,
                            recipe.scheme)
    out = Path(recipe.output) if recipe.output else default_output_dir(
        recipe.model, recipe.method_name, recipe.scheme)
    key = recipe.checkpoint_key(model_dir)
    log = finished_checkpoint(out, key) if reuse else None
    reused = log is not None
    dist = from_env(device)
    if log is None:
        with contextlib.ExitStack() as stack:
            work = _enter_output(stack, dist, lambda: guarded_output(
                out, model_dir, policy, expected_bytes(model_dir, recipe)), out)
            calib_ids, manifest = None, None
            if recipe.uses_calibration():
                tokenizer = load_tokenizer(model_dir, recipe.trust_remote_code)
                calib = calibration_step(recipe, tokenizer, model_dir, cache, device)
                calib_ids, manifest = calib.input_ids, calib.manifest
            opts = RunOptions(device=device, work_dir=work, resume=policy.resume,
                              progress=progress, dist=dist, selection=recipe.modules,
                              max_memory=max_memory,
                              **({"shard_bytes": shard_bytes} if shard_bytes else {}))
            log = quantize_model_dir(model_dir, recipe.method_name, recipe.method, out, calib_ids,
                                     manifest, opts, trust_remote_code=recipe.trust_remote_code,
                                     extra_log={"recipe": recipe.to_dict(), "recipe_key": key,
                                                "notes": list(recipe.notes),
                                                **({"scheme_overrides": [
                                                    o.spec() for o in recipe.modules.schemes]}
                                                   if recipe.modules.schemes else {}),
                                                "processes": dist.world},
                                     fmt=recipe.format, command=recipe.command)
            dist.barrier()  # rank 0 has saved; only then does it clean up the work dir
    evaluation = None
    if recipe.eval is not None and dist.is_main:
        from qcal.eval.job import run_evaluation

        evaluation = run_evaluation(out, recipe.eval, progress=progress, device=device,
                                    trust_remote_code=recipe.trust_remote_code)
    return RecipeOutcome(out, log, evaluation, reused)


def _enter_output(stack: contextlib.ExitStack, dist: Any, guard: Any, out: Path) -> Path:
    """Rank 0 checks and locks the output; the others learn whether it may proceed."""
    from qcal.pipeline import work_dir_for

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


def expected_bytes(model_dir: Path, recipe: QuantRecipe) -> int:
    """Disk the run needs: the checkpoint (at most the float files) plus, for layer-wise
    methods, per-layer resume state of about the same size."""
    floats = sum(f.stat().st_size for f in Path(model_dir).glob("*.safetensors"))
    return floats * (2 if recipe.uses_calibration() else 1)
