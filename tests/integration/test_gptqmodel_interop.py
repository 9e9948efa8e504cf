"""GPTQ-layout interop with GPTQModel 7.6.0, run in its own virtualenv (never a qcal
dependency): set QCAL_GPTQMODEL_PYTHON, or create runs/peer-venv as
`python -m venv runs/peer-venv && BUILD_CUDA_EXT=0 runs/peer-venv/bin/pip install
torch==2.13.0 gptqmodel==7.6.0`. Skipped (with that reason) where it is absent."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from qcal.config import QuantScheme, RTNConfig
from qcal.methods import METHODS, RunOptions
from qcal.model.loading import load_model
from qcal.packing.checkpoint import save_checkpoint

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
PEER = Path(os.environ.get("QCAL_GPTQMODEL_PYTHON", ROOT / "runs" / "peer-venv" / "bin" / "python"))


@pytest.fixture(scope="module")
def peer() -> Path:
    if not PEER.is_file():
        pytest.skip(f"GPTQModel's venv not found at {PEER} (see this module's docstring)")
    return PEER


def _gptqmodel_logits(peer: Path, ckpt: Path, ids: torch.Tensor, tmp: Path) -> subprocess.CompletedProcess:
    save_file({"ids": ids}, str(tmp / "ids.safetensors"))
    return subprocess.run([str(peer), str(Path(__file__).parent / "peer" / "gptqmodel_logits.py"),
                           str(ckpt), str(tmp / "ids.safetensors"), str(tmp / "out.safetensors")],
                          capture_output=True, text=True, timeout=900,
                          env={**os.environ, "GPTQMODEL_CPU_WORKERS": "2"})


@pytest.mark.parametrize(("sym", "fmt", "loads"), [(True, "gptq", True), (False, "gptq_v2", True),
                                                   (False, "gptq", False)])
def test_gptqmodel_reads_qcal_checkpoints(peer: Path, tiny_model_dir: Path, tmp_path: Path,
                                          sym: bool, fmt: str, loads: bool) -> None:
    net, tok, _ = load_model(tiny_model_dir)
    METHODS.get("rtn").run(net, RTNConfig(QuantScheme(4, 32, sym=sym)), None,
                           RunOptions(progress=False))
    save_checkpoint(net, tmp_path / "ckpt", tok, sym=sym, fmt=fmt)
    ids = torch.randint(0, 400, (2, 24), generator=torch.Generator().manual_seed(0))
    run = _gptqmodel_logits(peer, tmp_path / "ckpt", ids, tmp_path)
    if not loads:  # GPTQModel refuses asymmetric v1 files it did not write (documented)
        assert run.returncode != 0 and "sym=False" in run.stderr
        return
    assert run.returncode == 0, run.stderr[-2000:]
    theirs = load_file(str(tmp_path / "out.safetensors"))["logits"]
    with torch.no_grad():
        ours = net(ids).logits
    assert float((ours - theirs).abs().max() / ours.abs().max()) < 2e-2  # bf16 kernel
    assert float((ours.argmax(-1) == theirs.argmax(-1)).float().mean()) >= 0.95
