"""`QuantRecipe`: the one description of a quantization job, from CLI to checkpoint.

A recipe names the model, the method config (its type picks the method), the
calibration config, the output, the device and whether remote code may run; the
scheme and the calibration seed live in those configs. It is data only: `qcal.run`'s
`run_recipe` runs it (calibration -> quantize -> save -> evaluate). `qcal quantize` builds
one recipe, a comparison grid expands into many (`GridSpec.recipes`), the Python API and
benchmark scripts build them too, so the chain exists once.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from qcal.cache import fingerprint
from qcal.config import (
    GPTQConfig,
    ModuleSelection,
    QuantScheme,
)
from qcal.config import from_dict as config_from_dict
from qcal.config import to_dict as config_to_dict
from qcal.errors import ConfigError
from qcal.run_config import CalibConfig, EvalConfig, Rotation

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
    # --rotate: folded into the float weights before the method runs (qcal.model.rotate).
    rotation: Rotation | None = None

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
        if self.rotation is not None:  # unrotated recipes keep the keys they had
            extra = (*extra, self.rotation)
        return fingerprint("checkpoint", str(Path(model_dir).resolve()), self.method, calib,
                           self.format, *extra)

    def to_dict(self) -> dict[str, Any]:
        return {"method": {"type": type(self.method).__name__, **config_to_dict(self.method)},
                "calib": config_to_dict(self.calib) if self.calib is not None else None,
                "model": self.model, "output": self.output, "device": self.device,
                "trust_remote_code": self.trust_remote_code,
                "eval": config_to_dict(self.eval) if self.eval is not None else None,
                "format": self.format, "command": self.command, "notes": list(self.notes),
                **({} if self.modules.is_default() else {"modules": config_to_dict(self.modules)}),
                **({} if self.rotation is None else {"rotation": config_to_dict(self.rotation)})}

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
                   else ModuleSelection(),
                   rotation=config_from_dict(Rotation, data["rotation"]) if data.get("rotation")
                   else None)
