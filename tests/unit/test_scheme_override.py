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
    for fmt in ("compressed-tensors", "gptq", "gptq_v2"):
        check_overrides(BASE, (*three, parse_scheme_override("y=bits:8"),
                               parse_scheme_override("z=bits:2")), fmt)
    with pytest.raises(ConfigError, match="--format awq stores 4-bit weights, not 3-bit"):
        check_overrides(BASE, three, "awq")
    with pytest.raises(ConfigError, match="--format awq stores 4-bit weights, not 8-bit"):
        check_overrides(BASE, (parse_scheme_override("x=bits:8"),), "awq")


def test_selection_carries_overrides_through_json_and_skips() -> None:
    from qcal.config import ModuleSelection, from_dict, to_dict

    sel = ModuleSelection(ignore=("lm_head",), schemes=(parse_scheme_override(r".*\.0\.q_proj=skip"),
                                                        parse_scheme_override(r".*q_proj=bits:8")))
    assert from_dict(ModuleSelection, to_dict(sel)) == sel
    assert not sel.selects("model.layers.0.q_proj") and sel.selects("model.layers.1.q_proj")
    assert sel.scheme_of("model.layers.1.q_proj", BASE) == QuantScheme(8, 64)
    assert sel.scheme_of("model.layers.1.k_proj", BASE) == BASE
    assert [o.spec() for o in sel.schemes] == [r".*\.0\.q_proj=skip", ".*q_proj=bits:8"]


def test_awq_scale_search_scores_each_linear_at_its_scheme() -> None:
    import torch

    from qcal.quant import awq

    torch.manual_seed(0)
    weights = {"a": torch.randn(8, 64), "b": torch.randn(8, 64)}
    schemes = {"a": QuantScheme(8, 32), "b": QuantScheme(2, 64)}
    seen = []
    awq.search_scale(torch.rand(64) + 0.1, weights, lambda fake: seen.append(fake) or 0.0,
                     schemes, grid_points=1)
    for name, w in weights.items():  # ratio 0: s = 1, plain fake quantization
        assert torch.equal(seen[0][name], awq.fake_quant(w, schemes[name]))
    assert not torch.equal(seen[0]["b"], awq.fake_quant(weights["b"], BASE))


def test_grid_key_reaches_the_recipe() -> None:
    from qcal.grid.spec import Cell, grid_from_dict

    spec = grid_from_dict({"methods": ["rtn"], "group_size": 64,
                           "scheme_overrides": [r".*down_proj=bits:8"]})
    recipe = spec.recipe(Cell(None, "rtn"), "out")
    assert recipe.modules.schemes == (parse_scheme_override(r".*down_proj=bits:8"),)
    assert "modules" in recipe.to_dict()
    with pytest.raises(ConfigError, match="whole number"):
        grid_from_dict({"methods": ["rtn"], "scheme_overrides": ["x=bits:many"]})


def test_overrides_join_the_recipe_key_only_when_given(tmp_path) -> None:
    from qcal.config import ModuleSelection, RTNConfig
    from qcal.recipe import QuantRecipe

    plain = QuantRecipe(method=RTNConfig(), calib=None)
    mixed = QuantRecipe(method=RTNConfig(), calib=None, modules=ModuleSelection(
        schemes=(parse_scheme_override(r".*down_proj=bits:8"),)))
    assert "modules" not in plain.to_dict() and "modules" in mixed.to_dict()
    assert QuantRecipe.from_dict(mixed.to_dict()) == mixed
    assert plain.checkpoint_key(tmp_path) != mixed.checkpoint_key(tmp_path)
    with pytest.raises(ConfigError, match="--format awq .* holds one scheme"):
        QuantRecipe(method=RTNConfig(), calib=None, format="awq", modules=mixed.modules)


def test_overrides_are_checked_against_the_linears_shapes() -> None:
    from qcal.config import ModuleSelection
    from qcal.schemes import check_against_model

    shapes = {"model.layers.0.mlp.down_proj": (1536, 576), "model.layers.0.self_attn.k_proj": (80, 48)}

    def check(*specs: str, targets: tuple[str, ...] = ()) -> None:
        check_against_model(shapes, ModuleSelection(targets, schemes=tuple(
            map(parse_scheme_override, specs))), BASE)

    check(r".*down_proj=bits:3,group:32", r".*k_proj=bits:8")
    with pytest.raises(ConfigError, match="48x80, but 3-bit codes fill int32 words only for "
                                          "sizes divisible by 32"):
        check(r".*k_proj=bits:3")
    with pytest.raises(ConfigError, match="group 100 does not divide in_features=1536"):
        check(r".*down_proj=group:100")
    with pytest.raises(ConfigError, match="matches no quantized linear"):
        check(r"down_proj=bits:8")  # re.match: from the start of the full name
    with pytest.raises(ConfigError, match="matches no quantized linear"):
        check(r".*down_proj=bits:8", targets=("self_attn",))  # --targets left it float


def test_a_lone_pattern_string_is_one_pattern_on_every_route() -> None:
    """Issue 52: targets="q_proj" (the API, or a recipe's YAML/JSON) was iterated as its
    characters and matched every linear; a non-string pattern is refused in one line."""
    from qcal.config import ModuleSelection, from_dict

    sel = ModuleSelection(targets="q_proj", ignore=["layers\\.0\\."])
    assert sel.targets == ("q_proj",) and sel.ignore == ("layers\\.0\\.",)
    assert sel.selects("model.layers.1.self_attn.q_proj")
    assert not sel.selects("model.layers.1.mlp.down_proj")
    assert from_dict(ModuleSelection, {"targets": "q_proj"}).targets == ("q_proj",)
    with pytest.raises(ConfigError, match="takes regexes as strings"):
        ModuleSelection(ignore=(3,))
