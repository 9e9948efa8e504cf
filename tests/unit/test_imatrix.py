"""Importance-weighted clipping as pure functions: uniform importances are the unweighted
search bit for bit, real ones never lose on the weighted objective, and GPTQ's
--imatrix-clip weights its group search by diag H."""

from __future__ import annotations

import pytest
import torch

from qcal.config import GPTQConfig, QuantScheme
from qcal.errors import ConfigError
from qcal.methods.rtn_mse import RTNMSEConfig, mse_clip_quantize
from qcal.quant.gptq import gptq_quantize
from qcal.quant.hessian import accumulate_hessian

pytestmark = pytest.mark.unit


def _weight(out: int = 24, inp: int = 96, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(out, inp, generator=gen)
    w[:, ::7] *= 6  # outlier columns make clipping worth searching
    return w


def _weighted_error(w: torch.Tensor, result, importance: torch.Tensor, p: float) -> torch.Tensor:
    err = (result.dequantize() - w).abs().pow(p) * importance
    g = result.scheme.effective_group(w.shape[1])
    return err.reshape(w.shape[0], -1, g).sum(dim=-1)  # per row and group


@pytest.mark.parametrize("group", [32, -1])
def test_uniform_importance_is_the_unweighted_search(group: int) -> None:
    w = _weight()
    cfg = RTNMSEConfig(QuantScheme(4, group), mse_grid=20)
    plain = mse_clip_quantize(w, cfg)
    uniform = mse_clip_quantize(w, cfg, importance=torch.ones(w.shape[1]))
    assert torch.equal(plain.codes, uniform.codes) and torch.equal(plain.scales, uniform.scales)


@pytest.mark.parametrize("bits", [3, 4])
def test_weighted_search_never_loses_on_its_own_objective(bits: int) -> None:
    """Per group it is the argmin over the same candidates, so no group can do worse on the
    weighted error than the unweighted choice, and with skewed importances some do better."""
    w = _weight(seed=1)
    gen = torch.Generator().manual_seed(2)
    importance = torch.rand(w.shape[1], generator=gen).pow(4) * 50
    cfg = RTNMSEConfig(QuantScheme(bits, 32), mse_grid=40, mse_norm=2.0)
    weighted = mse_clip_quantize(w, cfg, importance=importance)
    plain = mse_clip_quantize(w, cfg)
    ours, theirs = (_weighted_error(w, r, importance, 2.0) for r in (weighted, plain))
    assert bool((ours <= theirs * (1 + 1e-6)).all())
    assert float(ours.sum()) < float(theirs.sum())


def test_importances_of_the_wrong_width_are_refused() -> None:
    with pytest.raises(ConfigError, match="must come from its inputs"):
        mse_clip_quantize(_weight(), RTNMSEConfig(QuantScheme(4, 32)), "x",
                          importance=torch.ones(95))


def test_gptq_imatrix_clip_on_a_flat_diagonal_is_the_mse_clip() -> None:
    """diag H all equal: every column weighs the same, so the weighted search picks what the
    unweighted one does; on a skewed diagonal it picks differently."""
    w = _weight(16, 64, seed=3)
    scheme = QuantScheme(3, 32)
    flat = torch.eye(64) * 2.0
    mse = gptq_quantize(w, flat, GPTQConfig(scheme, mse_clip=True, mse_grid=20))
    imatrix = gptq_quantize(w, flat, GPTQConfig(scheme, imatrix_clip=True, mse_grid=20))
    assert torch.equal(mse.codes, imatrix.codes) and torch.equal(mse.scales, imatrix.scales)
    x = torch.randn(512, 64, generator=torch.Generator().manual_seed(4))
    x = x * torch.linspace(0.05, 8.0, 64)
    h = accumulate_hessian(x, None, 0)[0]
    for desc_act in (False, True):
        a = gptq_quantize(w, h, GPTQConfig(scheme, mse_clip=True, mse_grid=20, desc_act=desc_act))
        b = gptq_quantize(w, h, GPTQConfig(scheme, imatrix_clip=True, mse_grid=20,
                                           desc_act=desc_act))
        assert not torch.equal(a.scales, b.scales)
        assert b.loss is not None and a.loss is not None


def test_the_new_gptq_field_leaves_existing_cache_keys_alone() -> None:
    """imatrix_clip joined GPTQConfig after keys were written: unset, it is not in the key."""
    from qcal.cache import _canonical

    assert "imatrix_clip" not in _canonical(GPTQConfig(QuantScheme(4, 128)))
    assert _canonical(GPTQConfig(QuantScheme(4, 128), imatrix_clip=True))["imatrix_clip"] is True


def test_the_imatrix_config_is_rtn_mses_with_its_checks_and_its_own_method() -> None:
    """It extends RTN-MSE's config (fields, defaults, checks at construction), yet
    dispatches to its own method and is refused where RTN-MSE's is wanted."""
    from qcal.methods import method_for_config
    from qcal.methods.rtn_imatrix import RTNImatrixConfig

    with pytest.raises(ConfigError, match="mse_grid"):
        RTNImatrixConfig(mse_grid=0)
    assert method_for_config(RTNImatrixConfig()).name == "rtn-imatrix"
    assert method_for_config(RTNMSEConfig()).name == "rtn-mse"
    assert RTNImatrixConfig() != RTNMSEConfig()
