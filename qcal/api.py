"""The Python API: `qcal.quantize`, `qcal.load`, `qcal.evaluate` (and `qcal.calib.build`).

The same route as the command line: each call builds a `QuantRecipe` / `EvalConfig` and
runs `run_recipe` / `run_evaluation`, so a notebook and `qcal quantize` write the same
checkpoint. Messages go to the `qcal` logger; nothing is printed and no progress bar is
drawn unless asked (`progress=True`).

    import qcal
    model = qcal.quantize("HuggingFaceTB/SmolLM2-135M-Instruct", method="gptq",
                          calib="debian-handbook", scheme={"bits": 4, "group_size": 64},
                          output="runs/smol-gptq")
    print(qcal.evaluate(model, ppl=True))
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from qcal.config import (
    ModuleSelection,
    QuantScheme,
    SchemeOverride,
    parse_scheme_override,
)
from qcal.config import from_dict as config_from_dict
from qcal.errors import ConfigError
from qcal.model.hub import parse_hub_id
from qcal.run_config import CalibConfig, EvalConfig, Rotation

CHECKPOINT_ATTR = "qcal_checkpoint"  # set on models qcal returns: the folder they came from
# qcal.quantize's parameters that are no `qcal quantize` option: objects, or checked apart
# (`scheme` as bits/group_size/sym, `method_options` against the method's config).
NOT_OPTIONS = frozenset({"model", "tokenizer", "scheme", "progress", "method_options"})
FIELD_OF = {"scheme_overrides": "scheme_override"}  # API name -> the schema's field
# qcal.evaluate's **options that are `qcal eval` options of the same name (task_limits is
# converted to --task-limit's TASK=N form).
EVAL_OPTION_FIELDS = ("stride", "batch_size", "source", "num_fewshot", "task_batch_size",
                      "confidence", "ece_bins")


def _validated(values: dict[str, Any], scheme: Any, method: str,
               method_options: dict[str, Any]) -> None:
    """The API's arguments through the schema `qcal quantize` uses (types and bounds
    included), so a notebook is refused exactly where the command line is."""
    from qcal.schema import COMMAND_SCHEMAS
    from qcal.schema.fields import validate
    from qcal.schema.grid import check_config_options

    data = {FIELD_OF.get(k, k): v for k, v in values.items() if v is not None}
    for key in ("targets", "ignore", "scheme_override"):
        value = data.get(key, ())
        if isinstance(value, str):
            data[key] = [value]  # one pattern, never its characters
        elif isinstance(value, (list, tuple)):
            data[key] = [v.spec() if isinstance(v, SchemeOverride) else v for v in value]
    # Paths come as strings or Paths, as on the command line: the schema types them.
    if isinstance(data.get("calib"), Path):
        data["calib"] = str(data["calib"])
    if isinstance(data.get("output"), str):
        data["output"] = Path(data["output"])
    if isinstance(scheme, dict):
        data.update({("group_size" if k == "group" else k): v for k, v in scheme.items()})
    api_name = {v: k for k, v in FIELD_OF.items()}
    validate(COMMAND_SCHEMAS["quantize"], data,
             lambda field: f"qcal.quantize({api_name.get(field, field)}=...)" if field
             else "qcal.quantize:", repr, strict=True)
    try:
        check_config_options(method, method_options)
    except ValueError as err:
        raise ConfigError("qcal.quantize: " + str(err).replace(f"method_options.{method}.", "")
                          .replace(f"method_options.{method} ", "")) from None


def _scheme(scheme: QuantScheme | dict[str, Any] | None, model_dir: Path,
            trust_remote_code: bool) -> tuple[QuantScheme, str | None]:
    """The scheme, with `group_size` "auto" (or absent) resolved as the CLI does."""
    if isinstance(scheme, QuantScheme):
        return scheme, None
    fields = dict(scheme or {})
    if "group" in fields:  # the short name the CLI's --scheme-override syntax uses
        fields["group_size"] = fields.pop("group")
    note = None
    if fields.get("group_size", "auto") == "auto":
        from qcal.model.shapes import default_group_size

        fields["group_size"], note = default_group_size(model_dir, trust_remote_code)
    return config_from_dict(QuantScheme, fields), note


def _model_dir(model: Any, tokenizer: Any, tmp: Path, trust_remote_code: bool) -> Path:
    """A folder holding `model`: as given (path, Hub id, None = the default model), or an
    in-memory PreTrainedModel saved as safetensors under the temporary folder `tmp`."""
    from qcal.model.loading import resolve_model_dir

    if model is None or isinstance(model, (str, Path)):
        return resolve_model_dir(model, trust_remote_code)
    if not hasattr(model, "save_pretrained"):
        raise ConfigError(f"qcal.quantize takes a path, a Hub id or a transformers "
                          f"PreTrainedModel, not {type(model).__name__}")
    source = getattr(model, CHECKPOINT_ATTR, None)
    if source is not None:
        raise ConfigError(f"{source} is already quantized; quantize the float model")
    if tokenizer is None:
        raise ConfigError("an in-memory model needs its tokenizer: qcal.quantize(model, "
                          "tokenizer=tokenizer, ...)")
    folder = tmp / "model"
    model.save_pretrained(str(folder), safe_serialization=True)
    tokenizer.save_pretrained(str(folder))
    origin = str(getattr(model, "name_or_path", "") or "")
    if parse_hub_id(origin) is not None and not Path(origin).exists():
        # The model card names the Hub model it came from, not this temporary folder.
        (folder / "PROVENANCE.json").write_text(json.dumps({"original": origin}))
    return folder


def quantize(model: Any = None, *, tokenizer: Any = None, method: str = "gptq",
             calib: Any = "debian-handbook", scheme: QuantScheme | dict[str, Any] | None = None,
             output: str | Path | None = None, format: str | None = None,
             selector: str = "random", nsamples: int = 128, seqlen: int = 512, seed: int = 0,
             text_field: str = "text", chat: bool = False, device: str = "auto",
             overwrite: bool = False, progress: bool = False,
             trust_remote_code: bool = False, targets: str | Sequence[str] = (),
             ignore: str | Sequence[str] = (), moe_all_experts: bool = False,
             scheme_overrides: Sequence[str | SchemeOverride] = (),
             rotate: str | None = None, **method_options: Any) -> Any:
    """Quantize `model` and write the checkpoint to `output`; returns the quantized model.

    `model`: a local folder, a Hub id (`org/name[@revision]`), None (qcal's default
    model) or an in-memory `PreTrainedModel` (pass its `tokenizer`). `calib`: anything
    `--calib` takes (corpus name, file, dataset folder, saved set) or a `CalibSet` from
    `qcal.calib.build`; `text_field` / `chat` say how records become text (--text-field,
    --chat). `scheme`: a QuantScheme or its fields as a dict (bits,
    group_size = "auto" by default, sym). `method_options`: the method config's other
    fields (e.g. desc_act=True for GPTQ). `format`: the checkpoint format (default
    compressed-tensors, which bare transformers, lm_eval and vLLM load). `targets` /
    `ignore` (regexes on full linear names) and `moe_all_experts` are --targets, --ignore
    and --moe-all-experts. `scheme_overrides`: per-module schemes as --scheme-override
    writes them (`r".*down_proj=bits:8,group:128"`) or SchemeOverride objects; the first
    matching one decides a linear's scheme. `rotate`: --rotate (`"hadamard"` or
    `"hadamard:SEED"`), folded into the float weights before the method runs.
    """
    from qcal.methods import METHODS
    from qcal.output import OutputPolicy, default_output_dir
    from qcal.packing.checkpoint import DEFAULT_FORMAT
    from qcal.recipe import QuantRecipe, method_config
    from qcal.run import run_recipe

    quant_method = METHODS.get(method)  # an unknown name lists the known ones
    _validated({"method": method, "calib": calib if isinstance(calib, (str, Path)) else None,
                "output": output, "format": format, "selector": selector,
                "nsamples": nsamples, "seqlen": seqlen, "seed": seed, "text_field": text_field,
                "chat": chat, "device": device, "overwrite": overwrite,
                "trust_remote_code": trust_remote_code, "targets": targets, "ignore": ignore,
                "moe_all_experts": moe_all_experts, "scheme_overrides": scheme_overrides,
                "rotate": rotate},
               scheme, method, method_options)
    overrides = tuple(o if isinstance(o, SchemeOverride) else parse_scheme_override(str(o))
                      for o in ([scheme_overrides] if isinstance(scheme_overrides, str)
                                else scheme_overrides))
    with tempfile.TemporaryDirectory(prefix="qcal-api-") as tmp:
        model_dir = _model_dir(model, tokenizer, Path(tmp), trust_remote_code)
        resolved, note = _scheme(scheme, model_dir, trust_remote_code)
        calib_cfg = None
        if quant_method.needs_calibration:
            source = calib
            if not isinstance(calib, (str, Path)):  # a CalibSet built in Python
                from qcal.calib.io import save_calib_set

                source = save_calib_set(calib, Path(tmp) / "calib")
            calib_cfg = CalibConfig(selector=selector, source=str(source), nsamples=nsamples,
                                    seqlen=seqlen, seed=seed, text_field=text_field, chat=chat)
        name = model if isinstance(model, (str, Path)) else None
        out = Path(output) if output is not None else default_output_dir(
            Path(str(name)).name if name else None, method, resolved)
        recipe = QuantRecipe(method=method_config(method, resolved, **method_options),
                             calib=calib_cfg, model=str(model_dir), output=str(out),
                             device=device, trust_remote_code=trust_remote_code,
                             format=format or DEFAULT_FORMAT,
                             command=f"qcal.quantize({_describe(model)!r}, method={method!r})",
                             notes=(note,) if note else (),
                             modules=ModuleSelection(targets, ignore, moe_all_experts,
                                                     overrides),
                             rotation=Rotation.parse(rotate) if rotate else None)
        outcome = run_recipe(recipe, policy=OutputPolicy(overwrite=overwrite), progress=progress)
    return load(outcome.output, device="cpu")


def _describe(model: Any) -> str:
    return str(model) if model is None or isinstance(model, (str, Path)) else type(model).__name__


def load(path: str | Path, *, device: str = "cpu", dtype: Any = None,
         trust_remote_code: bool = False) -> Any:
    """A quantized checkpoint in any format qcal reads (or a float model folder / Hub id),
    as a transformers model in eval mode; quantized linears are qcal's QuantLinear."""
    from qcal.model.loading import load_model, resolve_model_dir

    folder = resolve_model_dir(path, trust_remote_code)
    net, tokenizer, src = load_model(folder, dtype=dtype, trust_remote_code=trust_remote_code)
    setattr(net, CHECKPOINT_ATTR, str(src))
    net.qcal_tokenizer = tokenizer
    return net.to(device)


