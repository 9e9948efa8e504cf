"""GPTAQ's tensor side: with the float and quantized inputs equal (or alpha 0) it is GPTQ
bit for bit; with inputs that drift it lowers the error it targets, ||W x - Q x~||, below
GPTQ's; its cross term batches as one product; and its config and flags are checked."""

from __future__ import annotations

import pytest
import torch
from cli_cases import quantize_options as _args

from qcal.config import GPTQConfig, QuantScheme
from qcal.errors import ConfigError
from qcal.methods import METHODS, method_for_config
from qcal.methods.gptaq import GPTAQConfig
from qcal.quant.gptaq import accumulate_cross, asymmetric_error
from qcal.quant.gptq import gptq_quantize
from qcal.quant.hessian import accumulate_hessian

pytestmark = pytest.mark.unit

SCHEMES = [QuantScheme(3, 64), QuantScheme(4, 32), QuantScheme(4, -1)]


def _streams(seed: int, drift: float, n: int = 1024, inf: int = 128
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(weight, float inputs, quantized-model inputs): correlated channels, as activations
    are, and a quantized stream that differs from the float one by `drift`."""
    gen = torch.Generator().manual_seed(seed)
    mix = torch.randn(inf, inf, generator=gen) / inf**0.5 + torch.eye(inf)
    x_float = torch.randn(n, inf, generator=gen) @ mix
    x_quant = x_float + drift * torch.randn(n, inf, generator=gen) @ mix
    return torch.randn(48, inf, generator=gen), x_float, x_quant


def _stats(x_float: torch.Tensor, x_quant: torch.Tensor, batch: int = 200
           ) -> tuple[torch.Tensor, torch.Tensor]:
    h = c = None
    nh = nc = 0
    for start in range(0, x_quant.shape[0], batch):
        h, nh = accumulate_hessian(x_quant[start:start + batch], h, nh)
        c, nc = accumulate_cross(x_float[start:start + batch], x_quant[start:start + batch], c, nc)
    assert nh == nc == x_quant.shape[0]
    return h, c


def _same(a, b) -> None:
    for field in ("codes", "scales", "zeros", "g_idx"):
        assert torch.equal(getattr(a, field), getattr(b, field)), field


@pytest.mark.parametrize("scheme", SCHEMES, ids=str)
@pytest.mark.parametrize("desc_act", [False, True])
def test_equal_streams_or_alpha_zero_is_gptq(scheme: QuantScheme, desc_act: bool) -> None:
    w, x_float, x_quant = _streams(0, drift=0.3)
    cfg = GPTQConfig(scheme, desc_act=desc_act)
    h, _ = _stats(x_quant, x_quant)
    gptq = gptq_quantize(w, h, cfg)
    _, same = _stats(x_quant, x_quant)
    assert torch.count_nonzero(same) == 0  # the same stream twice: no asymmetry at all
    _same(gptq_quantize(w, h, cfg, asymmetry=(same, 0.25)), gptq)
    _, cross = _stats(x_float, x_quant)
    _same(gptq_quantize(w, h, cfg, asymmetry=(cross, 0.0)), gptq)


@pytest.mark.parametrize("scheme", SCHEMES, ids=str)
@pytest.mark.parametrize("desc_act", [False, True])
@pytest.mark.parametrize("seed", [1, 2])
def test_drifted_inputs_lower_the_asymmetric_error(scheme: QuantScheme, desc_act: bool,
                                                   seed: int) -> None:
    w, x_float, x_quant = _streams(seed, drift=0.3)
    cfg = GPTQConfig(scheme, desc_act=desc_act)
    h, cross = _stats(x_float, x_quant)
    gptq = asymmetric_error(w, gptq_quantize(w, h, cfg).dequantize(), x_float, x_quant)
    errors = [asymmetric_error(w, gptq_quantize(w, h, cfg, asymmetry=(cross, a)).dequantize(),
                               x_float, x_quant) for a in (0.25, 1.0)]
    assert errors[0] < gptq and errors[1] < errors[0]  # the full correction goes furthest


def test_cross_term_batches_as_one_product() -> None:
    _, x_float, x_quant = _streams(3, drift=0.5, n=300)
    _, batched = _stats(x_float, x_quant, batch=64)
    whole = 2.0 / 300 * (x_float - x_quant).T @ x_quant
    torch.testing.assert_close(batched, whole, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="same tokens"):
        accumulate_cross(x_float[:10], x_quant[:9], None, 0)


def test_config_and_flags() -> None:
    from qcal.commands.quantize import make_config
    from qcal.schema import validate_args

    method = METHODS.get("gptaq")
    assert method.config_cls is GPTAQConfig and method.needs_calibration
    assert method_for_config(GPTAQConfig()) is method
    assert method_for_config(GPTQConfig()) is METHODS.get("gptq")  # exact types dispatch
    with pytest.raises(ConfigError, match="alpha"):
        GPTAQConfig(alpha=1.5)
    cfg = make_config(_args(True, "--desc-act", method="gptaq", gptaq_alpha=0.5))
    assert cfg == GPTAQConfig(QuantScheme(4, 32), alpha=0.5, desc_act=True)
    assert make_config(_args(True, "--desc-act", method="gptq")) == GPTQConfig(
        QuantScheme(4, 32), desc_act=True)
    with pytest.raises(ConfigError, match="--gptaq-alpha is a gptaq option"):
        make_config(_args(method="gptq", gptaq_alpha=0.5))
    with pytest.raises(ConfigError, match="--gptaq-alpha"):
        validate_args(_args(False, method="gptaq", gptaq_alpha=2.0))


def test_recipe_round_trip() -> None:
    from qcal.recipe import QuantRecipe
    from qcal.run_config import CalibConfig

    recipe = QuantRecipe(method=GPTAQConfig(QuantScheme(3, 64), alpha=0.5, desc_act=True),
                         calib=CalibConfig(nsamples=16), format="gptq")
    back = QuantRecipe.from_dict(recipe.to_dict())
    assert back == recipe and back.method_name == "gptaq"
