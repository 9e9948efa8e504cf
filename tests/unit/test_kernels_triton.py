"""Triton int4 kernels under the interpreter (TRITON_INTERPRET=1) vs the torch reference, on CPU.

Interpreter mode is fixed when triton is first imported, so this process cannot switch
into it: `test_interpreter_suite` re-runs this file in a subprocess with TRITON_INTERPRET=1
and QCAL_AUTOTUNE=0, where the kernel tests below run (here they are skipped). Running
pytest with TRITON_INTERPRET=1 already set runs them directly.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch
from qcal_kernels.configs import KernelConfig
from qcal_kernels.layout import KernelUnsupportedError
from qcal_kernels.reference import int4_matmul_reference
from qcal_kernels.testing import random_packed_weight

from qcal.config import QuantScheme
from qcal.packing.qlinear import QuantLinear
from qcal.quant.base import rtn_quantize

pytestmark = pytest.mark.unit
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
in_interpreter = pytest.mark.skipif(not INTERPRET, reason="runs in test_interpreter_suite's subprocess")

# fp16 tolerance: the dequantized weight is rounded to fp16/bf16 before the dot
# (the reference keeps it in float32), and the output is rounded to x's dtype.
REL_TOL = {torch.float16: 3e-3, torch.bfloat16: 1.5e-2, torch.float32: 1e-5}


def packed_weight(k: int, n: int, group: int, act_order: bool = False, seed: int = 0):
    """Random codes/zeros/scales in the GPTQ layout; group -1 = per channel."""
    return random_packed_weight(k, n, group, act_order, seed)

def check(y: torch.Tensor, x: torch.Tensor, weight) -> None:
    ref = int4_matmul_reference(x.float(), *weight)
    assert y.dtype == x.dtype and y.shape == ref.shape
    err = float((y.float() - ref).norm() / ref.norm())
    assert err < REL_TOL[x.dtype], err


def tk():
    import qcal_kernels.int4_matmul as mod

    assert mod.is_interpreted()
    return mod


@pytest.mark.skipif(INTERPRET, reason="already interpreting: the kernel tests run directly")
def test_interpreter_suite() -> None:
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "QCAL_AUTOTUNE": "0"}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    passed = re.search(r"(\d+) passed", proc.stdout)
    assert passed and int(passed.group(1)) >= len(SHAPES) + len(BF16_SHAPES) + len(BRANCHES), proc.stdout


SHAPES = [(m, k, n, g, act) for m in (1, 4, 16) for (k, n) in ((128, 256), (256, 128))
          for g in (32, 128) for act in (False, True)]


@pytest.mark.parametrize("m, k, n, group, act", SHAPES if INTERPRET else [])
def test_kernel_matches_reference_fp16(m: int, k: int, n: int, group: int, act: bool) -> None:
    weight = packed_weight(k, n, group, act)
    x = torch.randn(m, k, dtype=torch.float16)
    check(tk().int4_matmul(x, *weight), x, weight)


BF16_SHAPES = [(m, 256, 128, g, act) for m in (1, 16) for g in (32, 128) for act in (False, True)]


@pytest.mark.parametrize("m, k, n, group, act", BF16_SHAPES if INTERPRET else [])
def test_kernel_matches_reference_bf16(m: int, k: int, n: int, group: int, act: bool) -> None:
    weight = packed_weight(k, n, group, act)
    x = torch.randn(m, k, dtype=torch.bfloat16)
    check(tk().int4_matmul(x, *weight), x, weight)


# Each config reaches a different compile-time branch or edge of the kernel.
BRANCHES = [
    ("groups-in-tile", 16, 256, 128, 32, KernelConfig(16, 64, 64)),  # group < BLOCK_K
    ("ragged-576", 16, 576, 128, 128, None),  # last group of 64
    ("ragged-groups-in-tile", 5, 576, 128, 128, KernelConfig(16, 64, 256, split_k=2)),
    ("group-48-per-row", 16, 192, 128, 48, None),  # neither divides the other: per-row gather
    ("per-channel", 16, 256, 128, -1, None),
    ("n-tail", 16, 128, 200, 32, None),  # N not a multiple of BLOCK_N
    ("m-tail", 37, 128, 128, 32, None),  # M not a multiple of BLOCK_M
    ("uneven-split", 3, 256, 128, 32, KernelConfig(16, 32, 64, split_k=3)),
    ("split-beyond-k", 2, 128, 64, 32, KernelConfig(16, 64, 64, split_k=4)),
    ("g64", 8, 256, 128, 64, None),
]


@pytest.mark.parametrize("name, m, k, n, group, config", BRANCHES if INTERPRET else [],
                         ids=[b[0] for b in BRANCHES] if INTERPRET else None)
def test_kernel_branches(name: str, m: int, k: int, n: int, group: int, config) -> None:
    weight = packed_weight(k, n, group)
    x = torch.randn(m, k, dtype=torch.float16)
    check(tk().int4_matmul(x, *weight, config=config), x, weight)


@in_interpreter
def test_float32_activations_and_leading_dims() -> None:
    weight = packed_weight(128, 128, 32, act_order=True)
    x = torch.randn(2, 3, 128)
    y = tk().int4_matmul(x, *weight)
    assert y.shape == (2, 3, 128)
    check(y.reshape(6, 128), x.reshape(6, 128), weight)
    assert tk().int4_matmul(torch.randn(0, 128), *weight).shape == (0, 128)


@in_interpreter
def test_unservable_inputs_raise_clear_errors() -> None:
    qw, qz, s, gi = packed_weight(128, 64, 32)
    with pytest.raises(KernelUnsupportedError, match="4-bit"):
        tk().int4_matmul(torch.randn(1, 128).half(), qw, qz, s, gi, bits=8)
    with pytest.raises(KernelUnsupportedError, match="expects 128"):
        tk().int4_matmul(torch.randn(1, 64).half(), qw, qz, s, gi)
    with pytest.raises(KernelUnsupportedError, match="activations"):
        tk().int4_matmul(torch.ones(1, 128, dtype=torch.int32), qw, qz, s, gi)
    with pytest.raises(KernelUnsupportedError, match="g_idx"):
        tk().int4_matmul(torch.randn(1, 128).half(), qw, qz, s, gi[:64])


@in_interpreter
@pytest.mark.parametrize("m", [1, 16])
def test_quant_linear_forced_triton(monkeypatch: pytest.MonkeyPatch, m: int) -> None:
    w = torch.randn(128, 256, generator=torch.Generator().manual_seed(2))
    layer = QuantLinear.from_result(rtn_quantize(w, QuantScheme(4, 128)), torch.randn(128)).eval()
    x = torch.randn(m, 256, dtype=torch.float16)
    monkeypatch.delenv("QCAL_KERNEL", raising=False)
    assert layer.kernel_backend(x) == "cpu"  # interpreting does not make Triton the CPU default
    monkeypatch.setenv("QCAL_KERNEL", "triton")
    with torch.no_grad():
        assert layer.kernel_backend(x) == "triton"
        y = layer(x)
    ref = torch.nn.functional.linear(x.float(), layer.dequantized_weight(), layer.bias.float())
    assert y.dtype == torch.float16
    assert float((y.float() - ref).norm() / ref.norm()) < REL_TOL[torch.float16]
