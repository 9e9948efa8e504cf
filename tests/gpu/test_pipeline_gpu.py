"""The whole pipeline on a CUDA device (skipped without one): GPTQ and AWQ quantize with
`--device cuda`, the checkpoints agree with CPU-made ones, evaluation through the Triton
kernel equals the torch reference, and a two-cell comparison grid runs on the GPU.

Needs only torch, triton, transformers, tokenizers and safetensors (no lm-eval, no
downloads): the model is the tiny random Llama built from a config.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from qcal.model.tiny import build_tiny_llama, stdlib_text

    root = tmp_path_factory.mktemp("gpu")
    model = build_tiny_llama(root / "tiny", hidden=256, intermediate=512, layers=2)
    text = root / "text.txt"
    text.write_text("\n\n".join(stdlib_text()[:120]), encoding="utf-8")
    return model, text


def _quantize(model: Path, text: Path, out: Path, method: str, device: str) -> None:
    from qcal.cli import main

    rc = main(["quantize", "--model", str(model), "--method", method, "--group-size", "64",
               "--calib", str(text), "--nsamples", "8", "--seqlen", "64", "--device", device,
               "-o", str(out)])
    assert rc == 0


def _ppl(ckpt: Path, text: Path, device: str) -> float:
    from qcal.eval.job import run_evaluation
    from qcal.run_config import EvalConfig

    out = run_evaluation(ckpt, EvalConfig(seqlen=64, max_windows=8), text_file=text,
                         progress=False, device=device)
    return float(out.data["perplexity"]["model"]["file"]["ppl"])


@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_quantize_on_cuda_matches_cpu(tiny, tmp_path: Path, method: str) -> None:
    model, text = tiny
    _quantize(model, text, tmp_path / "gpu", method, "cuda")
    _quantize(model, text, tmp_path / "cpu", method, "cpu")
    log = json.loads((tmp_path / "gpu" / "quant_log.json").read_text())
    assert log["recipe"]["device"] == "cuda"
    gpu, cpu = _ppl(tmp_path / "gpu", text, "cpu"), _ppl(tmp_path / "cpu", text, "cpu")
    # Same algorithm, different float summation order: the checkpoints score alike.
    assert abs(gpu - cpu) / cpu < 0.02, (gpu, cpu)


def test_eval_on_cuda_triton_equals_reference(tiny, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    model, text = tiny
    _quantize(model, text, tmp_path / "ckpt", "rtn", "cpu")
    monkeypatch.setenv("QCAL_KERNEL", "triton")
    triton_ppl = _ppl(tmp_path / "ckpt", text, "cuda")
    monkeypatch.setenv("QCAL_KERNEL", "reference")
    reference_ppl = _ppl(tmp_path / "ckpt", text, "cuda")
    assert abs(triton_ppl - reference_ppl) / reference_ppl < 1e-3


def test_two_cell_grid_on_cuda(tiny, tmp_path: Path) -> None:
    from qcal.grid import GridRunner, GridSpec

    model, text = tiny
    spec = GridSpec(name="gpu", model=str(model), selectors=("random",), methods=("rtn", "gptq"),
                    group_size=64, source=str(text), nsamples=8, seqlen=64, eval_seqlen=64,
                    max_windows=4, eval_text_file=str(text))
    cells = GridRunner(spec, tmp_path / "r", tmp_path / "w", progress=False, device="cuda").run()
    assert {"float", "none__rtn", "random__gptq"} <= set(cells)
    assert cells["random__gptq"]["eval"]["settings"]["device"] == "cuda"


@pytest.mark.skipif(torch.cuda.device_count() < 2,
                    reason="nccl needs one GPU per process: two or more GPUs")
@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_torchrun_nccl_two_gpus_match_one(tiny, tmp_path: Path, method: str) -> None:
    """`--nproc 2 --device cuda`: two processes on two GPUs (nccl) score like one."""
    import os
    import subprocess
    import sys

    model, text = tiny
    _quantize(model, text, tmp_path / "one", method, "cuda")
    run = subprocess.run([sys.executable, "-m", "qcal", "quantize", "--model", str(model),
                          "--method", method, "--group-size", "64", "--calib", str(text),
                          "--nsamples", "8", "--seqlen", "64", "--device", "cuda",
                          "--nproc", "2", "-o", str(tmp_path / "two")],
                         capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert run.returncode == 0, run.stderr[-2000:]
    log = json.loads((tmp_path / "two" / "quant_log.json").read_text())
    assert log["processes"] == 2
    one, two = _ppl(tmp_path / "one", text, "cpu"), _ppl(tmp_path / "two", text, "cpu")
    assert abs(two - one) / one < 0.02, (one, two)
