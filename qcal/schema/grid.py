"""The keys of a grid YAML (`qcal compare --config`) and of a saved grid.json, typed.

One field per `GridSpec` field (tests/unit/test_schema_coverage.py checks that). Values
are strict: YAML's `"false"` is not a boolean, `2.7` is not a count, `abc` is not a
length. An axis takes one value or a list; list-valued keys also take a comma string.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    Strict,
    StringConstraints,
    field_validator,
    model_validator,
)

from qcal.schema.fields import (
    MAX_LIST,
    Options,
    PlainName,
    RotationText,
    SchemeOverrideText,
    Selector,
    Source,
    Text,
)

MAX_AXIS = 64  # values of one grid axis; the cell count has its own bound (--max-cells)
MAX_KEYS = 256  # entries of a mapping key (method_options, task_limits, ...)
StrictInt = Annotated[int, Strict()]
Bool = Annotated[bool, Strict()]
Bits = Annotated[int, Strict(), Field(ge=1, le=16,
                                      description="2, 3, 4 or 8 (what a checkpoint can pack)")]
Group = (Annotated[int, Strict(), Field(ge=-1, le=1 << 20)]
         | Annotated[str, Strict(), StringConstraints(max_length=16)])
Windows = Annotated[int, Strict(), Field(ge=1, le=1_000_000)]
Tokens = Annotated[int, Strict(), Field(ge=2, le=1 << 20)]
SeedValue = Annotated[int, Strict(), Field(ge=0, le=2**32 - 1)]


def _few_keys(value: dict) -> dict:
    if len(value) > MAX_KEYS:
        raise ValueError(f"has {len(value)} entries (at most {MAX_KEYS})")
    return value


def _comma(value: Any) -> Any:
    return [v.strip() for v in value.split(",") if v.strip()] if isinstance(value, str) else value


def _axis(kind: Any) -> Any:
    return kind | Annotated[list[kind], Field(max_length=MAX_AXIS)]


def check_config_options(method: str, options: dict[str, Any]) -> None:
    """method_options of one method: each a field of its config type, each value of that
    field's type (strict: "lots" is no damping fraction, "false" no boolean)."""
    import dataclasses
    import typing

    from pydantic import TypeAdapter, ValidationError

    from qcal.methods import METHODS
    from qcal.schema.fields import did_you_mean

    cls = METHODS.get(method).config_cls
    hints = typing.get_type_hints(cls)
    fields = [f.name for f in dataclasses.fields(cls) if f.name != "scheme"]
    for key, value in options.items():
        if key not in fields:
            raise ValueError(f"method_options.{method} has no option {key!r}; "
                             f"{did_you_mean(str(key), fields)}known: {', '.join(fields)}")
        try:
            TypeAdapter(hints[key]).validate_python(value, strict=True)
        except ValidationError as err:
            want = getattr(hints[key], "__name__", str(hints[key]))
            raise ValueError(f"method_options.{method}.{key} {value!r} is not a {want} "
                             f"({err.errors()[0]['msg'].lower()}); e.g. "
                             f"{key}: {getattr(cls(), key)!r}") from None


class GridKeys(Options):
    name: PlainName = "grid"
    model: Text | None | Annotated[list[Text | None], Field(max_length=MAX_AXIS)] = None
    selectors: Annotated[list[Selector], BeforeValidator(_comma)] = Field(
        ["random", "zipf"], description="a list of selectors, e.g. [random, zipf, ml:de]",
        min_length=1, max_length=MAX_AXIS)
    methods: Annotated[list[Text], BeforeValidator(_comma)] = Field(
        ["rtn", "gptq"], description="a list of methods, e.g. [rtn, gptq, awq]", min_length=1,
        max_length=MAX_AXIS)
    bits: _axis(Bits) = Field(4, description="2, 3, 4 or 8, or a list of them", examples=[4])
    group_size: _axis(Group) = Field(
        "auto", description="auto, -1 or a positive integer (or a list)", examples=[128])
    allow_ragged_groups: Bool = False
    sym: _axis(Bool) = Field(False, description="true or false (not a string), or a list")
    desc_act: _axis(Bool) = Field(False, description="true or false (not a string), or a list")
    rotate: _axis(RotationText | None) = Field(
        None, description="null (no rotation), hadamard or hadamard:SEED, or a list of them")
    method_options: Annotated[dict[Text, dict[Text, Any]], AfterValidator(_few_keys)] = Field(
        {}, description="must map a method to its options, e.g. {gptq: {damp_percent: 0.02}}")
    selector_options: Annotated[dict[Text, dict[Text, Any]], AfterValidator(_few_keys)] = Field(
        {}, description="must map a selector to its options, e.g. {perplexity: {max_candidates: 256}}")
    source: Source = "debian-handbook"
    nsamples: _axis(Windows) = Field(
        128, description="an integer >= 1, or a list", examples=[128])
    seqlen: Tokens = Field(
        512, description="an integer >= 2 (tokens per window)", examples=[512])
    seed: _axis(SeedValue) = Field(
        0, description="an integer >= 0, or a list", examples=[0])
    eval_langs: Annotated[list[PlainName], BeforeValidator(_comma)] = Field(
        ["en"], description="a list of languages, e.g. [en, de]", max_length=MAX_LIST)
    eval_seqlen: Tokens = Field(
        512, description="an integer >= 2", examples=[512])
    max_windows: Windows | None = Field(
        None, description="an integer >= 1 (or null: all windows)", examples=[16])
    tasks: Annotated[list[PlainName], BeforeValidator(_comma)] = Field(
        [], description="a list of task names", max_length=MAX_LIST)
    confidence: Bool = False
    limit: Windows | None = Field(
        None, description="an integer >= 1 (or null: all items)", examples=[100])
    task_limits: Annotated[dict[Text, Windows], AfterValidator(_few_keys)] = Field(
        {}, description="must map a task to its number of items, e.g. {mmlu: 50}")
    eval_text_file: Text | None = None
    scheme_overrides: Annotated[list[SchemeOverrideText], Field(max_length=MAX_LIST)] = Field(
        [], description="a list of 'REGEX=bits:B,group:G[,sym:true|false]' (or 'REGEX=skip')")
    allow_leakage: Bool = False

    @field_validator("methods")
    @classmethod
    def _methods(cls, methods: list[str]) -> list[str]:
        from qcal.schema.commands import check_method

        return [check_method(m) for m in methods]

    @field_validator("bits")
    @classmethod
    def _bits(cls, value: int | list[int]) -> int | list[int]:
        for bits in value if isinstance(value, list) else [value]:
            if bits not in (2, 3, 4, 8):
                raise ValueError(f"{bits}-bit weights cannot be packed into a checkpoint; use "
                                 "2, 3, 4 or 8")
        return value

    @field_validator("group_size")
    @classmethod
    def _groups(cls, value: int | str | list[int | str]) -> int | str | list[int | str]:
        from qcal.schema.commands import check_group_size

        for group in value if isinstance(value, list) else [value]:
            check_group_size(group)
        return value

    @model_validator(mode="after")
    def _rules(self) -> GridKeys:
        for method, options in self.method_options.items():
            if method in self.methods:
                check_config_options(method, options)
        for task in self.task_limits:
            if task not in self.tasks:
                raise ValueError(f"task_limits names {task!r}, which is not in --tasks (grid "
                                 f"key tasks) {self.tasks}; add it there or drop its limit")
        return self
