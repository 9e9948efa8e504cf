"""RTN-MSE: the per-group clip search never scores worse than plain RTN on its own objective,
a one-point grid is RTN bit for bit, and the method's flags reach its config through the
registry (the only place the method is declared)."""

from __future__ import annotations

import pytest
import torch
from cli_cases import quantize_options as _args

from qcal.config import QuantScheme
from qcal.errors import ConfigError
from qcal.methods import METHODS, method_for_config
from qcal.methods.rtn_mse import RTNMSEConfig, mse_clip_quantize
from qcal.quant.base import rtn_quantize

pytestmark = pytest.mark.unit

SCHEMES = [QuantScheme(4, 32), QuantScheme(4, 32, sym=True), QuantScheme(3, 80),
           QuantScheme(4, 48, allow_ragged=True), QuantScheme(2, -1, sym=True)]


def _weight(seed: int, outliers: bool = True) -> torch.Tensor:
    """Gaussian rows with a few large entries: what makes clipping worth searching for."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(24, 160, generator=gen)
    if outliers:
        w += (torch.rand(24, 160, generator=gen) < 0.01) * torch.randn(24, 160, generator=gen) * 8
    return w


def _group_error(w: torch.Tensor, result, group: int, norm: float) -> torch.Tensor:
    """sum |w - q|^norm per (row, group) of the dequantized result."""
    err = (result.dequantize() - w).abs().pow(norm)
    pad = (-w.shape[1]) % group
    return torch.nn.functional.pad(err, (0, pad)).reshape(w.shape[0], -1, group).sum(-1)


@pytest.mark.parametrize("scheme", SCHEMES, ids=str)
@pytest.mark.parametrize("seed", [0, 1])
def test_group_mse_never_exceeds_rtn(scheme: QuantScheme, seed: int) -> None:
    w = _weight(seed)
    group = scheme.effective_group(w.shape[1])
    rtn = _group_error(w, rtn_quantize(w, scheme), group, 2.0)
    mse = _group_error(w, mse_clip_quantize(w, RTNMSEConfig(scheme, mse_norm=2.0)), group, 2.0)
    assert bool((mse <= rtn * (1 + 1e-6)).all())
    assert float(mse.sum()) < float(rtn.sum())  # and the search does find better clips


@pytest.mark.parametrize("scheme", SCHEMES[:2], ids=str)
def test_default_norm_objective_never_exceeds_rtn(scheme: QuantScheme) -> None:
    w = _weight(2)
    cfg = RTNMSEConfig(scheme)
    rtn = _group_error(w, rtn_quantize(w, scheme), 32, cfg.mse_norm)
    mse = _group_error(w, mse_clip_quantize(w, cfg), 32, cfg.mse_norm)
    assert bool((mse <= rtn * (1 + 1e-5)).all()) and float(mse.sum()) < float(rtn.sum())


@pytest.mark.parametrize("scheme", SCHEMES, ids=str)
def test_one_point_grid_is_rtn(scheme: QuantScheme) -> None:
    w = _weight(3)
    rtn = rtn_quantize(w, scheme, with_loss=True)
    one = mse_clip_quantize(w, RTNMSEConfig(scheme, mse_grid=1, mse_maxshrink=0.0))
    for field in ("codes", "scales", "zeros", "g_idx"):
        assert torch.equal(getattr(one, field), getattr(rtn, field)), field
    assert one.loss == pytest.approx(rtn.loss, rel=1e-5)


def test_result_is_an_ordinary_grid() -> None:
    w = _weight(4)
    result = mse_clip_quantize(w, RTNMSEConfig(QuantScheme(4, 32)))
    result.validate(*w.shape)
    assert result.loss == pytest.approx(float((result.dequantize() - w).pow(2).sum()))


@pytest.mark.parametrize("fields", [{"mse_grid": 0}, {"mse_grid": 2.5}, {"mse_maxshrink": 1.0},
                                    {"mse_maxshrink": -0.1}, {"mse_norm": 0.0}])
def test_bad_settings_are_refused(fields: dict) -> None:
    with pytest.raises(ConfigError):
        RTNMSEConfig(**fields)


def test_registered_from_its_own_file() -> None:
    method = METHODS.get("rtn-mse")
    assert method.config_cls is RTNMSEConfig and not method.needs_calibration
    assert method_for_config(RTNMSEConfig()) is method
    assert {f.dest for f in method.flags} == {"mse_grid", "mse_maxshrink", "mse_norm"}


def test_flags_reach_the_config_and_other_methods_refuse_them() -> None:
    from qcal.commands.quantize import make_config

    cfg = make_config(_args(method="rtn-mse", mse_grid=20, mse_norm=2.0))
    assert cfg == RTNMSEConfig(QuantScheme(4, 32), mse_grid=20, mse_norm=2.0)
    with pytest.raises(ConfigError, match="--mse-grid is a rtn-mse/rtn-imatrix option"):
        make_config(_args(method="rtn", mse_grid=20))
    with pytest.raises(ConfigError, match="--damp is a gptq/gptaq option"):
        make_config(_args(method="rtn-mse", damp=0.05))


def test_schema_checks_the_flags_ranges() -> None:
    from qcal.schema import validate_args

    with pytest.raises(ConfigError, match="--mse-maxshrink"):
        validate_args(_args(False, method="rtn-mse", mse_maxshrink=1.5))
    with pytest.raises(ConfigError, match="--mse-grid"):
        validate_args(_args(False, method="rtn-mse", mse_grid=0))
    for bad in ("inf", "nan"):  # inf would turn the search off silently
        with pytest.raises(ConfigError, match="--mse-norm"):
            validate_args(_args(False, method="rtn-mse", mse_norm=bad))
    with pytest.raises(ConfigError):
        RTNMSEConfig(mse_norm=float("inf"))


def test_recipe_round_trip() -> None:
    from qcal.recipe import QuantRecipe

    recipe = QuantRecipe(method=RTNMSEConfig(QuantScheme(4, 32, sym=True), mse_grid=50),
                         calib=None, format="gptq")
    back = QuantRecipe.from_dict(recipe.to_dict())
    assert back == recipe and back.method_name == "rtn-mse" and not back.uses_calibration()
