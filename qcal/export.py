"""`qcal export`: a quantized checkpoint rewritten in another checkpoint format.

A short route of its own, beside the quantization run (`qcal.run`): no calibration and no
quantization, only load -> save with the fields the target format needs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from qcal.config import ModuleSelection, QuantScheme, from_dict
from qcal.errors import ConfigError
from qcal.fsio import check_output, check_writable
from qcal.model.loading import load_model, resolve_model_dir
from qcal.output import OutputPolicy
from qcal.packing.card import model_card
from qcal.packing.checkpoint import (
    CHECKPOINT_KIND,
    is_legacy_qcal_checkpoint,
    is_quantized_checkpoint,
    save_checkpoint,
)
from qcal.schemes import check_format, format_fields, stored_sym


def export_checkpoint(src: str | Path, out_dir: Path, fmt: str, policy: OutputPolicy,
                      command: str | None = None) -> Path:
    """Rewrite a quantized checkpoint (any format qcal reads) in format `fmt`; `command`
    (the export's own command line) goes into the card, the source's stays in the log."""
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
