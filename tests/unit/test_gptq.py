"""GPTQ as pure tensor functions: never worse than RTN, RTN on a diagonal Hessian,
exact act-order permutations, dead channels, damping and its errors."""

from __future__ import annotations

import pytest
import torch

from qcal.config import GPTQConfig, QuantScheme
from qcal.errors import NumericalError
from qcal.packing.qlinear import QuantLinear
from qcal.quant import intgrid as grid
from qcal.quant.base import rtn_quantize
from qcal.quant.gptq import act_order_perm, gptq_quantize, group_params
from qcal.quant.hessian import accumulate_hessian, hessian_loss, inverse_cholesky

pytestmark = pytest.mark.unit


def _inputs(n: int, k: int, correlated: bool, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, k, generator=gen)
    if correlated:
        # Low-rank mixing plus per-channel scales, like real activations (outlier channels).
        mix = torch.randn(k // 4, k, generator=gen)
        x = torch.randn(n, k // 4, generator=gen) @ mix + 0.05 * x
        x = x * (0.2 + 4 * torch.rand(k, generator=gen))
    return x


def _hessian(x: torch.Tensor) -> torch.Tensor:
    return accumulate_hessian(x, None, 0)[0]


def _rtn_fp16(w: torch.Tensor, scheme: QuantScheme) -> torch.Tensor:
    """RTN codes on the grid GPTQ stores (fp16-rounded scales)."""
    scales, zeros = grid.grouped_params(w, scheme)
    scales = scales.to(torch.float16).float()
    return grid.quantize_grouped(w, scales, zeros, grid.group_index(w.shape[1],
                                 scheme.effective_group(w.shape[1])), scheme.maxq)


SHAPES = [(32, 64, 48), (64, 128, 1024), (48, 200, 300), (96, 256, 4096)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("correlated", [False, True])
@pytest.mark.parametrize("seed", [0, 1])
def test_gptq_loss_never_exceeds_rtn(shape: tuple[int, int, int], correlated: bool,
                                     seed: int) -> None:
    out_f, in_f, n = shape
    x = _inputs(n, in_f, correlated, seed)
    h = _hessian(x)
    w = torch.randn(out_f, in_f, generator=torch.Generator().manual_seed(seed + 100))
    for bits, group, sym, act in [(4, 32, False, False), (4, -1, True, True), (3, 64, False, True),
                                  (2, 32, True, False), (8, -1, False, False), (4, 64, True, True)]:
        scheme = QuantScheme(bits, group, sym, allow_ragged=True)
        result = gptq_quantize(w, h, GPTQConfig(scheme, desc_act=act))
        rtn = hessian_loss(w, rtn_quantize(w, scheme).dequantize(), h)
        assert result.loss is not None and result.loss <= rtn, (bits, group, sym, act)
        # The loss is the real output error of the returned weights on the calibration set.
        direct = float(((x @ (w - result.dequantize()).T) ** 2).sum(1).mean())
        assert result.loss == pytest.approx(direct, rel=1e-3)
        result.validate(out_f, in_f)


@pytest.mark.parametrize("group", [-1, 32, 64])
@pytest.mark.parametrize("sym", [False, True])
def test_diagonal_hessian_reduces_to_rtn(group: int, sym: bool) -> None:
    """No off-diagonal terms: no error feedback, so every code is the RTN code."""
    torch.manual_seed(0)
    w = torch.randn(24, 160)
    h = torch.diag(torch.rand(160) + 0.1)
    scheme = QuantScheme(4, group, sym, allow_ragged=True)
    result = gptq_quantize(w, h, GPTQConfig(scheme))
    assert torch.equal(result.codes, _rtn_fp16(w, scheme))
    # Per channel, act-order only reorders columns: the codes must still be RTN's.
    if group == -1:
        ordered = gptq_quantize(w, h, GPTQConfig(scheme, desc_act=True))
        assert torch.equal(ordered.codes, result.codes)


def test_hand_checked_two_bit_row() -> None:
    """w = [-1, 0, 0.6, 2], 2 bits asym per channel: scale 1, zero 1, codes [0, 1, 2, 3];
    only 0.6 -> 1 errs (by 0.4), so the loss is H_33 * 0.4^2 / 2 = 3 * 0.16 / 2."""
    w = torch.tensor([[-1.0, 0.0, 0.6, 2.0]])
    h = torch.diag(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    result = gptq_quantize(w, h, GPTQConfig(QuantScheme(2, -1, False)))
    assert result.codes.tolist() == [[0, 1, 2, 3]]
    assert result.scales.tolist() == [[1.0]] and result.zeros.tolist() == [[1]]
    assert result.dequantize().tolist() == [[-1.0, 0.0, 1.0, 2.0]]
    assert result.loss == pytest.approx(0.24)


def test_error_feedback_matches_hand_computed_update() -> None:
    """Two correlated columns, fixed grid: the first column's error e moves the second by
    e * H_12 / H_22 before it is rounded (the OBS update)."""
    h = torch.eye(4)
    h[0, 1] = h[1, 0] = 0.9
    cfg = GPTQConfig(QuantScheme(2, -1, True), damp_percent=1e-6)
    # 2-bit sym grid of [-3, 3]: scale 2, zero 2, values {-4, -2, 0, 2}.
    # col 0: 0.9 -> 0 (e = 0.9); col 1: 0.4 + 0.9 * 0.9 = 1.21 -> 2, where RTN gives 0.
    w = torch.tensor([[0.9, 0.4, -3.0, 3.0]])
    result = gptq_quantize(w, h, cfg)
    assert result.dequantize()[0, :2].tolist() == [0.0, 2.0]
    assert rtn_quantize(w, cfg.scheme).dequantize()[0, :2].tolist() == [0.0, 0.0]


def test_act_order_permutation_round_trip_is_exact() -> None:
    """Permuting the input channels of (W, H) permutes the result exactly: the visiting
    order depends only on diag(H), and codes/g_idx come back in the caller's order."""
    torch.manual_seed(3)
    x = _inputs(512, 96, True, 3)
    h = _hessian(x)
    w = torch.randn(40, 96)
    cfg = GPTQConfig(QuantScheme(4, 32, False), desc_act=True)
    base = gptq_quantize(w, h, cfg)
    perm = torch.randperm(96)
    moved = gptq_quantize(w[:, perm], h[perm][:, perm], cfg)
    assert torch.equal(moved.codes, base.codes[:, perm])
    assert torch.equal(moved.g_idx, base.g_idx[perm])
    assert torch.equal(moved.dequantize(), base.dequantize()[:, perm])
    # Groups are formed in act-order: the k-th most important 32 channels share group k.
    order = act_order_perm(h)
    assert torch.equal(base.g_idx[order], torch.arange(96, dtype=torch.int32) // 32)
    # Packing keeps the original column order; g_idx alone maps channels to groups.
    packed = QuantLinear.from_result(base, None)
    assert torch.equal(packed.dequantized_weight(), base.dequantize())


def test_static_groups_keep_contiguous_groups_under_act_order() -> None:
    torch.manual_seed(4)
    h = _hessian(_inputs(400, 128, True, 4))
    w = torch.randn(16, 128)
    scheme = QuantScheme(4, 32, True)
    result = gptq_quantize(w, h, GPTQConfig(scheme, desc_act=True, static_groups=True))
    assert torch.equal(result.g_idx, torch.arange(128, dtype=torch.int32) // 32)
    scales, _ = grid.grouped_params(w, scheme)
    assert torch.equal(result.scales, scales.to(torch.float16).float())
    assert result.loss <= hessian_loss(w, rtn_quantize(w, scheme).dequantize(), h)


def test_dead_input_channels_quantize_to_zero() -> None:
    torch.manual_seed(5)
    x = torch.randn(256, 64)
    x[:, [3, 40]] = 0.0
    h = _hessian(x)
    w = torch.randn(8, 64)
    result = gptq_quantize(w, h, GPTQConfig(QuantScheme(4, 32, False), desc_act=True))
    deq = result.dequantize()
    assert torch.isfinite(deq).all()
    assert torch.equal(deq[:, [3, 40]], torch.zeros(8, 2))


def test_mse_clip_never_worse_than_min_max_on_its_objective() -> None:
    torch.manual_seed(6)
    w = torch.randn(32, 64) * torch.linspace(0.1, 3, 64)
    w[:, 0] = 12.0  # an outlier makes min/max wasteful
    scheme = QuantScheme(3, -1, False)
    for cfg in (GPTQConfig(scheme), GPTQConfig(scheme, mse_clip=True)):
        s, z = group_params(w, scheme, cfg)
        err = (grid.fake_quantize(w, s[:, None], z[:, None], scheme.maxq) - w).abs().pow(2.4).sum()
        if not cfg.mse_clip:
            plain = err
    assert err <= plain
    h = _hessian(_inputs(256, 64, False, 6))
    clipped = gptq_quantize(w, h, GPTQConfig(scheme, mse_clip=True))
    assert clipped.loss <= hessian_loss(w, rtn_quantize(w, scheme).dequantize(), h)


def test_hessian_running_mean_equals_full_batch() -> None:
    torch.manual_seed(7)
    x = torch.randn(3, 50, 24)  # [batch, seq, features]
    h, n = None, 0
    for chunk in (x[:1], x[1:3, :20], x[1:3, 20:]):
        h, n = accumulate_hessian(chunk, h, n)
    flat = x.reshape(-1, 24)
    assert n == 150
    torch.testing.assert_close(h, 2 * flat.T @ flat / 150, rtol=1e-5, atol=1e-5)


def test_damping_grows_until_cholesky_succeeds() -> None:
    torch.manual_seed(8)
    q, _ = torch.linalg.qr(torch.randn(16, 16))
    eig = torch.ones(16)
    eig[0] = -0.05  # slightly indefinite: 1% damping is not enough, 10% is
    h = q @ torch.diag(eig) @ q.T
    upper, damp = inverse_cholesky(h, 0.01)
    assert damp == pytest.approx(0.1)
    assert torch.isfinite(upper).all()
    with pytest.warns(UserWarning, match=r"mlp\.up_proj: the Hessian needed damp_percent=0\.1"):
        result = gptq_quantize(torch.randn(4, 16), h, GPTQConfig(QuantScheme(4, -1)),
                               name="mlp.up_proj")
    assert torch.isfinite(result.dequantize()).all()


def test_non_positive_definite_hessian_names_layer_and_fix() -> None:
    # Unit diagonal, off-diagonal 3: eigenvalue 1 - 3 = -2 needs a damp of 2x the mean
    # diagonal, past the largest automatic damp (1x).
    h = torch.full((8, 8), 3.0)
    h.diagonal().fill_(1.0)
    with pytest.raises(NumericalError, match=r"model\.layers\.3\.mlp\.down_proj.*--nsamples") as err:
        gptq_quantize(torch.randn(4, 8), h, GPTQConfig(QuantScheme(4, -1)),
                      name="model.layers.3.mlp.down_proj")
    # The damp already grew to its ceiling (1.0): a larger --damp is no fix, so none is offered.
    assert "damp_percent=1;" in str(err.value) and "--damp" not in str(err.value)


def test_damp_hint_offered_below_the_ceiling() -> None:
    from qcal.quant.hessian import inverse_cholesky

    h = torch.full((8, 8), 3.0)
    h.diagonal().fill_(1.0)
    with pytest.raises(NumericalError, match=r"larger --damp \(up to 1\)"):
        inverse_cholesky(h, 0.5, "x")


def test_negative_hessian_diagonal_is_reported_as_such() -> None:
    from qcal.quant.hessian import inverse_cholesky

    h = torch.eye(4)
    h[2, 2] = -0.5
    with pytest.raises(NumericalError, match=r"negative diagonal entry \(-0.5 at input 2\)"):
        inverse_cholesky(h, 0.01, "x")


def test_nan_activations_are_a_clear_error() -> None:
    x = torch.randn(32, 8)
    x[5, 2] = float("nan")
    h = _hessian(x)
    with pytest.raises(NumericalError, match=r"self_attn\.q_proj.*NaN.*calibration data"):
        gptq_quantize(torch.randn(4, 8), h, GPTQConfig(QuantScheme(4, -1)),
                      name="model.layers.0.self_attn.q_proj")


def _textbook_columns(w: torch.Tensor, upper: torch.Tensor, cfg: GPTQConfig) -> torch.Tensor:
    """The GPTQ reference's loop, row-major and unblocked inside a block: codes [out, in]."""
    scheme, g = cfg.scheme, cfg.scheme.effective_group(w.shape[1])
    w = w.clone()
    codes = torch.empty_like(w, dtype=torch.int32)
    for i1 in range(0, w.shape[1], cfg.block_size):
        i2 = min(i1 + cfg.block_size, w.shape[1])
        w1, err1, u1 = w[:, i1:i2].clone(), torch.zeros(w.shape[0], i2 - i1), upper[i1:i2, i1:i2]
        for i in range(i2 - i1):
            if (i1 + i) % g == 0:
                seg = torch.cat([w1[:, i:i + g], w[:, i2:i1 + i + g]], dim=1)
                scale, zero = group_params(seg, scheme, cfg)
            q = grid.quantize(w1[:, i], scale, zero, scheme.maxq)
            codes[:, i1 + i] = q
            err = (w1[:, i] - grid.dequantize(q, scale, zero)) / u1[i, i]
            w1[:, i:] -= torch.outer(err, u1[i, i:])
            err1[:, i] = err
        w[:, i2:] -= err1 @ upper[i1:i2, i2:]
    return codes


@pytest.mark.parametrize("group", [32, 128])
def test_column_loop_is_bit_identical_to_the_textbook_loop(group: int) -> None:
    """The loop keeps each block transposed for speed; its arithmetic must stay the
    reference's, bit for bit (checkpoints of the default models depend on it)."""
    x = _inputs(512, 256, correlated=True, seed=3)
    h = _hessian(x)
    w = torch.randn(96, 256, generator=torch.Generator().manual_seed(4))
    cfg = GPTQConfig(QuantScheme(4, group, False), block_size=64)
    upper, _ = inverse_cholesky(h.clone(), cfg.damp_percent)
    ours, textbook = gptq_quantize(w, h, cfg).codes, _textbook_columns(w, upper, cfg)
    # Bit for bit where the BLAS sums both layouts in one order (AMD, AVX2). With MKL on
    # AVX-512 the transposed block's product is summed in another order: one row met a
    # near-tie at group 32 and its error feedback carried the other rounding on (34 of
    # 24,576 codes, all in that row). Every other row must still be bit-identical.
    rows = (ours != textbook).any(dim=1)
    assert int(rows.sum()) <= 1, f"{int(rows.sum())} of {rows.numel()} rows differ"


@pytest.mark.parametrize("desc_act", [False, True])
@pytest.mark.parametrize("dead", [False, True])
def test_the_callers_hessian_is_left_as_it_was(desc_act: bool, dead: bool) -> None:
    """GPTQ reads H without copying it where nothing changes (it is the largest matrix of a
    layer), so it must never write into it: the caller scores the result against it."""
    x = _inputs(256, 128, correlated=True, seed=5)
    if dead:
        x[:, ::9] = 0.0
    h = _hessian(x)
    before = h.clone()
    w = torch.randn(32, 128, generator=torch.Generator().manual_seed(6))
    gptq_quantize(w, h, GPTQConfig(QuantScheme(4, 32, False), desc_act=desc_act))
    assert torch.equal(h, before)


def _textbook_inverse_cholesky(h: torch.Tensor, damp: float) -> torch.Tensor:
    damped = h.clone()
    damped.diagonal().add_(damp * float(h.diagonal().mean()))
    return torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(damped)),
                                 upper=True)


@pytest.mark.parametrize("indefinite", [False, True])
def test_in_place_inverse_cholesky_equals_the_textbook_chain(indefinite: bool) -> None:
    """The factor, inverse and factor run in place on one matrix (issue 36: an 8B down_proj's
    H is 822 MB); the values must be the three-step chain's, bit for bit, also after a
    failed attempt left the work matrix half factorised."""
    h = _hessian(_inputs(512, 192, correlated=True, seed=7))
    want_damp = 0.01
    if indefinite:
        q, _ = torch.linalg.qr(torch.randn(192, 192, generator=torch.Generator().manual_seed(8)))
        eig = torch.ones(192)
        eig[0] = -0.05  # 1% damping fails, 10% succeeds
        h = q @ torch.diag(eig) @ q.T
        want_damp = 0.1
    before = h.clone()
    upper, damp = inverse_cholesky(h, 0.01)
    assert damp == pytest.approx(want_damp)
    assert torch.equal(upper, _textbook_inverse_cholesky(before, damp))
    assert torch.equal(h, before)  # the caller's H is read, never written
