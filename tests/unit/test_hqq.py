"""HQQ: no group ends worse than RTN on the error it is scored by (mean |w - q|), the
solver does lower it and the squared error, zero iterations is RTN bit for bit, a ragged
group's padding stays out of the fit, and its flags reach its config through the registry."""

from __future__ import annotations

import pytest
import torch
from cli_cases import quantize_options as _args

from qcal.config import QuantScheme
from qcal.errors import ConfigError
from qcal.methods import METHODS, method_for_config
from qcal.methods.hqq import HQQConfig, hqq_quantize, shrink_lp
from qcal.quant.base import rtn_quantize

pytestmark = pytest.mark.unit

SCHEMES = [QuantScheme(4, 32), QuantScheme(3, 128), QuantScheme(4, -1), QuantScheme(2, 64),
           QuantScheme(4, 48, allow_ragged=True)]


def _weight(seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(32, 256, generator=gen)
    return w + (torch.rand(32, 256, generator=gen) < 0.01) * torch.randn(32, 256, generator=gen) * 8


def _group_l1(w: torch.Tensor, result, group: int) -> torch.Tensor:
    err = (result.dequantize() - w).abs()
    pad = (-w.shape[1]) % group
    return torch.nn.functional.pad(err, (0, pad)).reshape(w.shape[0], -1, group).sum(-1)


@pytest.mark.parametrize("scheme", SCHEMES, ids=str)
@pytest.mark.parametrize("seed", [0, 1])
def test_no_group_is_worse_than_rtn_and_the_whole_is_better(scheme: QuantScheme,
                                                            seed: int) -> None:
    w = _weight(seed)
    group = scheme.effective_group(w.shape[1])
    rtn, hqq = rtn_quantize(w, scheme), hqq_quantize(w, HQQConfig(scheme))
    hqq.validate(*w.shape)
    assert bool((_group_l1(w, hqq, group) <= _group_l1(w, rtn, group) * (1 + 1e-6)).all())
    assert float(_group_l1(w, hqq, group).sum()) < 0.99 * float(_group_l1(w, rtn, group).sum())
    # Squared error is not what HQQ minimises, but on these weights it falls too.
    assert hqq.loss < float((rtn.dequantize() - w).pow(2).sum())
    assert hqq.loss == pytest.approx(float((hqq.dequantize() - w).pow(2).sum()), rel=1e-6)


@pytest.mark.parametrize("scheme", SCHEMES, ids=str)
def test_zero_iterations_is_rtn(scheme: QuantScheme) -> None:
    w = _weight(3)
    rtn, hqq = rtn_quantize(w, scheme), hqq_quantize(w, HQQConfig(scheme, iters=0))
    for field in ("codes", "scales", "zeros", "g_idx"):
        assert torch.equal(getattr(hqq, field), getattr(rtn, field)), field


def test_padding_of_a_ragged_group_does_not_move_its_grid() -> None:
    """The last 16-wide group of a 48-column weight at group 32 is padded to 32: its grid must
    be the one HQQ finds for those 16 columns alone (at group 16, one group per row)."""
    w = _weight(4)[:, :48]
    ragged = hqq_quantize(w, HQQConfig(QuantScheme(4, 32, allow_ragged=True)))
    alone = hqq_quantize(w[:, 32:].contiguous(), HQQConfig(QuantScheme(4, 16)))
    torch.testing.assert_close(ragged.scales[1], alone.scales[0])
    assert torch.equal(ragged.zeros[1], alone.zeros[0])


def test_shrink_is_the_lp_soft_threshold() -> None:
    x = torch.tensor([-3.0, -0.05, 0.0, 0.05, 3.0])
    torch.testing.assert_close(shrink_lp(x, 10.0, 1.0), torch.tensor([-2.9, 0.0, 0.0, 0.0, 2.9]))
    out = shrink_lp(x, 10.0, 0.7)
    assert out[2] == 0 and bool((out.abs() <= x.abs()).all()) and out[0] == -out[4]
    assert float(out[4]) == pytest.approx(3.0 - 3.0 ** -0.3 / 10, rel=1e-5)


@pytest.mark.parametrize("fields", [{"lp_norm": 0.0}, {"lp_norm": 1.5}, {"beta": 0.0},
                                    {"kappa": 0.9}, {"beta": float("inf")},
                                    {"lp_norm": float("nan")}, {"iters": -1}, {"iters": 2.5},
                                    {"scheme": QuantScheme(4, 32, sym=True)}])
def test_bad_settings_are_refused(fields: dict) -> None:
    with pytest.raises(ConfigError):
        HQQConfig(**fields)


def test_registered_from_its_own_file() -> None:
    method = METHODS.get("hqq")
    assert method.config_cls is HQQConfig and not method.needs_calibration
    assert method_for_config(HQQConfig()) is method
    assert {f.dest for f in method.flags} == {"hqq_lp_norm", "hqq_iters"}


def test_flags_reach_the_config_and_the_schema_checks_them() -> None:
    from qcal.commands.quantize import make_config
    from qcal.schema import validate_args

    cfg = make_config(_args(method="hqq", hqq_iters=5, hqq_lp_norm=1.0))
    assert cfg == HQQConfig(QuantScheme(4, 32), iters=5, lp_norm=1.0)
    with pytest.raises(ConfigError, match="--hqq-iters is a hqq option"):
        make_config(_args(method="rtn", hqq_iters=5))
    with pytest.raises(ConfigError, match="--hqq-lp-norm"):
        validate_args(_args(False, method="hqq", hqq_lp_norm=2.0))
    with pytest.raises(ConfigError, match="--hqq-iters"):
        validate_args(_args(False, method="hqq", hqq_iters=10**6))
    with pytest.raises(ConfigError, match="drop --sym"):
        validate_args(_args(False, "--sym", method="hqq"))
    for other in ("rtn", "gptq", "rtn-mse"):  # the rule is HQQ's alone
        validate_args(_args(False, "--sym", method=other))


def test_recipe_round_trip() -> None:
    from qcal.recipe import QuantRecipe

    recipe = QuantRecipe(method=HQQConfig(QuantScheme(3, 64), iters=7), calib=None,
                         format="compressed-tensors")
    back = QuantRecipe.from_dict(recipe.to_dict())
    assert back == recipe and back.method_name == "hqq" and not back.uses_calibration()
