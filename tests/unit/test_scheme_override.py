"""Per-module schemes: parsing --scheme-override, first-match resolution, and refusing up
front a width the checkpoint format cannot store."""

from __future__ import annotations

import pytest

from qcal.config import QuantScheme, SchemeOverride, check_overrides, parse_scheme_override, scheme_for
from qcal.errors import ConfigError

pytestmark = pytest.mark.unit
BASE = QuantScheme(4, 64)


def test_parse_forms() -> None:
    assert parse_scheme_override(r".*\.down_proj=bits:8,group:128") == SchemeOverride(
        r".*\.down_proj", bits=8, group_size=128)
    assert parse_scheme_override("model.layers.0.=bits:2,sym:true") == SchemeOverride(
        "model.layers.0.", bits=2, sym=True)
    assert parse_scheme_override("lm_head=skip").skip
    for bad, why in [("bits:8", "write REGEX="), ("x=bits:eight", "whole number"),
                     ("x=width:8", "not one of"), ("x=sym:maybe", "true or false"),
                     ("[=bits:8", "not a regular expression")]:
        with pytest.raises(ConfigError, match=why):
            parse_scheme_override(bad)


def test_first_match_wins_and_skip_keeps_float() -> None:
    overrides = (parse_scheme_override(r".*\.0\.mlp\.down_proj=bits:8"),
                 parse_scheme_override(r".*down_proj=bits:2,group:32"),
                 parse_scheme_override(r".*\.1\.self_attn\.q_proj=skip"))
    assert scheme_for("model.layers.0.mlp.down_proj", BASE, overrides) == QuantScheme(8, 64)
    assert scheme_for("model.layers.1.mlp.down_proj", BASE, overrides) == QuantScheme(2, 32)
    assert scheme_for("model.layers.1.self_attn.q_proj", BASE, overrides) is None
    assert scheme_for("model.layers.1.self_attn.k_proj", BASE, overrides) == BASE
    with pytest.raises(ConfigError, match="bits=5 is not supported"):
        scheme_for("x", BASE, (parse_scheme_override("x=bits:5"),))


def test_widths_a_format_cannot_store_are_refused() -> None:
    three = (parse_scheme_override("x=bits:3"),)
    check_overrides(BASE, (parse_scheme_override("x=bits:8"), parse_scheme_override("y=bits:2")),
                    "compressed-tensors")
    for fmt in ("compressed-tensors", "gptq", "gptq_v2"):
        with pytest.raises(ConfigError, match=f"--format {fmt} stores 2 or 4 or 8-bit weights, "
                                              "not 3-bit"):
            check_overrides(BASE, three, fmt)
    with pytest.raises(ConfigError, match="--format awq stores 4-bit weights, not 8-bit"):
        check_overrides(BASE, (parse_scheme_override("x=bits:8"),), "awq")
