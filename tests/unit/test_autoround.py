"""AutoRound's SignRound: zero iterations is RTN bit for bit; training lowers a block's
output error and never ends above RTN's; offsets stay in [-0.5, 0.5] and clipping factors
in [0, 1]; a seed gives one result; config, flags and recipe go through the registry."""

from __future__ import annotations

import pytest
import torch
from cli_cases import quantize_options as _args
from torch import nn

from qcal.config import QuantScheme
from qcal.errors import ConfigError
from qcal.methods import METHODS, method_for_config
from qcal.methods.autoround import AutoRoundConfig, train_block
from qcal.model.capture import LayerInputs
from qcal.quant import intgrid as grid
from qcal.quant.autoround import signround_result, signround_weight
from qcal.quant.base import rtn_quantize

pytestmark = pytest.mark.unit
SCHEMES = [QuantScheme(4, 32), QuantScheme(3, 32, sym=True), QuantScheme(4, 64, allow_ragged=True),
           QuantScheme(2, -1)]


class Block(nn.Module):
    """A residual MLP block: what a decoder layer's training sees, at unit-test size."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.up, self.down = nn.Linear(96, 160), nn.Linear(160, 96, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(nn.functional.gelu(self.up(x)))


def _data(seed: int, windows: int = 8) -> tuple[Block, LayerInputs, list[torch.Tensor]]:
    block = Block(seed)
    gen = torch.Generator().manual_seed(seed)
    hidden = [torch.randn(4, 12, 96, generator=gen) for _ in range(windows // 4)]
    with torch.no_grad():
        targets = [block(h) for h in hidden]
    return block, LayerInputs(hidden, [{} for _ in hidden]), targets


def _block_loss(block: Block, results: dict, inputs: LayerInputs, targets: list) -> float:
    """The block's output MSE over every window with the linears at `results`' grids."""
    with torch.no_grad():
        saved = {n: getattr(block, n).weight.data.clone() for n in results}
        for n, r in results.items():
            getattr(block, n).weight.data = r.dequantize()
        out = torch.cat([block(h) for h in inputs.hidden])
        for n, w in saved.items():
            getattr(block, n).weight.data = w
    return float(nn.functional.mse_loss(out, torch.cat(targets)))


@pytest.mark.parametrize("scheme", SCHEMES, ids=str)
def test_untrained_grid_is_rtn(scheme: QuantScheme) -> None:
    w = torch.randn(24, 128)
    view = grid.group_view(w, scheme)
    v, ones = torch.zeros_like(view), torch.ones(view.shape[:2])
    learned, rtn = signround_result(w, scheme, v, ones, ones), rtn_quantize(w, scheme)
    for field in ("codes", "scales", "zeros", "g_idx"):
        assert torch.equal(getattr(learned, field), getattr(rtn, field)), field
    torch.testing.assert_close(signround_weight(w, scheme, v, ones, ones), rtn.dequantize())


def test_zero_iterations_is_rtn_through_the_trainer() -> None:
    block, inputs, targets = _data(0)
    cfg = AutoRoundConfig(QuantScheme(4, 32), iters=0)
    results, _, _, _ = train_block(block, ("up", "down"), inputs, targets, cfg,
                                   lambda _: cfg.scheme, "cpu", torch.Generator().manual_seed(0))
    for name, result in results.items():
        assert torch.equal(result.codes, rtn_quantize(getattr(block, name).weight, cfg.scheme).codes)


@pytest.mark.parametrize("scheme", SCHEMES, ids=str)
@pytest.mark.parametrize("seed", [1, 2])
def test_training_lowers_the_block_error_and_never_ends_above_rtn(scheme: QuantScheme,
                                                                  seed: int) -> None:
    block, inputs, targets = _data(seed)
    # One batch of every window: the loss that picks the best iteration is the whole one.
    cfg = AutoRoundConfig(scheme, iters=60, batch_size=8)
    rtn = {n: rtn_quantize(getattr(block, n).weight, scheme) for n in ("up", "down")}
    inputs = LayerInputs([torch.cat(inputs.hidden)], [{}])
    targets = [torch.cat(targets)]
    results, first, best, at = train_block(block, ("up", "down"), inputs, targets, cfg,
                                           lambda _: scheme, "cpu",
                                           torch.Generator().manual_seed(0))
    assert first == pytest.approx(_block_loss(block, rtn, inputs, targets), rel=1e-5)
    assert best < 0.95 * first and at > 0
    assert _block_loss(block, results, inputs, targets) == pytest.approx(best, rel=1e-4)
    for name, result in results.items():
        result.validate(*getattr(block, name).weight.shape)


def test_parameters_stay_in_their_ranges_and_a_seed_gives_one_result(
        monkeypatch: pytest.MonkeyPatch) -> None:
    block, inputs, targets = _data(3)
    cfg = AutoRoundConfig(QuantScheme(3, 32), iters=40, lr=0.05, batch_size=4)
    seen = []
    real = signround_result

    def spy(weight, scheme, v, f_min, f_max):  # type: ignore[no-untyped-def]
        assert float(v.abs().max()) <= 0.5 and float(f_min.min()) >= 0 and float(f_max.max()) <= 1
        seen.append(float(v.abs().max()))
        return real(weight, scheme, v, f_min, f_max)

    monkeypatch.setattr("qcal.methods.autoround.signround_result", spy)
    runs = [train_block(block, ("up", "down"), inputs, targets, cfg, lambda _: cfg.scheme,
                        "cpu", torch.Generator().manual_seed(s))[0] for s in (7, 7)]
    assert max(seen) > 0.2  # a large rate pushes offsets to their bound, not past it
    assert all(torch.equal(runs[0][n].codes, runs[1][n].codes) for n in runs[0])
    assert all(p.requires_grad for p in block.parameters())  # handed back as they were


def test_padded_windows_are_refused() -> None:
    block, inputs, targets = _data(4)
    masks = [{"mask": torch.arange(4).view(4, 1).float()} for _ in inputs.hidden]
    with pytest.raises(ConfigError, match="differs between windows"):
        train_block(block, ("up",), LayerInputs(inputs.hidden, masks), targets,
                    AutoRoundConfig(QuantScheme(4, 32), iters=1), lambda _: QuantScheme(4, 32),
                    "cpu", torch.Generator())


@pytest.mark.parametrize("fields", [{"iters": -1}, {"lr": 0.0}, {"minmax_lr": float("nan")},
                                    {"batch_size": 0}, {"seed": -1}])
def test_bad_settings_are_refused(fields: dict) -> None:
    with pytest.raises(ConfigError):
        AutoRoundConfig(**fields)


def test_config_flags_and_recipe() -> None:
    from qcal.commands.quantize import make_config
    from qcal.recipe import QuantRecipe
    from qcal.run_config import CalibConfig
    from qcal.schema import validate_args

    method = METHODS.get("autoround")
    assert method.config_cls is AutoRoundConfig and method.needs_calibration
    assert method_for_config(AutoRoundConfig()) is method
    assert AutoRoundConfig(iters=50).rates == (0.02, 0.02)  # the reference's 1 / iters
    cfg = make_config(_args(True, "--no-minmax", method="autoround", iters=20, autoround_batch=4))
    assert cfg == AutoRoundConfig(QuantScheme(4, 32), iters=20, batch_size=4, minmax=False)
    with pytest.raises(ConfigError, match="--iters is a autoround option"):
        make_config(_args(method="gptq", iters=20))
    with pytest.raises(ConfigError, match="--autoround-lr"):
        validate_args(_args(False, method="autoround", autoround_lr=5.0))
    with pytest.raises(ConfigError, match="drop --nproc"):
        validate_args(_args(False, method="autoround", nproc=2))
    recipe = QuantRecipe(method=AutoRoundConfig(QuantScheme(3, 64), iters=7),
                         calib=CalibConfig(nsamples=8), format="gptq")
    back = QuantRecipe.from_dict(recipe.to_dict())
    assert back == recipe and back.method_name == "autoround"