def evaluate(model: Any = None, *, tasks: Sequence[str] = (), ppl: bool = True,
             langs: Sequence[str] = ("en",), limit: int | None = None, seqlen: int = 512,
             max_windows: int | None = 16, base: Any = None, device: str = "auto",
             progress: bool = False, **options: Any) -> dict[str, Any]:
    """Perplexity on held-out text (`ppl`, per language in `langs`) and lm-eval `tasks`
    (first `limit` items) of `model`: a folder, a Hub id, or a model from qcal.load /
    qcal.quantize; `base` adds drift from that model. Returns the results dict that
    `qcal eval` writes as JSON. `options` are further EvalConfig fields."""
    from qcal.eval.job import run_evaluation
    from qcal.schema import COMMAND_SCHEMAS
    from qcal.schema.fields import validate

    def joined(names: Any) -> Any:  # the CLI's comma lists; one string stays one name list
        return names if isinstance(names, str) or not isinstance(names, (list, tuple)) \
            else ",".join(map(str, names))

    limits = options.get("task_limits", ())
    data = {"ppl": ppl, "langs": joined(langs), "tasks": joined(tasks) or None, "limit": limit,
            "seqlen": seqlen, "max_windows": max_windows, "device": device,
            "task_limit": [f"{t}={n}" for t, n in limits] if isinstance(limits, (list, tuple))
            else limits,
            **{k: v for k, v in options.items() if k in EVAL_OPTION_FIELDS}}
    validate(COMMAND_SCHEMAS["eval"], {k: v for k, v in data.items() if v is not None},
             lambda field: f"qcal.evaluate({field}=...)" if field else "qcal.evaluate:", repr,
             strict=True)
    cfg = EvalConfig(tasks=tuple(tasks), ppl=ppl, langs=tuple(langs), limit=limit,
                     seqlen=seqlen, max_windows=max_windows, **options)
    outcome = run_evaluation(_path_of(model), cfg, base=_path_of(base) if base is not None
                             else None, device=device, progress=progress)
    return outcome.data


def _path_of(model: Any) -> str | None:
    if model is None or isinstance(model, (str, Path)):
        return None if model is None else str(model)
    for source in (getattr(model, CHECKPOINT_ATTR, None),
                   getattr(model, "name_or_path", None)):
        if source and Path(str(source)).is_dir():
            return str(source)
    raise ConfigError("qcal.evaluate takes a folder, a Hub id, or a model returned by qcal.load "
                      "or qcal.quantize; save an in-memory model with save_pretrained first")


def build_calib_set(source: str = "debian-handbook", **kwargs: Any) -> Any:
    """`qcal.calib.build`: a calibration set (CalibSet) with its manifest."""
    from qcal.calib import build

    return build(source, **kwargs)


__all__ = ["build_calib_set", "evaluate", "load", "quantize"]
