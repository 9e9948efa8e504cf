"""One schema for every input: each command's options and each grid key are typed models
(pydantic) with ranges, enums and cross-field rules, checked before any model is loaded
or any output or work directory is created.

argparse only parses strings; `validate_args` decides, and writes the typed values back
into the namespace. A refusal is a ConfigError with one line naming the field, the value,
what is allowed and the fix (the CLI prints it and exits 2).

Adding an option is one step in two places side by side: `p.add_argument(...)` (with help;
argparse's `type=` is dropped, the schema converts) and one field with the same `dest`
name and default in the command's model in `commands.py`; a new grid key is a `GridSpec`
field plus one `GridKeys` field in `grid.py`. A method's own `qcal quantize` flags are
declared once, in the method's file (`MethodFlag`: option, help, default and pydantic type),
and join `QuantizeOptions` from the method registry. tests/unit/test_schema_coverage.py fails on
an option or grid field without its rule, or with a different default.
"""

from __future__ import annotations

import argparse
from typing import Any

from qcal.schema.commands import COMMAND_SCHEMAS
from qcal.schema.fields import Options, error_line, validate
from qcal.schema.grid import GridKeys

# Namespace entries the CLI itself sets: not options of the user.
INTERNAL = frozenset({"handler", "command", "calib_command", "command_line", "interrupt_hint"})


def command_key(args: argparse.Namespace) -> str:
    sub = getattr(args, "calib_command", None)
    return f"{args.command} {sub}" if sub else str(args.command)


def validate_args(args: argparse.Namespace, flags: dict[str, str] | None = None) -> Options:
    """Check `args` against its command's model; the typed values replace the parsed strings.
    `flags` maps a dest to the option string the user knows (`n` -> `--n`)."""
    model = COMMAND_SCHEMAS[command_key(args)]
    flags = flags or {}
    data = {k: v for k, v in vars(args).items() if k not in INTERNAL}

    def label(field: str) -> str:
        return flags.get(field, "--" + field.replace("_", "-")) if field else f"qcal {command_key(args)}:"

    options = validate(model, data, label)
    for field in model.model_fields:
        setattr(args, field, getattr(options, field))
    return options


def validate_grid_keys(raw: dict[str, Any], where: str = "grid") -> dict[str, Any]:
    """The keys given in a grid config, checked and typed (lists become tuples)."""
    model = validate(GridKeys, raw, lambda field: f"{where} key {field}" if field else where, repr,
                     yaml=True)
    out = {}
    for key in raw:
        value = getattr(model, key)
        out[key] = tuple(value) if isinstance(value, list) else value
    return out


__all__ = ["COMMAND_SCHEMAS", "GridKeys", "Options", "command_key", "error_line",
           "validate_args", "validate_grid_keys"]
