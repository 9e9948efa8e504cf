"""The integer grid and RTN: round-trip error bounds, symmetry, ragged groups, configs."""

from __future__ import annotations

import pytest
import torch

from qcal.config import GPTQConfig, QuantScheme, from_json, to_json
from qcal.errors import ConfigError
from qcal.quant import intgrid as grid
from qcal.quant.base import rtn_quantize
from qcal.registry import Registry

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("sym", [False, True])
@pytest.mark.parametrize("group_size", [-1, 32, 128])
def test_rtn_round_trip_error_at_most_half_a_step(bits: int, sym: bool, group_size: int) -> None:
    torch.manual_seed(bits * 10 + group_size)
    w = torch.randn(64, 256) * torch.rand(64, 1) * 3
    res = rtn_quantize(w, QuantScheme(bits, group_size, sym))
    err = (res.dequantize() - w).abs()
    step = res.scales[res.g_idx.long()].T  # [out, in] scale of each element
    assert torch.all(err <= step / 2 + 1e-6), float((err - step / 2).max())
    assert int(res.codes.min()) >= 0 and int(res.codes.max()) <= 2**bits - 1


def test_symmetric_grid_is_centred_and_keeps_zero_exact() -> None:
    w = torch.tensor([[-1.0, -0.25, 0.0, 0.5, 0.9, 0.0, 0.1, -0.6]])
    res = rtn_quantize(w, QuantScheme(4, -1, sym=True))
    assert torch.all(res.zeros == 8)
    deq = res.dequantize()
    assert deq[0, 2] == 0 and deq[0, 5] == 0
    # the largest magnitude sets the step: 1.0 / 7.5
    assert res.scales[0, 0].item() == pytest.approx(2 * 1.0 / 15)


def test_all_zero_rows_stay_zero() -> None:
    w = torch.zeros(8, 64)
    res = rtn_quantize(w, QuantScheme(4, 32, sym=False))
    assert torch.count_nonzero(res.dequantize()) == 0


def test_ragged_last_group_matches_per_group_reference() -> None:
    torch.manual_seed(0)
    w = torch.randn(16, 576)
    scheme = QuantScheme(4, 128, sym=False, allow_ragged=True)
    res = rtn_quantize(w, scheme)
    assert res.scales.shape == (5, 16)
    assert res.g_idx.tolist() == [k // 128 for k in range(576)]
    last = w[:, 512:]  # the ragged 64-column group, quantized on its own
    scale, zero = grid.find_params(last, 4, False)
    expected = grid.fake_quantize(last, scale[:, None], zero[:, None], 15)
    torch.testing.assert_close(res.dequantize()[:, 512:], expected)


def test_group_that_does_not_divide_is_refused_unless_ragged_is_allowed() -> None:
    with pytest.raises(ConfigError, match=r"does not divide in_features=576 of q_proj.*32, 64"):
        QuantScheme(4, 128).groups_for(576, "q_proj")
    assert QuantScheme(4, 128, allow_ragged=True).groups_for(576, "q_proj") == 5


def test_auto_group_size_and_the_old_strict_flag() -> None:
    from qcal.config import auto_group_size, from_dict

    assert auto_group_size([576, 1536]) == 64 and auto_group_size([1024, 4096]) == 128
    assert auto_group_size([576, 100]) == -1
    assert from_dict(QuantScheme, {"bits": 4, "group_size": 128, "sym": False,
                                   "strict_groups": False}).allow_ragged is True


@pytest.mark.parametrize("kwargs", [{"bits": 5}, {"group_size": 0}, {"group_size": -3}])
def test_invalid_scheme_is_rejected(kwargs: dict) -> None:
    with pytest.raises(ConfigError):
        QuantScheme(**kwargs)


def test_group_larger_than_layer_is_rejected() -> None:
    with pytest.raises(ConfigError, match="exceeds in_features"):
        rtn_quantize(torch.randn(4, 64), QuantScheme(4, 128))


def test_config_json_round_trip() -> None:
    cfg = GPTQConfig(scheme=QuantScheme(3, 64, True), damp_percent=0.05, desc_act=True)
    assert from_json(GPTQConfig, to_json(cfg)) == cfg


def test_registry_lists_known_names_on_unknown() -> None:
    reg: Registry[int] = Registry("widget")
    reg.register("a", 1)
    reg.register("b")(2)
    assert reg.get("b") == 2 and reg.names() == ["a", "b"]
    with pytest.raises(ConfigError, match="unknown widget 'c'; known: a, b"):
        reg.get("c")
