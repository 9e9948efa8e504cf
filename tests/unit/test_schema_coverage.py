"""The schema covers every input: each argparse option of each subcommand has a field in its
command's model, each GridSpec field a grid key, and every option has help text that shows
its default. A new option without a schema rule fails here."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from qcal.cli import build_parser, option_actions, subcommands
from qcal.grid.spec import GridSpec
from qcal.methods import METHODS
from qcal.schema import COMMAND_SCHEMAS, INTERNAL, GridKeys

pytestmark = pytest.mark.unit


def test_every_subcommand_has_a_schema() -> None:
    assert sorted(subcommands(build_parser())) == sorted(COMMAND_SCHEMAS)


def test_every_argparse_option_has_a_schema_field() -> None:
    missing = []
    for name, parser in subcommands(build_parser()).items():
        fields = set(COMMAND_SCHEMAS[name].model_fields)
        missing += [f"qcal {name} {a.option_strings or a.dest}" for a in option_actions(parser)
                    if a.dest not in fields]
    assert not missing, f"options without a schema rule (add a field to qcal/schema): {missing}"


def test_every_schema_field_is_an_option() -> None:
    extra = []
    for name, parser in subcommands(build_parser()).items():
        dests = {a.dest for a in option_actions(parser)} | INTERNAL
        extra += [f"{name}.{f}" for f in COMMAND_SCHEMAS[name].model_fields if f not in dests]
    assert not extra, f"schema fields with no option: {extra}"


def test_every_grid_field_has_a_schema_key() -> None:
    grid = {f.name for f in dataclasses.fields(GridSpec)}
    assert grid == set(GridKeys.model_fields), grid ^ set(GridKeys.model_fields)


def test_schema_defaults_match_the_parser() -> None:
    """A default typed twice must be the same, or `--help` would show another than is used."""
    for name, parser in subcommands(build_parser()).items():
        model = COMMAND_SCHEMAS[name]
        for action in option_actions(parser):
            info = model.model_fields[action.dest]
            if action.required or action.default is argparse.SUPPRESS or not action.option_strings:
                continue
            assert info.default == action.default, (name, action.dest)


def test_grid_defaults_match_the_dataclass() -> None:
    for f in dataclasses.fields(GridSpec):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        schema = GridKeys.model_fields[f.name].get_default(call_default_factory=True)
        assert (tuple(schema) if isinstance(schema, list) else schema) == default, f.name


def test_every_option_has_help_and_shows_its_default() -> None:
    bare = []
    for name, parser in subcommands(build_parser()).items():
        helptext = parser.format_help()
        for action in option_actions(parser):
            if action.help == argparse.SUPPRESS:
                continue  # a retired spelling kept so old commands still run
            if not action.help:
                bare.append(f"qcal {name} {action.dest}: no help")
                continue
            if action.default not in (None, False, []) and action.option_strings:
                rendered = parser._get_formatter()._expand_help(action)  # noqa: SLF001
                if "default" not in (action.help + rendered).lower():
                    bare.append(f"qcal {name} {action.dest}: default not shown")
        assert "usage" in helptext
    assert not bare, bare


def test_method_lists_its_choices() -> None:
    parser = subcommands(build_parser())["quantize"]
    method = next(a for a in option_actions(parser) if a.dest == "method")
    assert all(name in str(method.metavar) for name in ("rtn", "rtn-mse", "gptq", "awq"))
    assert "{" + ",".join(METHODS.names()) + "}" in parser.format_help()
