"""Every option of every command, every grid key and every parameter of the Python API has a
type rule and, where it is a number, a string or a list, an upper bound (issue 52: 10^4
processes filled 23 GB, 10^9 bins just started, a megabyte-long value came back as a
megabyte-long error line). A new option without one fails here."""

from __future__ import annotations

import inspect
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import pytest
from annotated_types import Le, Lt, MaxLen
from pydantic import AfterValidator, BeforeValidator, StringConstraints, WrapValidator
from pydantic.fields import FieldInfo

from qcal.schema import COMMAND_SCHEMAS, GridKeys

pytestmark = pytest.mark.unit
RULES = (AfterValidator, BeforeValidator, WrapValidator)


def _metadata(annotation: Any) -> tuple[Any, list[Any]]:
    """(the bare type, the constraints wrapped around it)."""
    found: list[Any] = []
    while get_origin(annotation) is Annotated:
        annotation, *extra = get_args(annotation)
        for item in extra:
            found.extend(item.metadata if isinstance(item, FieldInfo) else [item])
    return annotation, found


def _has_upper(meta: list[Any]) -> bool:
    return any(isinstance(m, Le | Lt) or (isinstance(m, StringConstraints) and m.max_length)
               or isinstance(m, (MaxLen, *RULES)) for m in meta)


def problems(annotation: Any, meta: list[Any], where: str) -> list[str]:
    bare, inner = _metadata(annotation)
    meta = meta + inner
    origin = get_origin(bare)
    if bare is type(None) or bare is bool or origin is Literal or bare is Path:
        return []  # a flag, a closed set, a path (the OS bounds its length, the fsio rules it)
    if origin in (Union, types.UnionType):
        return [p for arm in get_args(bare) for p in problems(arm, meta, where)]
    if bare in (int, float, str):
        return [] if _has_upper(meta) else [f"{where}: {bare.__name__} without an upper bound"]
    if origin in (list, tuple):
        out = [] if _has_upper(meta) else [f"{where}: a list without a length bound"]
        return out + [p for arm in get_args(bare) if arm is not Ellipsis
                      for p in problems(arm, [], where + "[]")]
    if origin is dict:
        return [] if any(isinstance(m, RULES) for m in meta) else [f"{where}: a dict without "
                                                                   "a rule"]
    return [f"{where}: {bare!r} has no type rule"]


def field_problems(model: Any, name: str) -> list[str]:
    out = []
    for field, info in model.model_fields.items():
        out += problems(info.annotation, list(info.metadata), f"{name} {field}")
    return out


def test_every_cli_option_and_grid_key_is_typed_and_bounded() -> None:
    found = [p for name, model in COMMAND_SCHEMAS.items() for p in field_problems(model, name)]
    found += field_problems(GridKeys, "grid key")
    assert not found, "\n".join(found)


def test_every_api_parameter_is_validated_by_the_schema() -> None:
    """The API's keyword arguments reach the quantize schema (qcal.api says which field
    each one is): a parameter with no field there would go unchecked."""
    import qcal.api

    for fn, command, objects in ((qcal.api.quantize, "quantize", qcal.api.NOT_OPTIONS),
                                 (qcal.api.evaluate, "eval", {"model", "base", "progress"})):
        fields = set(COMMAND_SCHEMAS[command].model_fields)
        hints = typing.get_type_hints(fn)
        for param in inspect.signature(fn).parameters.values():
            if param.kind is param.VAR_KEYWORD or param.name in objects:
                continue
            assert param.name in fields or qcal.api.FIELD_OF.get(param.name) in fields, (
                f"qcal.{fn.__name__}({param.name}=...) has no schema field "
                f"({hints.get(param.name)})")
    eval_fields = set(COMMAND_SCHEMAS["eval"].model_fields)
    assert set(qcal.api.EVAL_OPTION_FIELDS) <= eval_fields
